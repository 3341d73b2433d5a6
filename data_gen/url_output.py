"""``selfrag generate output=<fsspec URL>``: the run's output on object storage (or any fsspec filesystem).

    selfrag generate --config configs/data_gen/http-teacher.yaml teacher.model=M output=s3://bucket/runs/data \\
        executor=ray                              # s3:// needs s3fs (gs:// gcsfs, ...); file:// and memory:// built in

The run works in a local staging folder (``<selfrag cache>/generate-staging/<hash of the URL>``, emptied at the
start) and keeps the URL up to date, so the same command resumes from any machine:

    <url>/.selfrag-output.json      owner: the URL is claimed like a directory (new, empty, or an earlier generate run)
    <url>/config.yaml, fingerprint.json  the settings and input digests a resumed run checks (uploaded first)
    <url>/journal/NNNNNNNN.jsonl    the finished questions, in parts (object stores cannot append): every
                                    ``output_sync_s`` seconds the lines journaled since the last part (a
                                    run that pulls more than 64 parts joins them into one)
    <url>/shards/*.jsonl            every .jsonl output in ``ray.shard_records``-line shards (both executors), and
    <url>/manifest.json             their lines and SHA-256 in order (concatenated they are the local run's files;
                                    written last: a manifest names only shards already uploaded)
    <url>/stats.json, stats.md, run.json (and corpus.jsonl for a folder corpus)

A rerun pulls the owner file, config, fingerprints and journal parts into the staging folder and runs there as in a
local directory: the same refusals (other settings, changed inputs), the same skipping of finished questions. The
labelling workers never touch the URL (the driver does every read and write), so ``memory://`` works with Ray too.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from selfrag.errors import ConfigError, InputError
from selfrag.fsutil import OWNER_FILE, foreign_output, write_owner
from selfrag.runs import bytes_digest, text_key

logger = logging.getLogger(__name__)

JOURNAL_DIR = "journal"
#: Small files that say how the run was made; uploaded before any journal part (a part never names a run that the
#: URL's config does not describe).
STATE_FILES = ("config.yaml", "fingerprint.json")
#: Journal parts a run joins into one when it pulls more (a part every ``output_sync_s`` while questions finish).
COMPACT_AFTER = 64
#: Files uploaded when the run finishes (besides the shards and the manifest).
FINAL_FILES = ("stats.json", "stats.md", "run.json", "corpus.jsonl")


def open_url(url: str, key: str = "output") -> tuple[Any, str]:
    """The fsspec filesystem and path of ``url``; an unknown scheme or a missing backend package is one line."""
    try:
        import fsspec
    except ImportError:
        raise InputError(f"{key}={url!r} needs fsspec: pip install fsspec (or write to a local directory)") from None
    scheme = url.split("://", 1)[0]
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except ImportError as error:  # a known scheme whose package is missing: "Install s3fs to access S3"
        raise InputError(
            f"{key}={url!r}: {error}; install the fsspec backend for {scheme}:// (s3fs, gcsfs, adlfs, ...) "
            "or write to a local directory"
        ) from None
    except ValueError as error:  # "Protocol not known: foo"
        raise InputError(
            f"{key}={url!r}: {error}; give an fsspec URL (s3://, gs://, az://, file://, memory://) or a local path"
        ) from None
    return fs, str(root).rstrip("/")


def claim_url(fs: Any, root: str, url: str, command: str = "generate", key: str = "output") -> None:
    """:func:`selfrag.fsutil.claim_output` for a URL: new or empty (claimed), or an earlier run of ``command``."""
    if fs.isfile(root):
        raise InputError(f"{key} {url!r} is an existing file, not a folder; give a new URL")
    try:
        entries = sorted(str(name).rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(root, detail=False))
    except FileNotFoundError:
        entries = []
    if not entries:
        try:
            write_to(fs, f"{root}/{OWNER_FILE}", _owner_bytes(command))
        except (OSError, NotImplementedError, PermissionError) as error:
            raise InputError(
                f"{key} {url!r} cannot be written ({type(error).__name__}: {error}); give a URL this machine may "
                "write to (credentials, bucket) or a local directory"
            ) from None
        return
    owner = _read_json(fs, f"{root}/{OWNER_FILE}")
    if owner is None or owner.get("command") != command:
        raise foreign_output(key, url, entries, owner, command)
    if "journal.jsonl" in entries:  # a run written to a local directory: its journal is one file, not parts
        raise InputError(
            f"{key} {url!r} holds a run written as a local directory (journal.jsonl); resume it with its local path "
            "instead of a URL, or give a new URL"
        )


def _owner_bytes(command: str) -> bytes:
    return (json.dumps({"command": command, "files": []}, indent=2) + "\n").encode("utf-8")


def _read_json(fs: Any, path: str) -> dict[str, Any] | None:
    try:
        data = json.loads(fs.cat_file(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def staging_dir(url: str) -> Path:
    """The local working copy of the run at ``url`` (one per URL, emptied at the start of every run)."""
    from selfrag.models import cache_dir

    return cache_dir() / "generate-staging" / text_key(url, 16)


class UrlOutput:
    """The run at ``url`` mirrored from the local staging folder: pull at the start, sync while it runs, push at the
    end. One writer at a time (like a local directory: two runs into one URL at once are not supported)."""

    def __init__(self, url: str, staging: Path, sync_s: float) -> None:
        self.url, self.staging, self.sync_s = url, staging, sync_s
        self.fs, self.root = open_url(url)
        self.journal = staging / "journal.jsonl"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pushed: dict[str, str] = {}  # state file -> SHA-256 of what the URL holds
        self._parts = 0  # journal parts at the URL
        self._offset = 0  # bytes of the local journal already in parts
        self._handle: Any = None  # keeps the pulled journal's inode alive: a replaced journal gets another inode

    # ---- pull ----------------------------------------------------------------------------------------------

    def pull(self) -> None:
        """Empty the staging folder and fill it with the URL's owner file, state files and journal."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        write_owner(self.staging, "generate")
        for name in STATE_FILES:
            try:
                data = self.fs.cat_file(f"{self.root}/{name}")
            except FileNotFoundError:
                continue
            (self.staging / name).write_bytes(data)
            self._pushed[name] = bytes_digest(data)
        parts = self._journal_parts()
        with self.journal.open("wb") as out:
            for part in parts:
                data = self.fs.cat_file(part)
                out.write(data[: data.rfind(b"\n") + 1])  # a part cut by a killed upload keeps its whole lines
        self._parts = len(parts) and int(parts[-1].rsplit("/", 1)[-1].split(".")[0]) + 1
        self._offset = self.journal.stat().st_size
        self._handle = self.journal.open("rb")
        logger.info("%s: %d journal parts pulled into %s", self.url, len(parts), self.staging)
        if len(parts) > COMPACT_AFTER:
            # One part for all of them, numbered after them, then the old ones deleted: killed in between, the URL
            # holds each entry twice in the same order, and the journal's last-entry-wins reads it the same.
            write_to(self.fs, f"{self.root}/{JOURNAL_DIR}/{self._parts:08d}.jsonl", self.journal.read_bytes())
            self._parts += 1
            self.fs.rm(parts)

    def _journal_parts(self) -> list[str]:
        try:
            names = self.fs.ls(f"{self.root}/{JOURNAL_DIR}", detail=False)
        except FileNotFoundError:
            return []
        return sorted(str(name) for name in names if str(name).endswith(".jsonl"))

    # ---- sync while the run goes on ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="selfrag-url-sync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.sync_s):
            try:
                self.sync()
            except Exception as error:  # noqa: BLE001 - a storage hiccup: the next sync (or the final push) retries
                logger.warning("%s: journal upload failed (%s); retrying in %.0f s", self.url, error, self.sync_s)

    def sync(self) -> None:
        """Upload changed state files, then the journal lines written since the last part."""
        with self._lock:
            if self._replaced():  # restart=true deleted the journal: the URL's parts describe the old run
                stale = [*self._journal_parts(), *self._existing("manifest.json")]
                if stale:
                    self.fs.rm(stale)
                self._parts = self._offset = 0
                self._handle.close()
                self._handle = self.journal.open("rb") if self.journal.exists() else None
            self._push_state()
            if not self.journal.exists():
                return
            with self.journal.open("rb") as source:
                source.seek(self._offset)
                data = source.read()
            data = data[: data.rfind(b"\n") + 1]
            if data:
                write_to(self.fs, f"{self.root}/{JOURNAL_DIR}/{self._parts:08d}.jsonl", data)
                self._parts += 1
                self._offset += len(data)

    def _replaced(self) -> bool:
        if self._handle is None:
            return self.journal.exists()
        try:
            return os.stat(self.journal).st_ino != os.fstat(self._handle.fileno()).st_ino
        except FileNotFoundError:
            return True

    def _push_state(self) -> None:
        for name in STATE_FILES:
            path = self.staging / name
            if not path.exists():
                continue
            data = path.read_bytes()
            if name == "config.yaml":  # the resolved config names the URL, not the staging folder
                settings = yaml.safe_load(data) or {}
                data = yaml.safe_dump({**settings, "output": self.url}, sort_keys=False).encode("utf-8")
            if self._pushed.get(name) != bytes_digest(data):
                write_to(self.fs, f"{self.root}/{name}", data)
                self._pushed[name] = bytes_digest(data)

    def _existing(self, *names: str) -> list[str]:
        return [f"{self.root}/{name}" for name in names if self.fs.exists(f"{self.root}/{name}")]

    # ---- push at the end -----------------------------------------------------------------------------------

    def finish(self, finished: bool, shard_records: int) -> None:
        """Stop syncing and upload the journal; when the run ``finished``, also its shards, stats and manifest."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sync()
        if self._handle is not None:
            self._handle.close()
        if not finished:
            return
        from selfrag.data_gen.outputs import OUTPUT_FILES
        from selfrag.data_gen.ray_executor import MANIFEST_FILE, write_shards

        manifest = write_shards(self.staging, [name for name in OUTPUT_FILES if name.endswith(".jsonl")],
                                shard_records)
        shards = [shard["path"] for entry in manifest["files"].values() for shard in entry["shards"]]
        for path in shards:
            write_to(self.fs, f"{self.root}/{path}", (self.staging / path).read_bytes())
        for name in FINAL_FILES:
            if (self.staging / name).exists():
                write_to(self.fs, f"{self.root}/{name}", (self.staging / name).read_bytes())
        write_to(self.fs, f"{self.root}/{MANIFEST_FILE}", (self.staging / MANIFEST_FILE).read_bytes())
        keep = {f"{self.root}/{path}" for path in shards}
        try:
            stale = [str(name) for name in self.fs.ls(f"{self.root}/shards", detail=False) if str(name) not in keep]
        except FileNotFoundError:
            stale = []
        if stale:  # shards of an earlier, longer output: not in the manifest, removed after it is written
            self.fs.rm(stale)


def write_to(fs: Any, path: str, data: bytes) -> None:
    """One object (a whole file) at ``path``; its folder is made first (file:// does not make it by itself)."""
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)




