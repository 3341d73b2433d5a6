"""``selfrag.json``: what every trained model or adapter directory says about itself.

The runtime reads token ids, strategy, prompt template and base model from here; nothing else
hard-codes ids or vocabulary sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from selfrag.errors import InputError
from selfrag.fsutil import read_text, write_json
from selfrag.reflection import ReflectionIds

META_FILE = "selfrag.json"
META_VERSION = 1


@dataclass(frozen=True)
class ModelMeta:
    token_ids: ReflectionIds
    strategy: Literal["add", "reserved"]
    prompt_template: str
    base_model: str
    kind: Literal["adapter", "merged"]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": META_VERSION,
            "tokens": self.token_ids.to_json(),
            "strategy": self.strategy,
            "prompt_template": self.prompt_template,
            "base_model": self.base_model,
            "kind": self.kind,
        }


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
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise InputError(f"{path} is malformed ({error!r}); re-export the model with selfrag") from None
