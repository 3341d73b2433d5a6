"""Padding-free micro-batches (``training.padding_free``): a micro-batch's records laid end to end in one row.

    collator = PackedCollator()
    batch = collator([{"input_ids": [...], "labels": [...]}, ...])   # input_ids 1 x sum(lengths), position_ids

A padded micro-batch of records from 259 to 1857 tokens computes every row at the longest one's length; packed, it
computes the records' own tokens only. Attention stays within each record: the position ids restart at 0 for each
record and no ``attention_mask`` is passed, which transformers reads as packed sequences (``masking_utils.
find_packed_sequence_indices``: a block-diagonal causal mask for the eager and SDPA attention, the varlen kernel for
flash attention). The loss is unchanged: :func:`~selfrag.training.loss.masked_loss` reads the same labelled
positions in the same order (the first label of each record is masked, as a padded row never predicts it either), so
its per-token mean is over the same trained tokens (tests/training/test_packing.py: loss and gradients equal the
padded batch's within 1e-5).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

IGNORE = -100
#: attention implementations that keep packed records apart when given restarting position ids and no mask
ISOLATING = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


@dataclass(frozen=True)
class PackedCollator:
    """The trainer's collator for ``training.padding_free``: ``input_ids``/``labels``/``position_ids`` of shape
    ``1 x sum(lengths)``, no ``attention_mask``, no cache."""

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        input_ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for example in examples:
            ids, own = list(example["input_ids"]), list(example["labels"])
            input_ids += ids
            labels += [IGNORE, *own[1:]]  # never predicted across the boundary from the previous record
            positions += range(len(ids))
        return {
            "input_ids": torch.tensor([input_ids], dtype=torch.long),
            "labels": torch.tensor([labels], dtype=torch.long),
            "position_ids": torch.tensor([positions], dtype=torch.long),
            "use_cache": False,  # transformers looks for packed sequences only without a cache
        }


def isolates_packed(model: Any) -> bool:
    """Whether this transformers release and ``model``'s attention keep packed records apart (see the module)."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    return str(implementation) in ISOLATING


def use_padding_free(setting: bool | Literal["auto"], model: Any, batch_size: int) -> bool:
    """``training.padding_free`` resolved: ``auto`` packs where the attention isolates records and a micro-batch
    holds more than one; ``true`` on an attention that cannot isolate them is refused by the caller's check."""
    if setting == "auto":
        return batch_size > 1 and isolates_packed(model)
    return bool(setting)


def padding_share(lengths: Sequence[int], batches: Iterable[Sequence[int]]) -> float:
    """The share of a padded run's tokens that are pads: each batch (indices into ``lengths``) padded to its
    longest record."""
    padded = real = 0
    for batch in batches:
        sizes = [lengths[index] for index in batch]
        if sizes:
            padded += max(sizes) * len(sizes)
            real += sum(sizes)
    return 1 - real / padded if padded else 0.0
