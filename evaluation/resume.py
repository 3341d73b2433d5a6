"""Resume and honest reruns for ``selfrag eval``: each mode's answers are kept per batch under ``<output>/resume/``.

    store = AnswerStore(output_dir)
    done = store.start(mode, mode_fingerprint(settings, mode, model_identity(model), digests, output_dir), ids)
    ... answer examples[len(done):] in batches, store.append(mode, rows) after each ...
    store.finish(mode)

A mode's fingerprint (:mod:`selfrag.runs`, kept in ``resume/state.json``) covers everything that decides its answers:
the data and corpus (by content), the model it runs on (the trained model for ``single_pass``, the base model for
the other modes: a directory by its files' contents, which includes ``selfrag.json`` and its calibrated threshold),
and every setting but the output paths, the judge, the printed examples and the plots (the judge runs again over
the kept answers each time: it is cheap next to decoding, and a changed judge must not reuse old verdicts).

* the same fingerprint keeps the mode's answered rows and answers only the rest (a killed run loses at most the
  batch in flight; a finished mode is not decoded again), also in a copy of the output folder made elsewhere;
* a different fingerprint discards that mode's rows and answers it again, with a log line naming what changed;
* rows are appended and fsynced one batch at a time (``JsonlAppender``); a line cut by a kill is dropped.

So retraining a model re-runs ``single_pass`` only, and a changed calibration does too, while the base-model modes
(the prompted critic is the slowest) are kept. A mode an older version recorded (a bare hash) is answered again.

The label agreement's predictions (``labels=``) are kept the same way, in ``resume/reflection.json`` with what decided
them (:func:`predictions_key`: the trained model by content, the labels file by content, the inference settings): a
rerun that changes none of them reuses them instead of scoring every label again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from selfrag.fsutil import write_json
from selfrag.jsonl import JsonlAppender, truncate_partial_line
from selfrag.runs import Ledger, directory_digest, run_fingerprint

logger = logging.getLogger(__name__)

RESUME_DIR = "resume"
STATE_FILE = "state.json"
#: the label predictions of the last run that scored labels, with what decided them (:func:`predictions_key`)
PREDICTIONS_FILE = "reflection.json"
#: bumped when :func:`selfrag.evaluation.token_agreement.predict` would score the same labels otherwise
PREDICTIONS_VERSION = 1
#: settings that do not change what a mode answers
NOT_ANSWERS = ("output_dir", "modes", "judge", "show", "plots", "labels", "model", "base_model",
               "allow_trained_questions",
               # how a remote engine is reached, not what it answers
               *(f"inference.engine_options.{name}" for name in ("concurrency", "timeout", "max_retries", "backoff",
                                                                 "api_key_env")))


def model_identity(name: str) -> str:
    """A model's identity: a directory by its files' contents (:func:`selfrag.runs.directory_digest`: weight shards
    over 256 MiB by size and time), which a retraining, re-export or calibration (``selfrag.json``) changes. A name
    that is not a directory (a hub id or a built-in alias) is its own identity."""
    path = Path(name).expanduser()
    if not path.is_dir():
        return f"name:{name}"  # a built-in alias or a hub id: the name says which weights
    return directory_digest(path, skip=("checkpoints", RESUME_DIR))


def mode_fingerprint(
    settings: Mapping[str, Any], mode: str, model: str, digests: Mapping[str, str | None], root: Path
) -> dict[str, Any]:
    """The fingerprint of one mode's answers (see the module docstring); ``digests``: the data and corpus."""
    return run_fingerprint(mode, settings, ignore=NOT_ANSWERS, root=root, digests={**digests, "model": model})


