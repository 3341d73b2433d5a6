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

Shared prefixes (``training.share_prefixes``, :class:`SharedPrefixCollator`): a question's records in one micro-batch
(``training.order: question``) begin with the same prompt, and a gold record and its support negative with the same
passage too. Attention is causal, so a token's hidden state depends only on the tokens up to it: every record that
begins with the same ids computes the same states there, and the micro-batch's records are laid out as a prefix tree
(a trie), each shared token once. Each record's own tokens then attend to its path through the tree
(:func:`shared_prefix_sdpa`), and the loss reads each labelled position from the tree node its record passes through
(several records' labels may read one node, each with its own target). The loss and gradients are the packed batch's
(the test says within 1e-5): the same records, the same labelled positions, fewer tokens computed (the quickstart's
batches: 0.68 of the tokens).
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


@dataclass(frozen=True)
class SharedPrefixCollator:
    """The trainer's collator for ``training.share_prefixes``: the micro-batch's records as one prefix tree.

    ``input_ids``/``position_ids``: ``1 x nodes``, each node a token at its depth in its records (so the rotary
    positions are the records' own); ``labels``: the records' labels laid end to end as :class:`PackedCollator` lays
    them (what the loss counts and reads its targets from); ``prefix_sources``: for each labelled position, in the
    same order, the node that predicts it; ``prefix_owned`` (records x 2): the nodes each record adds to the tree,
    a contiguous range (once a record leaves the tree every later token is new); ``prefix_paths`` with
    ``prefix_path_bounds``: each record's nodes, root to leaf (its keys and values in attention).
    """

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        children: dict[tuple[int, int], int] = {}  # (parent node or -1, token) -> node
        ids: list[int] = []
        depths: list[int] = []
        labels: list[int] = []
        sources: list[int] = []
        owned: list[list[int]] = []
        paths: list[int] = []
        bounds = [0]
        for example in examples:
            tokens, own = list(example["input_ids"]), list(example["labels"])
            start, parent, path = len(ids), -1, []
            for depth, token in enumerate(tokens):
                node = children.get((parent, token))
                if node is None:
                    node = children[(parent, token)] = len(ids)
                    ids.append(token)
                    depths.append(depth)
                path.append(node)
                parent = node
            record_labels = [IGNORE, *own[1:]]  # never predicted across the boundary from the previous record
            labels += record_labels
            sources += [path[index - 1] for index, label in enumerate(record_labels) if label != IGNORE]
            owned.append([start, len(ids)])
            paths += path
            bounds.append(len(paths))
        return {
            "input_ids": torch.tensor([ids], dtype=torch.long),
            "labels": torch.tensor([labels], dtype=torch.long),
            "position_ids": torch.tensor([depths], dtype=torch.long),
            "use_cache": False,
            "prefix_sources": torch.tensor(sources, dtype=torch.long),
            "prefix_owned": torch.tensor(owned, dtype=torch.long),
            "prefix_paths": torch.tensor(paths, dtype=torch.long),
            "prefix_path_bounds": torch.tensor(bounds, dtype=torch.long),
        }


#: the batch keys :class:`SharedPrefixCollator` adds for the attention (the model's forward carries them to it)
PREFIX_KEYS = ("prefix_owned", "prefix_paths", "prefix_path_bounds")


def shared_prefix_sdpa(module: Any, query: Any, key: Any, value: Any, owned: Any, paths: Any, bounds: Any,
                       scaling: float | None = None, dropout: float = 0.0) -> Any:
    """Attention over a :class:`SharedPrefixCollator` tree: each record's own nodes (queries) attend to its path
    (keys and values), causally aligned at the path's end; a record that adds the whole of its path attends causally
    without a mask. Returns ``(1, nodes, heads, head_dim)``."""
    groups = query.shape[1] // key.shape[1]
    pieces = []
    spans, flat, edges = owned.tolist(), paths, bounds.tolist()
    for (start, end), first, last in zip(spans, edges[:-1], edges[1:], strict=True):
        if end == start:
            continue  # the whole record is a prefix of an earlier one: it adds no node
        length = last - first
        if length == end - start:  # no shared prefix: its path is its own nodes
            keys, values, mask, causal = key[:, :, start:end], value[:, :, start:end], None, True
        else:
            path = flat[first:last]
            keys, values = key.index_select(2, path), value.index_select(2, path)
            rows = torch.arange(end - start, device=query.device)[:, None] + (length - (end - start))
            mask, causal = torch.arange(length, device=query.device)[None, :] <= rows, False
        if groups > 1:
            keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        pieces.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end], keys, values, attn_mask=mask, dropout_p=dropout, is_causal=causal,
            scale=scaling))
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous()


def packed_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """SDPA one record at a time where the batch is packed (``cu_seq_lens_q``), each causal with no mask (the
    flash / efficient kernels), else plain SDPA: a block-diagonal mask over the packed row would compute the
    attention of every record against every other, ``(sum of lengths)^2`` where the records need ``sum(length^2)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    owned, paths, path_bounds = (kwargs.pop(name, None) for name in PREFIX_KEYS)
    if owned is not None and query.shape[0] == 1:
        return shared_prefix_sdpa(module, query, key, value, owned, paths, path_bounds, scaling=kwargs.get("scaling"),
                                  dropout=float(kwargs.get("dropout") or 0.0)), None
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


def use_shared_prefixes(setting: bool | Literal["auto"], model: Any, packed: bool, dropout: float = 0.0) -> bool:
    """``training.share_prefixes`` resolved: only packed batches share prefixes, and only an sdpa or eager model
    attends over the tree (:func:`packed_attention`); ``true`` elsewhere is refused by the caller's check.

    ``auto`` shares only where the tree is exact: with LoRA dropout (``dropout`` > 0) one mask would serve every
    record at a shared token, where the batch without the tree draws one a record, so the training's random law
    would change (what that did to the quickstart's recipe: results/quickstart.md). ``true`` shares anyway."""
    if not packed:
        return False
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
    if setting == "auto":
        return implementation in ("sdpa", "eager") and not dropout
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
