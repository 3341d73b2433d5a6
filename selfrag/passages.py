"""Passages off the Python heap: an SQLite file read by row (the index's own numbering) or by id, hits only.

    write_store(Path("runs/index/passages.sqlite"), passages)       # once, when the index is built
    store = PassageStore("runs/index/passages.sqlite")               # opens in milliseconds, whatever its size
    store.by_rows([17, 3])                                           # the passages at rows 17 and 3, in that order
    store.by_ids(["wiki-12", "nope"])                                # [Passage(...), None]

Row ``i`` is the ``i``-th passage of the corpus, the number a retriever's index returns (bm25s document id,
row of the embedding matrix, FAISS label). Opening a store reads neither the passages nor the corpus: resident
memory is SQLite's page cache (a few MB), not ~1.1 KB of Python objects per passage. Each thread (and each
process after a fork) gets its own read-only connection, so retrievers can be searched from worker threads.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from selfrag.errors import InputError
from selfrag.trajectory import Passage

_SCHEMA = (
    "CREATE TABLE passages (row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT NOT NULL, text TEXT NOT NULL)"
)
_BATCH = 10_000
_MAX_VARIABLES = 900  # below SQLite's oldest default limit of host parameters in one statement


class PassageSource(Protocol):
    """What a retriever needs of its passages: how many, and some of them by row."""

    def __len__(self) -> int: ...

    def by_rows(self, rows: Sequence[int]) -> list[Passage]: ...

    def iter_range(self, start: int, stop: int) -> Iterator[Passage]: ...


class PassageList:
    """Passages held in memory (a retriever built on the fly from a corpus, or an old index folder)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = list(passages)

    def __len__(self) -> int:
        return len(self.passages)

    def by_rows(self, rows: Sequence[int]) -> list[Passage]:
        return [self.passages[int(row)] for row in rows]

    def iter_range(self, start: int, stop: int) -> Iterator[Passage]:
        return iter(self.passages[start:stop])


def as_source(passages: Sequence[Passage] | PassageSource) -> PassageSource:
    """A list of passages wrapped as a :class:`PassageSource`; a source (store or list) as it is."""
    if isinstance(passages, PassageStore | PassageList):
        return passages
    return PassageList(passages)  # type: ignore[arg-type]


def write_store(
    path: str | Path, passages: Iterable[Passage], duplicate: Callable[[str], Exception] | None = None
) -> int:
    """Write ``passages`` (rows 0, 1, ... in order) to a new SQLite file at ``path``; returns how many.

    ``passages`` may be a stream (a corpus read line by line): they are inserted in batches and never held
    together, and the ``id`` key refuses a second passage of an id, raising ``duplicate(id)`` (the caller names
    the corpus lines) or else an error naming the id. Written into a temporary sibling and renamed into place, so
    a killed write never leaves a store that opens.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    connection = sqlite3.connect(tmp)
    try:
        connection.execute("PRAGMA journal_mode=OFF")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute(_SCHEMA)
        count = 0
        batch: list[tuple[int, str, str, str]] = []
        for passage in passages:
            batch.append((count, passage.id, passage.title, passage.text))
            count += 1
            if len(batch) >= _BATCH:
                _insert(connection, batch, path, duplicate)
                batch.clear()
        _insert(connection, batch, path, duplicate)
        connection.commit()
    except BaseException:
        connection.close()
        tmp.unlink(missing_ok=True)
        raise
    connection.close()
    os.replace(tmp, path)
    return count


def _insert(
    connection: sqlite3.Connection,
    rows: list[tuple[int, str, str, str]],
    path: Path,
    duplicate: Callable[[str], Exception] | None,
) -> None:
    try:
        connection.executemany("INSERT INTO passages VALUES (?, ?, ?, ?)", rows)
    except sqlite3.IntegrityError:
        passage_id = _first_duplicate(connection, rows)
        if duplicate is not None:
            raise duplicate(passage_id) from None
        raise InputError(f"{path}: passage id {passage_id!r} appears twice; give every passage its own id") from None


def _first_duplicate(connection: sqlite3.Connection, rows: list[tuple[int, str, str, str]]) -> str:
    """The first id of ``rows`` seen before, in an earlier batch or earlier in this one."""
    seen: set[str] = set()
    first_row = rows[0][0]
    for _, passage_id, _, _ in rows:
        earlier = connection.execute("SELECT 1 FROM passages WHERE id = ? AND row < ?", (passage_id, first_row))
        if passage_id in seen or earlier.fetchone():
            return passage_id
        seen.add(passage_id)
    return "?"


class PassageStore:
    """Read-only access to a store written by :func:`write_store`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"{self.path} does not exist; rebuild the index with `selfrag index`")
        self._local = threading.local()
        try:
            last = self._connection().execute("SELECT max(row) FROM passages").fetchone()[0]
        except sqlite3.DatabaseError as error:
            raise InputError(f"{self.path} is not a passage store ({error}); rebuild the index") from None
        self._count = 0 if last is None else int(last) + 1

    def _connection(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # a forked child must not share its parent's connection
            local.connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            local.pid = os.getpid()
        return local.connection  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return self._count

    def by_rows(self, rows: Sequence[int]) -> list[Passage]:
        """The passages at ``rows``, in that order (a row may repeat); IndexError names a row out of range."""
        wanted = [int(row) for row in rows]
        for row in wanted:
            if not 0 <= row < self._count:
                raise IndexError(f"row {row} is out of range for {self.path} ({self._count} passages)")
        found = self._select("row", wanted)
        return [found[row] for row in wanted]

    def by_ids(self, ids: Sequence[str]) -> list[Passage | None]:
        """The passages with these ids, in that order; None for an id the store does not hold."""
        found = self._select("id", list(ids))
        return [found.get(passage_id) for passage_id in ids]

    def _select(self, column: str, keys: list) -> dict:  # type: ignore[type-arg]
        found = {}
        unique = list(dict.fromkeys(keys))
        connection = self._connection()
        for start in range(0, len(unique), _MAX_VARIABLES):
            chunk = unique[start : start + _MAX_VARIABLES]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT row, id, title, text FROM passages WHERE {column} IN ({marks})"
            for row, passage_id, title, text in connection.execute(query, chunk):
                found[row if column == "row" else passage_id] = Passage(id=passage_id, title=title, text=text)
        return found

    def iter_range(self, start: int, stop: int) -> Iterator[Passage]:
        """Passages of rows ``start`` .. ``stop - 1`` in order (for building an index from the store)."""
        query = "SELECT id, title, text FROM passages WHERE row >= ? AND row < ? ORDER BY row"
        for passage_id, title, text in self._connection().execute(query, (start, stop)):
            yield Passage(id=passage_id, title=title, text=text)