def run_at_url(config: Any, run_in: Callable[[Any], Any]) -> Any:
    """Run ``selfrag generate`` into the URL ``config.output`` through a local staging folder (see the module)."""
    url = str(config.output).rstrip("/")
    output = UrlOutput(url, staging_dir(url), config.output_sync_s)
    claim_url(output.fs, output.root, url)
    output.pull()
    output.start()
    local = str(output.staging)
    try:
        result = run_in(replace(config, output=local))
    except BaseException as failure:
        try:  # keep what was journaled; the run's own error is the one to show
            output.finish(False, config.ray.shard_records)
        except Exception as error:  # noqa: BLE001
            logger.warning("%s: the journal could not be uploaded (%s); a rerun repeats its questions from the "
                           "teacher cache", url, error)
        if isinstance(failure, ConfigError):  # a refusal names the URL the user gave, not the staging folder
            raise ConfigError([problem.replace(local, url) for problem in failure.problems]) from None
        if isinstance(failure, InputError):
            raise InputError(str(failure).replace(local, url)) from None
        raise
    try:
        output.finish(True, config.ray.shard_records)
    except OSError as error:  # storage refused the final upload (credentials, quota, network)
        raise InputError(
            f"output {url!r}: the upload failed ({type(error).__name__}: {error}); a local copy is in "
            f"{str(output.staging)!r}; run the same command again to upload (the questions come from the URL's "
            "journal or the teacher cache)"
        ) from None
    return replace(
        result,
        message=result.message.replace(local, url),
        problems=tuple(problem.replace(local, url) for problem in result.problems),
    )
