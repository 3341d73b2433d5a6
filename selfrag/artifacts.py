"""``selfrag.json``: what every trained model or adapter directory says about itself.

The runtime reads token ids, strategy, prompt template and base model from here; nothing else
hard-codes ids or vocabulary sizes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from selfrag.errors import InputError
from selfrag.fsutil import read_text, write_json
from selfrag.reflection import ReflectionIds
from selfrag.runs import content_digest

META_FILE = "selfrag.json"
META_VERSION = 1
#: Beside ``selfrag.json``: the questions the model was trained on, by :func:`question_key` (written by
#: ``selfrag train`` from the records it trained on; ``eval`` and ``calibrate`` refuse data that holds them).
TRAINED_FILE = "trained-questions.json"


@dataclass(frozen=True)
class ModelMeta:
    token_ids: ReflectionIds
    strategy: Literal["add", "reserved"]
    prompt_template: str
    base_model: str
    kind: Literal["adapter", "merged"]
    #: measured by ``selfrag calibrate``: threshold, relevance_threshold, support_bound and how they were measured
    #: (None: not calibrated)
    calibration: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": META_VERSION,
            "tokens": self.token_ids.to_json(),
            "strategy": self.strategy,
            "prompt_template": self.prompt_template,
            "base_model": self.base_model,
            "kind": self.kind,
        }
        if self.calibration is not None:
            data["calibration"] = dict(self.calibration)
        return data


def save_meta(directory: str | Path, meta: ModelMeta) -> Path:
    path = Path(directory) / META_FILE
    return write_json(path, meta.to_json())  # atomic: a killed save never leaves a half selfrag.json


def load_meta(directory: str | Path) -> ModelMeta | None:
    """The directory's ``selfrag.json``, or None if it has none (a base model without reflection tokens)."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(read_text(path, META_FILE))
    except json.JSONDecodeError as error:
        raise InputError(
            f"{path}:{error.lineno}: not valid JSON ({error.msg}); re-export the model with selfrag"
        ) from None
    try:
        return ModelMeta(
            token_ids=ReflectionIds.from_json(data["tokens"]),
            strategy=data["strategy"],
            prompt_template=data["prompt_template"],
            base_model=data["base_model"],
            kind=data["kind"],
            calibration=_calibration(data.get("calibration"), path),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise InputError(f"{path} is malformed ({error!r}); re-export the model with selfrag") from None


def _calibration(value: Any, path: Path) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"{path}: 'calibration' must be an object, got {value!r}; run selfrag calibrate again")
    return value


def write_calibration(directory: str | Path, calibration: dict[str, Any]) -> Path:
    """Set the ``calibration`` entry of a model's ``selfrag.json``, keeping every other key (atomic rename)."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise InputError(f"{path} not found; calibrate a model directory written by selfrag train")
    data = json.loads(path.read_text(encoding="utf-8"))
    data["calibration"] = calibration
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


# ---- what a model trained on ----------------------------------------------------------------------------------


def question_key(text: str) -> str:
    """A question as training and evaluation compare it: its words, case-folded, by the one digest (16 hex)."""
    return content_digest(" ".join(text.split()).casefold()).split(":", 1)[1][:16]


def save_trained_questions(directory: str | Path, questions: Iterable[str]) -> Path:
    """Write :data:`TRAINED_FILE`: the sorted keys of ``questions`` (each record's instruction)."""
    keys = sorted({question_key(question) for question in questions})
    data = {"version": 1, "key": "sha256 of the question's case-folded words, first 16 hex digits", "questions": keys}
    return write_json(Path(directory) / TRAINED_FILE, data)


def load_trained_questions(directory: str | Path) -> frozenset[str] | None:
    """The keys of the questions a model directory was trained on; None where it does not say (no such file: a model
    from elsewhere, or trained before the file existed)."""
    path = Path(directory) / TRAINED_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(read_text(path, TRAINED_FILE))
        return frozenset(str(key) for key in data["questions"])
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise InputError(f"{path} is malformed ({error!r}); train the model again, or delete the file") from None
