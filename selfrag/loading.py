"""The one model loader: a directory trained by selfrag (merged model or LoRA adapter) or a released checkpoint.

    served = describe_model("runs/model")      # directory, selfrag.json (or one derived), tokenizer; no weights
    model, tokenizer, meta = load_model("runs/model")                  # fp32 on CPU, in eval mode; an adapter as PEFT
    model = load_weights(served, dtype="bfloat16", device="cuda", merge=True)
    base = load_base_model("configs/models/llama-3.1-8b", "bfloat16", random_init=True)   # a shape: random weights

Every place that loads a trained model goes through here: the hf engine, ``selfrag export``, the studies and the
tests. An adapter is applied to a fresh copy of its base (``selfrag.json`` ``base_model``), whose embedding is first
grown exactly as training grew it (:func:`grow_embeddings`: to the tokenizer and every reflection id, never shrunk);
PEFT then restores the trained reflection rows (``trainable_token_indices``) over the grown ones.

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
from typing import Any, NamedTuple

from selfrag.artifacts import ModelMeta, load_meta
from selfrag.errors import ModelNotFoundError, TokenizerError
from selfrag.models import resolve_model
from selfrag.reflection import ReflectionIds, check_ids_match, reflection_ids

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


class LoadedModel(NamedTuple):
    """A loaded model (a ``PeftModel`` for an unmerged adapter), its tokenizer and its ``selfrag.json``."""

    model: Any
    tokenizer: Any
    meta: ModelMeta


def embedding_rows(tokenizer: Any, token_ids: ReflectionIds) -> int:
    """Rows an embedding needs for ``tokenizer`` and every reflection id: what training grows a base to."""
    return max(len(tokenizer), max(token_ids.all_ids) + 1)


def grow_embeddings(model: Any, rows: int) -> bool:
    """Resize ``model``'s embeddings (and untied head) to ``rows`` when it has fewer; True when it grew.

    Never shrinks: a base whose matrix is padded past its tokenizer (Qwen2.5: 151,936 rows for 151,665 tokens) keeps
    its rows, in training and at load alike, so an adapter meets the shapes it was trained with. The new rows'
    values are the caller's: training sets them to the mean, a loaded adapter's trained rows replace them.
    """
    if rows <= model.get_input_embeddings().weight.shape[0]:
        return False
    # mean_resizing=False: its sampled rows are replaced anyway, and its covariance over a large vocabulary is slow
    model.resize_token_embeddings(rows, mean_resizing=False)
    return True


def load_base_model(path: str, dtype: Any = "float32", random_init: bool = False, seed: int = 0,
                    device: str | None = None, **options: Any) -> Any:
    """The base model at ``path`` (a directory or hub id from :func:`resolve_model`): its weights, or, only when
    ``random_init`` says so, seeded random weights from its ``config.json``, built directly on ``device`` (default:
    the current CUDA device where there is one, else the CPU) so an 8B shape needs neither a download nor a CPU copy.

    Random weights check speed, memory and the machinery; what such a model says means nothing. A directory without
    weight files is refused in one line unless ``random_init`` is set; ``options`` go to ``from_pretrained``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from selfrag.shapes import has_weights

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    directory = Path(path)
    if not random_init:
        if directory.is_dir() and not has_weights(directory):
            raise ModelNotFoundError(
                f"model directory {path!r} has a config.json but no weights (a shape from configs/models?); set "
                "random_init=true to build it with seeded random weights (speed and memory checks only), or give a "
                "directory with the model's weights"
            )
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **options)
    if options.get("quantization_config") is not None:
        raise ModelNotFoundError("random_init=true builds unquantised random weights; quantization (QLoRA) needs "
                                 "real weights to quantise: remove quantization or set random_init=false")
    if directory.is_dir() and has_weights(directory):
        logger.warning("random_init=true: the weights in %s are NOT loaded; the model gets seeded random ones", path)
    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    logger.info("random_init=true: building %s from its config.json with seeded random %s weights on %s", path,
                str(dtype).removeprefix("torch."), device)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)


def load_weights(served: ServedModel, dtype: Any = "float32", device: str = "cpu", merge: bool = False) -> Any:
    """The model of ``served`` in eval mode: a merged directory as it is, an adapter on its base (folded into the
    weights when ``merge``; else a ``PeftModel``). ``dtype``: a torch dtype or its name (``bfloat16``)."""
    import torch

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    kind = served.meta.kind
    if served.is_adapter != (kind == "adapter"):
        logger.warning("selfrag.json says kind=%s but %s %s adapter_config.json", kind, served.directory,
                       "has" if served.is_adapter else "has no")
    if not served.is_adapter:
        merged: Any = load_base_model(str(served.directory), dtype)
        return merged.to(device).eval()
    from peft import PeftModel

    base: Any = load_base_model(resolve_model(served.meta.base_model), dtype)
    grow_embeddings(base, embedding_rows(served.tokenizer, served.meta.token_ids))
    adapted: Any = PeftModel.from_pretrained(base, str(served.directory))
    if merge:
        # one model served: folding the LoRA deltas and trained rows into the weights removes PEFT's per-layer
        # overhead from every decoding step (see benchmarks/short_form.py)
        adapted = adapted.merge_and_unload()
    return adapted.to(device).eval()


def load_model(model: str | Path, dtype: Any = "float32", device: str = "cpu", merge: bool = False) -> LoadedModel:
    """Load a selfrag adapter or merged directory (or a released checkpoint) as ``(model, tokenizer, meta)``, in eval
    mode; the tokenizer's reflection ids are checked against ``selfrag.json``."""
    served = describe_model(model)
    return LoadedModel(load_weights(served, dtype, device, merge), served.tokenizer, served.meta)


def load_plain_model(model: str | Path, dtype: Any = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a model without reflection tokens (a base model), in eval mode."""
    from transformers import AutoTokenizer

    directory = resolve_model(str(model))
    loaded: Any = load_base_model(str(directory), dtype)
    return loaded.to(device).eval(), AutoTokenizer.from_pretrained(str(directory))
