"""Export a trained adapter as a merged full model that transformers and vLLM load without PEFT.

    selfrag export runs/smollm2 runs/smollm2-merged

The adapter is loaded by the one loader (:func:`selfrag.loading.load_model`: its base in fp32, grown as training
grew it), merged, and the result written with the tokenizer and ``selfrag.json`` (``kind: merged``). An output that
is the adapter itself, lies inside it, is an existing file or a non-empty directory is refused before
anything is loaded; the model is written into a temporary sibling and renamed into place, so a crash never
leaves a half-written model behind.

Strategy ``reserved`` adapters need no export for vLLM (they are served as a ``LoRARequest``), but can be
merged too; a base with tied input/output embeddings is untied first, because that strategy's LoRA moves the
reflection rows of the embedding and of the head separately.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from selfrag.artifacts import TRAINED_FILE, ModelMeta, load_meta, save_meta
from selfrag.errors import InputError
from selfrag.loading import load_model

logger = logging.getLogger(__name__)


def export(adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``adapter_dir`` merged into its base as a full model in ``out_dir`` (which must not exist yet)."""
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    meta = _require_meta(adapter_dir)
    if meta.kind != "adapter":
        raise InputError(f"{adapter_dir} holds a {meta.kind} model, not an adapter; it needs no export")
    check_output(adapter_dir, out_dir)
    model, tokenizer, _ = load_model(adapter_dir)  # fp32, the adapter unmerged (merged below)
    if meta.strategy == "reserved" and _is_tied(model):
        _untie_head(model)
    merged = model.merge_and_unload()
    staging = out_dir.with_name(f".{out_dir.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)  # our own leftover from a crashed export
    staging.mkdir(parents=True)
    try:
        merged.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        save_meta(staging, replace(meta, kind="merged"))
        if (adapter_dir / TRAINED_FILE).is_file():  # the merged model trained on the same questions
            shutil.copy2(adapter_dir / TRAINED_FILE, staging / TRAINED_FILE)
        if out_dir.is_dir():
            out_dir.rmdir()  # empty: checked above
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("merged %s into its base %s -> %s", adapter_dir, meta.base_model, out_dir)
    return out_dir


def check_output(adapter_dir: Path, out_dir: Path) -> None:
    """Refuse an output that would overwrite or mix with something: checked before any model is loaded."""
    source, target = adapter_dir.resolve(), out_dir.resolve()
    if target == source:
        raise InputError(f"export output {str(out_dir)!r} is the adapter itself; choose a new directory")
    if source in target.parents:
        raise InputError(f"export output {str(out_dir)!r} lies inside the adapter directory; choose one outside it")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"export output {str(out_dir)!r} is an existing file; choose a new directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise InputError(f"export output {str(out_dir)!r} is a non-empty directory; choose a new or empty one")


def _is_tied(model: Any) -> bool:
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    head = head.get_base_layer() if hasattr(head, "get_base_layer") else head
    embedding = embedding.get_base_layer() if hasattr(embedding, "get_base_layer") else embedding
    return bool(head.weight.data_ptr() == embedding.weight.data_ptr())


def _untie_head(model: Any) -> None:
    """Give the output head its own copy of the (tied) embedding weight, so the two merges do not add up."""
    head = model.get_output_embeddings()
    base = head.get_base_layer() if hasattr(head, "get_base_layer") else head
    base.weight = torch.nn.Parameter(base.weight.detach().clone(), requires_grad=False)
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.tie_word_embeddings = False


def _require_meta(directory: Path) -> ModelMeta:
    meta = load_meta(directory)
    if meta is None:
        raise InputError(f"{directory} has no selfrag.json; pass a directory written by `selfrag train` or export")
    return meta
