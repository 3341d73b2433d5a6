"""A corpus read as a stream, never held in memory: what ``selfrag index`` builds from, at Wikipedia's 21M passages.

    corpus = scan_corpus(Path("psgs_w100.tsv"))          # one pass: every line checked, ids unique, counted
    len(corpus)                                          # 21_015_324
    for passage in corpus: ...                           # read again from the file, line by line

:func:`selfrag.corpus.iter_corpus` reads and checks each line; whether ids are unique needs every id seen so far.
The index build lets its SQLite passage store's key answer that (on disk); a load that keeps no store of its own
(``kind=pgvector``) calls :func:`scan_corpus`, which keeps an 8-byte hash per id (168 MB at 21M passages, against
~1.1 KB a passage as Python objects) and reads the corpus again only to name the two lines of a duplicate.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from selfrag.corpus import duplicate_message, iter_corpus
from selfrag.errors import InputError
from selfrag.trajectory import Passage


@dataclass(frozen=True)
class StreamedCorpus:
    """The passages of a corpus checked by :func:`scan_corpus`: ``len`` known, read from the file on each ``iter``."""

    path: Path
    count: int
    chunk_words: int = 200
    chunk_overlap: int = 40

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Passage]:
        for _, passage in iter_corpus(self.path, self.chunk_words, self.chunk_overlap):
            yield passage


def scan_corpus(path: str | Path, chunk_words: int = 200, chunk_overlap: int = 40) -> StreamedCorpus:
    """Read the corpus through once, keeping nothing but an 8-byte hash per id: every line checked, ids unique
    (a repeated hash is confirmed by reading again, so a hash collision is no error), the passages counted."""
    path = Path(path)
    hashes = array("q")
    for _, passage in iter_corpus(path, chunk_words, chunk_overlap):
        hashes.append(_id_hash(passage.id))
    ordered = np.sort(np.frombuffer(hashes, dtype=np.int64))
    repeated = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if repeated:
        seen: dict[str, str] = {}
        for where, passage in iter_corpus(path, chunk_words, chunk_overlap):
            if _id_hash(passage.id) not in repeated:
                continue
            if passage.id in seen:
                raise InputError(duplicate_message(where, passage.id, seen[passage.id]))
            seen[passage.id] = where
    return StreamedCorpus(path, len(hashes), chunk_words, chunk_overlap)


def duplicate_error(path: str | Path, passage_id: str, chunk_words: int = 200, chunk_overlap: int = 40) -> InputError:
    """The one-line error for ``passage_id`` appearing twice in a corpus, naming both lines: the corpus is read
    again up to the second (a streamed build keeps no ids in memory; this runs only on the way to the error)."""
    first = None
    for where, passage in iter_corpus(path, chunk_words, chunk_overlap):
        if passage.id != passage_id:
            continue
        if first is not None:
            return InputError(duplicate_message(where, passage_id, first))
        first = where
    return InputError(f"{path}: passage id {passage_id!r} appears twice; give every passage its own id")


def _id_hash(passage_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(passage_id.encode(), digest_size=8).digest(), "little", signed=True)
