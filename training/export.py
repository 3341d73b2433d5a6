"""Export a trained adapter as a merged full model (what vLLM loads), and load either kind back.

    selfrag export runs/smollm2 runs/smollm2-merged --merge

vLLM cannot load a LoRA adapter that adds vocabulary, so strategy ``add`` adapters are merged into the
base: the base is loaded, grown to the saved tokenizer's size, the adapter applied and merged.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from selfrag.artifacts import ModelMeta, load_meta, save_meta
from selfrag.errors import InputError
from selfrag.models import resolve_model
from selfrag.reflection import check_ids_match

logger = logging.getLogger(__name__)


def export(adapter_dir: str | Path, out_dir: str | Path, merge: bool = True) -> Path:
    """Write ``adapter_dir`` merged into its base (``merge=True``) or copied as is into ``out_dir``."""
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    meta = _require_meta(adapter_dir)
    if meta.kind != "adapter":
        raise InputError(f"{adapter_dir} holds a {meta.kind} model, not an adapter; it needs no export")
    if not merge:
        shutil.copytree(adapter_dir, out_dir, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("checkpoints"))
        return out_dir
    model, tokenizer, _ = load_trained(adapter_dir)
    merged = model.merge_and_unload()
    out_dir.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    save_meta(out_dir, replace(meta, kind="merged"))
    logger.info("merged %s into its base %s -> %s", adapter_dir, meta.base_model, out_dir)
    return out_dir


def load_trained(model_dir: str | Path) -> tuple[Any, Any, ModelMeta]:
    """Load a selfrag adapter or merged directory as ``(model, tokenizer, meta)``, in fp32, in eval mode.

    An adapter is applied to a fresh copy of its base (``selfrag.json`` ``base_model``), grown to the
    saved tokenizer's vocabulary first. The tokenizer's reflection ids are checked against ``selfrag.json``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    meta = _require_meta(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    check_ids_match(tokenizer, meta.token_ids)
    model: Any
    if meta.kind == "merged":
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    else:
        from peft import PeftModel

        base: Any = AutoModelForCausalLM.from_pretrained(resolve_model(meta.base_model), dtype=torch.float32)
        rows = base.get_input_embeddings().weight.shape[0]
        needed = max(len(tokenizer), max(meta.token_ids.all_ids) + 1)
        if needed > rows:
            # The new rows' values come from the adapter's trainable-token deltas (copied over them).
            base.resize_token_embeddings(needed, mean_resizing=False)
        model = PeftModel.from_pretrained(base, str(model_dir))
    model.eval()
    return model, tokenizer, meta


def _require_meta(directory: Path) -> ModelMeta:
    meta = load_meta(directory)
    if meta is None:
        raise InputError(f"{directory} has no selfrag.json; pass a directory written by `selfrag train` or export")
    return meta
