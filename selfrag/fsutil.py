"""Files the product reads and writes: UTF-8 errors as file:line, atomic writes, output-path checks.

    text = read_text(path, what="corpus file")               # a bad byte -> InputError "path:3: ..."
    write_json(output / "stats.json", stats)                  # temp file + fsync + rename: never half a file
    check_output_path(config.output, key="output", inputs=[config.passages, config.queries])

A resume reads what an earlier run wrote (configs, manifests, stats). Each of those is written to a
temporary sibling, fsynced and renamed over the target, so a run killed at any moment leaves either the
old file or the new one, never a cut one that refuses to resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from selfrag.errors import InputError, SelfragError

# ---- reading -------------------------------------------------------------------------------------------------


def decode_error_message(path: str | Path, data: bytes, error: UnicodeDecodeError, line_offset: int = 0) -> str:
    """``path:line: not UTF-8 (byte 0x.. at column c); fix`` for a decoding error at ``error.start`` of ``data``."""
    line = data.count(b"\n", 0, error.start) + 1 + line_offset
    column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
    byte = data[error.start : error.start + 1].hex()
    return (
        f"{path}:{line}: not UTF-8 text (byte 0x{byte} at column {column}); "
        "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove that character"
    )


def decode_utf8(data: bytes, path: str | Path, line_offset: int = 0) -> str:
    """``data`` decoded as UTF-8 (a leading BOM is dropped); a bad byte raises ``InputError`` with file:line."""
    try:
        return data.decode("utf-8-sig" if line_offset == 0 else "utf-8")
    except UnicodeDecodeError as error:
        raise InputError(decode_error_message(path, data, error, line_offset)) from None


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of ``path``; a missing file or a non-UTF-8 byte is one ``InputError`` line."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what} {str(path)!r} is a directory; pass a file")
    if not path.is_file():
        raise InputError(f"{what} {str(path)!r} not found; check the path")
    return decode_utf8(path.read_bytes(), path)


# ---- writing -------------------------------------------------------------------------------------------------


def temp_sibling(path: Path) -> Path:
    """Where an atomic write of ``path`` writes first: ``.NAME.tmp-PID`` beside it."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_bytes(path: str | Path, data: bytes, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically: temp sibling, flush + fsync, rename, fsync of the directory.

    If anything fails before the rename, the temp file is removed and ``path`` keeps its old content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_writers_temps(path)
    tmp = temp_sibling(path)
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_directory(path.parent)
    return path


def write_text(path: str | Path, text: str, fsync: bool = True) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (see :func:`write_bytes`)."""
    return write_bytes(path, text.encode("utf-8"), fsync=fsync)


def write_json(path: str | Path, data: Any, fsync: bool = True) -> Path:
    """Write ``data`` as indented JSON (UTF-8, trailing newline) to ``path`` atomically."""
    return write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n", fsync=fsync)


def remove_dead_writers_temps(path: Path) -> None:
    """Delete temp siblings of ``path`` left by writers that were killed (their process is gone)."""
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        pid = stale.name.rpartition("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_directory(directory: Path) -> None:
    # The rename itself is durable only once the directory entry is on disk (POSIX); best effort elsewhere.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temp_files(directory: str | Path) -> list[Path]:
    """Delete ``.NAME.tmp-PID`` files left in ``directory`` by a killed writer; returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.glob(".*.tmp-*") if p.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


# ---- output paths --------------------------------------------------------------------------------------------


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output_path(
    path: str | Path, key: str = "output", inputs: Iterable[str | Path | None] = (), directory: bool = True
) -> Path:
    """Refuse an output path that cannot be right, before any work is done; returns the path.

    * a directory output that names an existing file (``FileExistsError`` later, after the work);
    * the output is one of the inputs, or holds an input, or sits inside an input directory
      (``selfrag export A A`` would overwrite the adapter it reads).

    ``key`` is how the user spells the setting (``output=``, ``output_dir=``, or a positional name).
    """
    path = Path(path).expanduser()
    resolved = path.resolve()
    if directory and path.exists() and not path.is_dir():
        raise InputError(f"{key} {str(path)!r} is an existing file, not a directory; give a directory path")
    if not directory and path.is_dir():
        raise InputError(f"{key} {str(path)!r} is a directory; give a file path")
    for item in inputs:
        if item is None:
            continue
        source = Path(item).expanduser().resolve()
        if resolved == source:
            raise InputError(f"{key} {str(path)!r} is also an input; write the output to a new path")
        if _inside(source, resolved):
            raise InputError(
                f"{key} {str(path)!r} contains the input {str(item)!r} and could overwrite it; "
                "write the output to a new path"
            )
        if source.is_dir() and _inside(resolved, source):
            raise InputError(
                f"{key} {str(path)!r} is inside the input directory {str(item)!r}; write the output elsewhere"
            )
    return path


#: Config fields that name where a command writes; every other path (and an existing ``model`` path) is an input.
OUTPUT_FIELDS = ("output", "output_dir")


