"""What every backend needs to know about a model directory before it loads weights.

    served = describe_model("runs/model")      # directory, selfrag.json (or one derived), tokenizer

A directory trained by selfrag carries ``selfrag.json``. A released Self-RAG checkpoint (e.g. the paper's
Llama-2 models) has none, but its tokenizer holds the 15 reflection strings as single ids: it is served as a
merged model with the ids read from the tokenizer and the prompt template ``auto``. A base model without
those tokens is refused with the fix.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfrag.artifacts import ModelMeta, load_meta
from selfrag.errors import ModelNotFoundError, TokenizerError
from selfrag.models import resolve_model
from selfrag.reflection import check_ids_match, reflection_ids

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """A model directory, its reflection metadata and its tokenizer (``released`` when no selfrag.json)."""

    directory: Path
    meta: ModelMeta
    tokenizer: Any
    released: bool

    @property
    def is_adapter(self) -> bool:
        return (self.directory / "adapter_config.json").is_file()


def describe_model(model: str | Path, tokenizer_dir: str | Path | None = None) -> ServedModel:
    """Resolve ``model`` (alias, directory) and read its reflection ids; the tokenizer comes from the directory."""
    from transformers import AutoTokenizer

    directory = Path(resolve_model(str(model)))
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir or directory))
    meta = load_meta(directory)
    if meta is not None:
        check_ids_match(tokenizer, meta.token_ids)
        return ServedModel(directory, meta, tokenizer, released=False)
    try:
        ids = reflection_ids(tokenizer)
    except TokenizerError as error:
        raise ModelNotFoundError(
            f"{str(model)!r} has no selfrag.json and its tokenizer has no reflection tokens ({error}); "
            "train one with `selfrag train` (or export a trained one with `selfrag export`) and load that"
        ) from None
    if (directory / "adapter_config.json").is_file():
        raise ModelNotFoundError(
            f"{str(model)!r} is an adapter without selfrag.json, so its base model is unknown; "
            "load an adapter written by `selfrag train`, or merge it first"
        )
    logger.info("%s has no selfrag.json; its tokenizer holds the 15 reflection tokens: serving it as released", model)
    meta = ModelMeta(token_ids=ids, strategy="add", prompt_template="auto", base_model=str(directory), kind="merged")
    return ServedModel(directory, meta, tokenizer, released=True)


def eos_ids_of(tokenizer: Any, base: Path) -> tuple[int, ...]:
    """End-of-sequence ids from the generation config, the model config and the tokenizer (as the hf engine)."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = base / name
        if path.is_file():
            value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(int(item) for item in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))