class AnswerStore:
    """Each mode's answered rows in ``<output>/resume/<mode>.jsonl``, its fingerprint in ``resume/state.json``."""

    def __init__(self, output_dir: Path) -> None:
        self.dir = Path(output_dir) / RESUME_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(self.dir / STATE_FILE)

    def _path(self, mode: str) -> Path:
        return self.dir / f"{mode}.jsonl"

    def start(
        self, mode: str, fingerprint: Mapping[str, Any], example_ids: Sequence[str],
        defaults: Mapping[str, Any] = {},  # noqa: B006 (read only)
        renamed: Mapping[str, str | None] = {},  # noqa: B006 (read only)
    ) -> list[dict[str, Any]]:
        """The rows an earlier run with this fingerprint answered (in example order); [] when it must start over.
        ``defaults``, ``renamed``: a setting the earlier run did not record, or spelled otherwise (the config's
        ``RENAMED_SETTINGS``), as :func:`selfrag.runs.differences` reads them."""
        verdict = self.ledger.check(mode, fingerprint, defaults, renamed)
        path = self._path(mode)
        if verdict.state == "same" and path.is_file():
            truncate_partial_line(path)  # a line cut by a kill is answered again
            rows = _read_rows(path)
            ids = [row.get("id") for row in rows] if rows is not None else None
            if rows is not None and ids == list(example_ids[: len(rows)]):
                if rows:
                    logger.info("%s: %d of %d answers kept from the last run with the same settings",
                                mode, len(rows), len(example_ids))
                return rows
            logger.warning("%s: the kept answers do not match the examples; answering again", mode)
        elif verdict.state == "changed":
            logger.info("%s: answering again, changed since the last run: %s", mode, "; ".join(verdict.changes))
        path.unlink(missing_ok=True)
        self.ledger.finish(mode, False)
        return []

    def append(self, mode: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append one batch's rows, flushed and fsynced (a kill loses at most the batch in flight)."""
        with JsonlAppender(self._path(mode)) as appender:
            appender.write(rows)

    def finish(self, mode: str) -> None:
        self.ledger.finish(mode)

    def forget_others(self, modes: Sequence[str]) -> list[str]:
        """Drop kept answers of modes this run does not evaluate; return their names."""
        dropped = [mode for mode in self.ledger if mode not in modes]
        for mode in dropped:
            self._path(mode).unlink(missing_ok=True)
        if dropped:
            self.ledger.forget(dropped)
        return dropped

    def kept_predictions(self, key: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The label predictions an earlier run made with this ``key`` (:func:`predictions_key`), else None."""
        path = self.dir / PREDICTIONS_FILE
        try:
            kept = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):  # none yet, or cut by a kill (it is written atomically, so not by this one)
            return None
        if not (isinstance(kept, dict) and isinstance(kept.get("key"), dict) and isinstance(kept.get("rows"), list)):
            return None
        if _compared(kept["key"]) != _compared(json.loads(json.dumps(key))):  # as JSON stores it (tuples: lists)
            return None
        logger.info("label agreement: %d predictions kept from the last run with the same model, labels and "
                    "inference settings", len(kept["rows"]))
        return kept["rows"]

    def keep_predictions(self, key: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
        write_json(self.dir / PREDICTIONS_FILE, {"key": dict(key), "rows": list(rows)})


def predictions_key(settings: Mapping[str, Any], model: str, labels: str | Path, root: Path) -> dict[str, Any]:
    """What decides the label predictions (``reflection.jsonl``): the trained model (``model``, its identity), the
    labels file by content, and every ``inference`` setting but how a remote engine is reached (a setting that only
    the runtime reads costs one more scoring, never a stale one)."""
    return run_fingerprint(f"labels-v{PREDICTIONS_VERSION}", settings, {"labels": labels}, ignore=NOT_ANSWERS,
                           root=root, keep=("inference",), digests={"model": model})


def _compared(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """A fingerprint less where its inputs were read (named in messages, never compared: a moved file is the same)."""
    return {key: value for key, value in fingerprint.items() if key != "sources"}


def _read_rows(path: Path) -> list[dict[str, Any]] | None:
    """The kept rows, or None when a line is not JSON (then the mode is answered again)."""
    try:
        return [json.loads(line) for line in path.read_text("utf-8").split("\n") if line.strip()]
    except ValueError:  # also UnicodeDecodeError
        return None