def check_config_outputs(config: Any) -> None:
    """:func:`check_output_path` for each output field of a config dataclass, against its input paths."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return
    values = {spec.name: getattr(config, spec.name) for spec in dataclasses.fields(config)}
    inputs = [value for name, value in values.items() if isinstance(value, Path) and name not in OUTPUT_FIELDS]
    model = values.get("model")
    if isinstance(model, str) and model and Path(model).expanduser().exists():
        inputs.append(Path(model))
    for name in ("corpus", "index"):  # the retriever section's paths are inputs too (never written over)
        value = getattr(values.get("retriever"), name, None)
        if isinstance(value, str) and value and not is_url(value):
            inputs.append(Path(value).expanduser())
    for name in OUTPUT_FIELDS:
        value = values.get(name)
        if isinstance(value, str) and value and not is_url(value):  # a str field that may hold a URL (generate)
            value = Path(value).expanduser()
        if isinstance(value, Path):
            check_output_path(value, key=name, inputs=inputs)


# ---- output ownership ----------------------------------------------------------------------------------------

#: Written into every output directory a command creates: which command wrote it and which entries are its own.
OWNER_FILE = ".selfrag-output.json"


def claim_output(
    path: str | Path,
    command: str,
    key: str = "output",
    replaces: bool = False,
    mark: bool = True,
) -> Path:
    """Refuse an output directory that holds files ``selfrag <command>`` did not write, before any work is done.

    An absent or empty directory is claimed (``mark``: created, and :data:`OWNER_FILE` written into it). An existing
    one is accepted when its :data:`OWNER_FILE` names ``command``. Anything else (a folder of the user's, another
    command's output, a folder an older selfrag wrote before it marked its outputs) is refused: writing there could
    overwrite or delete what the user keeps in it.

    ``replaces``: the command replaces the whole directory (``selfrag index``); then every entry in it must be one
    the command wrote (the owner file's ``files``), or it is refused too.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"{key} {str(path)!r} is an existing file, not a directory; give a directory path")
    entries = sorted(entry.name for entry in path.iterdir()) if path.is_dir() else []
    if not entries:
        if mark:
            write_owner(path, command)
        return path
    owner = read_owner(path)
    if owner is not None and owner.get("command") == command:
        owned = set(owner.get("files") or ())
    else:
        raise foreign_output(key, str(path), entries, owner, command)
    if replaces:
        foreign = [name for name in entries if name != OWNER_FILE and name not in owned]
        if foreign:
            raise InputError(
                f"{key} {str(path)!r} holds {', '.join(foreign[:4])}, which `selfrag {command}` did not write and "
                "would delete when it replaces the directory; move them out, or give a new directory"
            )
    return path


#: Output directories this process holds (:func:`hold_output`), so a command run inside another one on the same
#: directory (in-process) does not refuse itself.
_HELD: set[Path] = set()


def lock_path(path: str | Path) -> Path:
    """The lock file of an output directory: a hidden sibling (``runs/.model.selfrag-lock`` for ``runs/model``), so the
    directory's own entries stay what the command wrote; it exists only while a command holds the directory."""
    path = Path(path).expanduser().absolute()
    return path.parent / f".{path.name}.selfrag-lock"


@contextlib.contextmanager
def hold_output(path: str | Path, command: str, key: str = "output_dir") -> Iterator[None]:
    """Hold ``path`` for one ``selfrag <command>`` process while it writes there; a second one is refused at once.

    Two processes writing one output directory (the same command started twice, a train beside an rl into one
    folder) would interleave checkpoints, answers and results. The hold is an ``flock`` on :func:`lock_path`: the
    kernel drops it when the process ends, so a killed run leaves no stale lock to clear. The file names the holder
    (command, pid, start) for the refusal's one line, and goes when the hold ends. Nested holds of one directory in
    one process (a command that runs another in-process) are let through. A URL output is not held. Launched as
    several processes (``RANK`` set: torchrun, accelerate), the main one holds the directory for all.
    """
    if is_url(path) or os.environ.get("RANK", "0") != "0":
        yield
        return
    directory = Path(path).expanduser().absolute()
    if directory in _HELD:
        yield
        return
    lock = lock_path(directory)
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = lock.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise InputError(
                f"{key} {str(path)!r} is in use by another process ({holder or 'a selfrag command'}); nothing was "
                "changed: wait for it to finish or stop it, or give another output directory"
            ) from None
        try:  # the holder before us may have removed the file after we opened it: lock the file at the path
            same = os.fstat(handle.fileno()).st_ino == lock.stat().st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"selfrag {command}, pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        _HELD.add(directory)
        yield
    finally:
        _HELD.discard(directory)
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()  # while still locked: a process waiting on this file sees it gone and makes a new one
        handle.close()


@contextlib.contextmanager
def left_clean_if_refused(path: str | Path, bookkeeping: Iterable[str] = ()) -> Iterator[None]:
    """Around a command's claim of an output directory and its work: a refused command leaves nothing behind.

    Where the directory was new (absent, or empty) and the command is refused (a :class:`SelfragError`) before it
    wrote any work, what it made goes again: a directory (and the parents) it created, or what it put into an empty
    one of the user's. Work is a non-empty file, but :data:`OWNER_FILE` and ``bookkeeping`` (a fingerprint, the
    resolved config: written before the inputs are checked); a directory holding work is kept for a rerun.

        with left_clean_if_refused(config.output, bookkeeping=("fingerprint.json", "config.yaml")):
            claim_output(config.output, "generate")
            ...
    """
    path = Path(path).expanduser()
    created = path
    while not created.parent.exists() and created.parent != created:
        created = created.parent  # output=runs/a/b with no runs/: runs/ is this command's too
    new = not path.exists() or (path.is_dir() and not any(path.iterdir()))
    existed = path.exists()
    try:
        yield
    except SelfragError:
        quiet = {OWNER_FILE, *bookkeeping}
        entries = list(path.iterdir()) if new and path.is_dir() else []
        if new and not any(_holds_work(entry) for entry in entries if entry.name not in quiet):
            if existed:
                for entry in entries:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            elif path.is_dir():
                shutil.rmtree(created)
        raise


def _holds_work(entry: Path) -> bool:
    """Whether ``entry`` is, or holds, a non-empty file (or anything that is not a plain file or folder)."""
    if entry.is_dir() and not entry.is_symlink():
        return any(_holds_work(child) for child in entry.iterdir())
    return not entry.is_file() or entry.is_symlink() or entry.stat().st_size > 0


def foreign_output(
    key: str, where: str, entries: list[str], owner: dict[str, Any] | None, command: str
) -> InputError:
    """The one line refusing a non-empty output (a directory or a URL) that ``selfrag <command>`` did not write."""
    shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
    other = owner.get("command") if owner is not None else None
    what = f"it is the output of `selfrag {other}`" if other else f"it holds {shown}"
    return InputError(
        f"{key} {where!r} is not empty and was not written by `selfrag {command}` ({what}); nothing was "
        "changed: give a new or empty directory"
    )


def claim_output_file(
    path: str | Path, command: str, key: str = "output", inputs: Iterable[str | Path | None] = ()
) -> Path:
    """:func:`claim_output` for a command that writes one file: refuse an existing file ``command`` did not write.

    A file a command writes is marked by a sidecar beside it (:func:`mark_output_file`: ``.NAME.selfrag-output.json``,
    the command and the SHA-256 of what it wrote). An absent path is accepted; so is the command's own earlier output,
    unchanged since (a rerun writes it again whole, from its inputs: nothing old is mixed in). Anything else (the
    user's file, another command's, one edited since) is refused before any work is done, and nothing is changed.
    ``command`` is how a user runs it (``selfrag paper-data import``); ``inputs`` as :func:`check_output_path`.
    """
    path = check_output_path(path, key=key, inputs=inputs, directory=False)
    if not path.exists() and not path.is_symlink():
        return path
    owner = _json_object(_owner_sidecar(path))
    if owner is not None and owner.get("command") == command and owner.get("sha256") == file_digest(path):
        return path
    if owner is None:
        what = f"is an existing file that `{command}` did not write"
    elif owner.get("command") != command:
        what = f"is an existing file that `{command}` did not write (it is the output of `{owner.get('command')}`)"
    else:
        what = f"was written by `{command}` but changed since"
    raise InputError(
        f"{key} {str(path)!r} {what}; nothing was changed: give a new path, or delete the file to write it anew"
    )


def mark_output_file(path: str | Path, command: str) -> None:
    """Record that ``command`` wrote the file ``path`` (as it is now), for :func:`claim_output_file`."""
    path = Path(path)
    write_json(_owner_sidecar(path), {"command": command, "sha256": file_digest(path)})


def _owner_sidecar(path: Path) -> Path:
    return path.with_name(f".{path.name}{OWNER_FILE}")


#: bytes a digest reads at a time
_CHUNK = 1 << 20


def stream_digest(chunks: Iterable[bytes]) -> str:
    """SHA-256 of bytes that arrive in pieces (a file read a block at a time, a folder's names and contents), as
    ``sha256:<hex>``: the same as :func:`bytes_digest` of the pieces joined."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def file_blocks(path: str | Path) -> Iterable[bytes]:
    """A file's bytes, a block at a time (for :func:`stream_digest`)."""
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (streamed), as ``sha256:<hex>``."""
    return stream_digest(file_blocks(path))


#: ``scheme://...``: an fsspec URL (s3://, gs://, file://, memory://), not a local path.
URL_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(value: str | Path) -> bool:
    """Whether ``value`` names an fsspec URL rather than a local path (a Path never does: it folds the ``//``)."""
    return isinstance(value, str) and URL_PATTERN.match(value) is not None


def write_owner(directory: str | Path, command: str, files: Iterable[str] = ()) -> None:
    """Mark ``directory`` as written by ``selfrag <command>`` (``files``: the entries it wrote, where it knows)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / OWNER_FILE, {"command": command, "files": sorted(files)})


def read_owner(directory: str | Path) -> dict[str, Any] | None:
    """The owner file of ``directory``, or None where there is none (or it is not a JSON object)."""
    return _json_object(Path(directory) / OWNER_FILE)


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
