"""JSONL reading with file:line errors, and appending that survives a killed run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from selfrag.errors import InputError
from selfrag.fsutil import decode_utf8, remove_dead_writers_temps, temp_sibling

BOM = b"\xef\xbb\xbf"


def read_jsonl(path: str | Path, what: str = "records") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; a bad line raises ``InputError`` with file:line.

    A byte that is not UTF-8 is reported with its line and column. A final line without a newline that
    is not valid JSON is reported too: it is most likely the tail of a killed write.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what} file {str(path)!r} is a directory; pass a JSONL file")
    if not path.is_file():
        raise InputError(f"{what} file {str(path)!r} not found; check the path (it must be a JSONL file)")
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = decode_utf8(raw[3:] if number == 1 and raw.startswith(BOM) else raw, path, number - 1)
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{path}:{number}: not valid JSON ({_where(error, line)}); each line of the {what} "
                                 "file must be one JSON object — fix or delete that line") from None
            if not isinstance(data, dict):
                raise InputError(
                    f"{path}:{number}: expected a JSON object {{...}}, got {type(data).__name__}; "
                    f"each line of the {what} file must be one JSON object"
                )
            yield number, data


def _where(error: json.JSONDecodeError, line: str) -> str:
    """What is wrong and at which column of the line; a line that stops before its JSON does (the parser then points
    past the newline, at "column 1" of a line that is not there) is named as cut short, at its last column."""
    text = line.rstrip("\r\n")
    if error.pos >= len(text) or error.msg.startswith("Unterminated string"):  # a string that runs to the end
        return f"the line ends at column {len(text) + 1} before its JSON does: cut short, as by a killed write"
    return f"{error.msg} at column {error.pos + 1}"


def require_fields(
    data: Mapping[str, Any], fields: Iterable[str], where: str, kind: type = str, allow_empty: bool = False
) -> None:
    """Each of ``fields`` must be a ``kind``; strings must not be blank unless ``allow_empty``."""
    for name in fields:
        value = data.get(name)
        if name not in data:
            raise InputError(f'{where}: field {name!r} is missing; add "{name}" ({kind.__name__}) to that line')
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise InputError(f"{where}: field {name!r} must be a {kind.__name__}, got {value!r}; fix that line")
        if isinstance(value, str) and not allow_empty and not value.strip():
            raise InputError(f"{where}: field {name!r} is empty; give it a text or delete that line")


def string_list(data: Mapping[str, Any], name: str, where: str) -> tuple[str, ...]:
    """Optional field ``name``: a list of strings (absent/null: empty); a bare string is refused, not split."""
    value = data.get(name)
    if value is None:
        return ()
    if isinstance(value, str):
        raise InputError(
            f"{where}: field {name!r} must be a list of strings, got the string {value!r}; "
            f'write "{name}": [{json.dumps(value, ensure_ascii=False)}]'
        )
    if not isinstance(value, list) or not all(
        isinstance(item, str | int) and not isinstance(item, bool) for item in value
    ):
        raise InputError(f"{where}: field {name!r} must be a list of strings, got {value!r}; fix that line")
    return tuple(str(item) for item in value)


def mapping_field(data: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    """Optional field ``name``: a JSON object (absent/null: empty); anything else is refused."""
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(
            f'{where}: field {name!r} must be a JSON object like {{"split": "train"}}, got {value!r}; fix that line'
        )
    return dict(value)


class UniqueIds:
    """Refuses a second row with the same id, naming both lines: ``ids.add(row_id, where)``."""

    def __init__(self, what: str = "id") -> None:
        self.what = what
        self.seen: dict[str, str] = {}

    def add(self, value: str, where: str) -> None:
        if value in self.seen:
            raise InputError(
                f"{where}: duplicate {self.what} {value!r} (first at {self.seen[value]}); "
                f"each {self.what} must be unique — rename or delete one of them"
            )
        self.seen[value] = where


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, sort_keys=False)


def write_jsonl_atomic(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write rows to ``path`` via a temporary file and rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_writers_temps(path)
    tmp = temp_sibling(path)
    count = 0
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(dumps(row) + "\n")
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


def truncate_partial_line(path: str | Path) -> None:
    """Drop a trailing line without newline (left by a killed append) so appending can resume."""
    path = Path(path)
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with path.open("r+b") as handle:
            handle.truncate(cut)


class JsonlAppender:
    """Append rows one per line, flushed and fsynced per batch, resumable after a kill."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_partial_line(self.path)
        self._handle = self.path.open("a", encoding="utf-8")

    def write(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self._handle.write(dumps(row) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
