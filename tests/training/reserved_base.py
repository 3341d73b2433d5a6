"""A copy of a base model whose tokenizer has Llama-3 style reserved tokens, for testing strategy ``reserved``
(a test helper, imported by name: pytest puts this folder on sys.path; the package never needs it).

SmolLM2 has no unused reserved tokens, so the plain-LoRA path (and vLLM serving it as a ``LoRARequest``)
cannot be exercised on it directly. This writes a copy with ``count`` extra special tokens
``<|reserved_special_token_0..count-1|>`` whose embedding (and untied head) rows are zero, as Llama-3 ships
its never-trained reserved rows, and whose ``config.json`` ``vocab_size`` covers them. Nothing else differs:
for every other token the copy computes exactly what the original does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from selfrag.errors import InputError
from selfrag.models import resolve_model

logger = logging.getLogger(__name__)

#: Llama-3.1 keeps 248 reserved tokens; 32 is plenty for the 15 reflection tokens and keeps the copy small.
DEFAULT_COUNT = 32


@torch.no_grad()
def add_reserved_tokens(model: Any, tokenizer: Any, count: int = DEFAULT_COUNT) -> list[int]:
    """Add ``count`` ``<|reserved_special_token_N|>`` tokens with zero rows to ``model``/``tokenizer``; their ids."""
    if count < 1:
        raise InputError(f"count must be >= 1, got {count}")
    names = [f"<|reserved_special_token_{n}|>" for n in range(count)]
    existing = [name for name in names if name in tokenizer.get_vocab()]
    if existing:
        raise InputError(f"the tokenizer already has {existing[0]}; use the model as it is")
    tokenizer.add_special_tokens({"extra_special_tokens": names}, replace_extra_special_tokens=False)
    ids = tokenizer.convert_tokens_to_ids(names)
    rows = model.get_input_embeddings().weight.shape[0]
    if max(ids) >= rows:
        model.resize_token_embeddings(max(ids) + 1, mean_resizing=False)
    model.get_input_embeddings().weight[ids] = 0
    head = model.get_output_embeddings()
    if head is not None:
        head.weight[ids] = 0  # the same tensor where tied
    return list(ids)


def make_reserved_base(source: str, destination: str | Path, count: int = DEFAULT_COUNT) -> Path:
    """Write a copy of model ``source`` (alias, directory or hub id) with ``count`` zero-row reserved tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    destination = Path(destination)
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise InputError(f"destination {str(destination)!r} exists and is not empty; choose a new directory")
    path = resolve_model(source)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = add_reserved_tokens(model, tokenizer, count)
    model.save_pretrained(str(destination))
    tokenizer.save_pretrained(str(destination))
    logger.info("wrote %s: %s plus %d reserved tokens (ids %d..%d)", destination, source, count, ids[0], ids[-1])
    return destination
