"""Padding-free micro-batches (``training.padding_free``): a micro-batch's records laid end to end in one row.

    collator = PackedCollator()
    batch = collator([{"input_ids": [...], "labels": [...]}, ...])   # input_ids 1 x sum(lengths), position_ids

A padded micro-batch of records from 259 to 1857 tokens computes every row at the longest one's length; packed, it
computes the records' own tokens only. Attention stays within each record: the position ids restart at 0 for each
record and no ``attention_mask`` is passed, which transformers reads as packed sequences (``masking_utils.
find_packed_sequence_indices``: a block-diagonal causal mask for the eager and SDPA attention, the varlen kernel for
flash attention). A block-diagonal mask still computes every record against every other, so for the training steps
an SDPA or eager model attends with :func:`packed_sdpa` instead (:func:`packed_attention`): SDPA over each record
alone, causal and unmasked, from the records' bounds the collator adds (``cu_seq_lens_q``, as flash attention reads
them). The loss is unchanged: :func:`~selfrag.training.loss.masked_loss` reads the same labelled
positions in the same order (the first label of each record is masked, as a padded row never predicts it either), so
its per-token mean is over the same trained tokens (tests/training/test_packing.py: loss and gradients equal the
padded batch's within 1e-5).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch

IGNORE = -100
#: attention implementations that keep packed records apart when given restarting position ids and no mask
ISOLATING = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
#: the attention :func:`packed_attention` gives an SDPA or eager model for the training steps
PACKED_SDPA = "selfrag_packed_sdpa"


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
        bounds = torch.tensor([0, *itertools.accumulate(len(example["input_ids"]) for example in examples)],
                              dtype=torch.int32)
        longest = max(len(example["input_ids"]) for example in examples)
        return {
            "input_ids": torch.tensor([input_ids], dtype=torch.long),
            "labels": torch.tensor([labels], dtype=torch.long),
            "position_ids": torch.tensor([positions], dtype=torch.long),
            "use_cache": False,  # transformers looks for packed sequences only without a cache
            # the records' bounds, as flash attention's varlen kernel reads them (and packed_sdpa below)
            "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": longest, "max_length_k": longest,
        }


def packed_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """SDPA one record at a time where the batch is packed (``cu_seq_lens_q``), each causal with no mask (the
    flash / efficient kernels), else plain SDPA: a block-diagonal mask over the packed row would compute the
    attention of every record against every other, ``(sum of lengths)^2`` where the records need ``sum(length^2)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.pop("cu_seq_lens_q", None)
    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k", "is_causal"):
        kwargs.pop(name, None)
    if bounds is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    edges = bounds.tolist()
    pieces = [sdpa_attention_forward(module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                     None, is_causal=True, **kwargs)[0]
              for start, end in itertools.pairwise(edges)]
    return torch.cat(pieces, dim=1), None  # (1, length, heads, head_dim), as sdpa_attention_forward returns


def packed_mask(*args: Any, **kwargs: Any) -> Any:
    """No mask where none is needed (no padding: causal, or packed records that packed_sdpa keeps apart), else
    SDPA's (the padded batches of held-out scoring)."""
    from transformers.masking_utils import sdpa_mask

    return None if kwargs.get("attention_mask") is None else sdpa_mask(*args, **kwargs)


@contextmanager
def packed_attention(model: Any, on: bool) -> Iterator[None]:
    """``model`` attends with :func:`packed_sdpa` for the duration where it runs SDPA or eager attention (flash
    attention reads the records' bounds itself)."""
    config: Any = getattr(model, "config", None)
    original = getattr(config, "_attn_implementation", None)
    if not on or config is None or original not in ("sdpa", "eager"):
        yield
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, packed_mask)
    config._attn_implementation = PACKED_SDPA
    try:
        yield
    finally:
        config._attn_implementation = original


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
