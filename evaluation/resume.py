"""Resume and honest reruns for ``selfrag eval``: each mode's answers are kept per batch under ``<output>/resume/``.

    store = AnswerStore(output_dir)
    done = store.start(mode, mode_fingerprint(config, mode, model_identity))   # rows answered by an earlier run
    ... answer examples[len(done):] in batches, store.append(mode, rows) after each ...
    store.finish(mode)

A mode's fingerprint covers everything that decides its answers: the data and corpus (by content), the model it
runs on (the trained model for ``single_pass``, the base model for the other modes: a directory by its files'
names, sizes and modification times and by its ``selfrag.json``, which holds the calibrated threshold), and every
setting but the output paths, the judge, the printed examples and the plots (the judge runs again over the kept
answers each time: it is cheap next to decoding, and a changed judge must not reuse old verdicts).

* the same fingerprint keeps the mode's answered rows and answers only the rest (a killed run loses at most the
  batch in flight; a finished mode is not decoded again);
* a different fingerprint discards that mode's rows and answers it again, with a log line naming the mode;
* rows are appended and fsynced one batch at a time (``JsonlAppender``); a line cut by a kill is dropped.

So retraining a model re-runs ``single_pass`` only, and a changed calibration does too, while the base-model modes
(the prompted critic is the slowest) are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from selfrag.fsutil import write_json
from selfrag.jsonl import JsonlAppender, truncate_partial_line
from selfrag.runs import file_digest

logger = logging.getLogger(__name__)

RESUME_DIR = "resume"
STATE_FILE = "state.json"
#: settings that do not change what a mode answers
NOT_ANSWERS = ("output_dir", "modes", "judge", "show", "plots", "labels", "model", "base_model")


def model_identity(name: str) -> str:
    """A cheap identity of a model: a directory by its files' names, sizes and mtimes plus ``selfrag.json``'s bytes.

    Hashing the weights themselves would take seconds to minutes for a 7-8B model; a retrained or re-exported
    model always rewrites its weight files (new mtime), and a calibration rewrites ``selfrag.json``. A name that
    is not a directory (a hub id or a built-in alias) is its own identity.
    """
    path = Path(name).expanduser()
    if not path.is_dir():
        return f"name:{name}"  # a built-in alias or a hub id: the name says which weights
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path)
        if not file.is_file() or relative.parts[0] in ("checkpoints", RESUME_DIR):
            continue
        stat = file.stat()
        digest.update(f"{relative}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        if file.name == "selfrag.json":
            digest.update(file.read_bytes())
    return f"dir:{digest.hexdigest()}"


def mode_fingerprint(settings: Mapping[str, Any], mode: str, model: str, inputs: Mapping[str, Path | None]) -> str:
    """The fingerprint of one mode's answers (see the module docstring)."""
    kept = {key: value for key, value in settings.items() if key not in NOT_ANSWERS}
    hashes = {name: (file_digest(path) if path is not None else None) for name, path in inputs.items()}
    blob = json.dumps({"mode": mode, "model": model, "settings": kept, "inputs": hashes}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class AnswerStore:
    """Each mode's answered rows in ``<output>/resume/<mode>.jsonl``, keyed by the mode's fingerprint."""

    def __init__(self, output_dir: Path) -> None:
        self.dir = Path(output_dir) / RESUME_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        state_path = self.dir / STATE_FILE
        try:
            self.state: dict[str, Any] = json.loads(state_path.read_text("utf-8")) if state_path.is_file() else {}
        except (OSError, ValueError):
            logger.warning("%s is unreadable; every mode is answered again", state_path)
            self.state = {}

    def _path(self, mode: str) -> Path:
        return self.dir / f"{mode}.jsonl"

    def _save(self) -> None:
        write_json(self.dir / STATE_FILE, self.state)

    def start(self, mode: str, fingerprint: str, example_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The rows an earlier run with this fingerprint answered (in example order); [] when it must start over."""
        entry = self.state.get(mode)
        path = self._path(mode)
        if entry is not None and entry.get("fingerprint") == fingerprint and path.is_file():
            truncate_partial_line(path)  # a line cut by a kill is answered again
            rows = _read_rows(path)
            ids = [row.get("id") for row in rows] if rows is not None else None
            if rows is not None and ids == list(example_ids[: len(rows)]):
                if rows:
                    logger.info("%s: %d of %d answers kept from the last run with the same settings",
                                mode, len(rows), len(example_ids))
                return rows
            logger.warning("%s: the kept answers do not match the examples; answering again", mode)
        elif entry is not None:
            logger.info("%s: settings, data or model changed since the last run; answering again", mode)
        path.unlink(missing_ok=True)
        self.state[mode] = {"fingerprint": fingerprint, "finished": False}
        self._save()
        return []

    def append(self, mode: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append one batch's rows, flushed and fsynced (a kill loses at most the batch in flight)."""
        with JsonlAppender(self._path(mode)) as appender:
            appender.write(rows)

    def finish(self, mode: str) -> None:
        self.state.setdefault(mode, {})["finished"] = True
        self._save()

    def forget_others(self, modes: Sequence[str]) -> list[str]:
        """Drop kept answers of modes this run does not evaluate; return their names."""
        dropped = [mode for mode in list(self.state) if mode not in modes]
        for mode in dropped:
            self._path(mode).unlink(missing_ok=True)
            del self.state[mode]
        if dropped:
            self._save()
        return dropped


def _read_rows(path: Path) -> list[dict[str, Any]] | None:
    """The kept rows, or None when a line is not JSON (then the mode is answered again)."""
    try:
        return [json.loads(line) for line in path.read_text("utf-8").split("\n") if line.strip()]
    except ValueError:  # also UnicodeDecodeError
        return None
