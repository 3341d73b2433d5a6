"""JSONL reading with file:line errors, and appending that survives a killed run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from selfrag.errors import InputError


def read_jsonl(path: str | Path, what: str = "records") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; a bad line raises ``InputError`` with file:line.

    A final line without a newline that is not valid JSON is reported too: it is most likely the tail
    of a killed write, and the message says how to resume.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file {str(path)!r} not found; check the path (it must be a JSONL file)")
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(
                    f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno}); "
                    f"each line of the {what} file must be one JSON object — fix or delete that line"
                ) from None
            if not isinstance(data, dict):
                raise InputError(f"{path}:{number}: expected a JSON object, got {type(data).__name__}")
            yield number, data


def require_fields(data: Mapping[str, Any], fields: Iterable[str], where: str, kind: type = str) -> None:
    for name in fields:
        if not isinstance(data.get(name), kind):
            raise InputError(
                f'{where}: field {name!r} must be a {kind.__name__}, got {data.get(name)!r}; add "{name}" to that line'
            )


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, sort_keys=False)


def write_jsonl_atomic(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write rows to ``path`` via a temporary file and rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    count = 0
    with tmp.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(dumps(row) + "\n")
            count += 1
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
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
