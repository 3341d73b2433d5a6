"""The training loss: next-token cross-entropy over the labelled positions, with per-id weights, the first answer
word's weight and the pairwise IsREL ranking term.

    loss, outputs = masked_loss(model, inputs, loss_weight_table(weights, token_ids, len(tokenizer)))

Logits are computed only where a label is read (:func:`predicting_positions`): in Self-RAG records most positions are
the masked prompt and passages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from selfrag import reflection as rf
from selfrag.logits import logits_at
from selfrag.reflection import Group, ReflectionIds


def loss_weight_table(
    weights: dict[str, float],
    token_ids: ReflectionIds,
    vocab_size: int,
    balance: Sequence[str] = (),
    label_counts: Mapping[int, int] | None = None,
) -> Any:
    """A per-id weight vector (``text`` weight for ordinary ids, the group's weight for reflection/markup ids).

    ``balance``: reflection types whose ids are also weighted by ``n / (k * count(id))`` (``label_counts``:
    how often each id is a label in the training set; ``n`` the type's labels, ``k`` its ids that occur), so
    each verdict weighs as much in total as the others. None when every weight is 1 (the plain mean loss).
    """
    balanced: dict[int, float] = {}
    for name in balance:
        ids = [i for i in token_ids.ids(Group(name)) if (label_counts or {}).get(i, 0) > 0]
        total = sum((label_counts or {})[i] for i in ids)
        balanced.update({i: total / (len(ids) * (label_counts or {})[i]) for i in ids})
    if not balanced and (not weights or all(float(value) == 1.0 for value in weights.values())):
        return None
    size = max(vocab_size, max(token_ids.all_ids) + 1)
    table = torch.full((size,), float(weights.get("text", 1.0)))
    for token_id in token_ids.all_ids:
        group = token_ids.group_of_id(token_id)
        table[token_id] = float(weights.get(group.value if group is not None else "markup", 1.0))
        table[token_id] *= balanced.get(token_id, 1.0)
    return table


def label_counts(examples: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """How often each id is a (trained) label across ``examples``."""
    counts: dict[int, int] = {}
    for example in examples:
        for label in example["labels"]:
            if label != -100:
                counts[label] = counts.get(label, 0) + 1
    return counts


def predicting_positions(labels: Any) -> Any:
    """A ``batch x length`` bool mask of the positions whose next token is labelled (what the loss reads)."""
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != -100
    return keep


@dataclass(frozen=True)
class AnswerStart:
    """The weight of the first answer word after a verdict: ``after`` ids (the verdicts), ``reflection`` ids
    (a reflection token after a verdict is not an answer word) and the ``weight``."""

    after: Any
    reflection: Any
    weight: float


def answer_start(weights: dict[str, float], token_ids: ReflectionIds) -> AnswerStart | None:
    """:class:`AnswerStart` from ``training.loss_weights.answer_start`` (None when unset)."""
    if "answer_start" not in weights:
        return None
    after = [token_ids.id(token) for token in (rf.RELEVANT, rf.IRRELEVANT, rf.NO_RETRIEVAL)]
    return AnswerStart(torch.tensor(after), torch.tensor(sorted(token_ids.all_ids)), float(weights["answer_start"]))


@dataclass(frozen=True)
class RelevanceRank:
    """The pairwise IsREL ranking term (``training.relevance_rank``): the two verdict ids and the weight."""

    relevant: int
    irrelevant: int
    weight: float


def relevance_rank(weight: float, token_ids: ReflectionIds) -> RelevanceRank | None:
    """:class:`RelevanceRank` for ``training.relevance_rank`` (None when 0)."""
    if weight <= 0:
        return None
    return RelevanceRank(token_ids.id(rf.RELEVANT), token_ids.id(rf.IRRELEVANT), float(weight))


def rank_loss(logits: Any, targets: Any, rank: RelevanceRank) -> Any:
    """Mean ``softplus(m_neg - m_pos)`` over every (``[Relevant]``, ``[Irrelevant]``) pair of IsREL positions.

    ``logits``: one row per labelled position, ``targets`` its label; ``m`` = logit([Relevant]) -
    logit([Irrelevant]) at the position. Zero (no gradient) when the positions hold only one of the verdicts.
    """
    positive, negative = targets == rank.relevant, targets == rank.irrelevant
    if not bool(positive.any()) or not bool(negative.any()):
        return logits.new_zeros(())
    margin = logits[:, rank.relevant].float() - logits[:, rank.irrelevant].float()
    return torch.nn.functional.softplus(margin[negative][None, :] - margin[positive][:, None]).mean()


def masked_loss(
    model: Any,
    inputs: dict[str, Any],
    table: Any,
    start: AnswerStart | None = None,
    rank: RelevanceRank | None = None,
) -> tuple[Any, Any]:
    """Weighted mean next-token cross-entropy, ``sum(w * ce) / sum(w)`` over the labelled positions, with logits
    computed only where a label is read.

    The model projects onto the vocabulary only the hidden states of :func:`predicting_positions`
    (transformers' ``logits_to_keep`` with a bool mask): in Self-RAG records most positions are the masked
    prompt and passage, so this skips most of the ``length x vocab`` head and its backward. ``table`` None
    is the plain mean over the labelled positions of the micro-batch; ``start`` reweights the first answer
    word after a verdict; ``rank`` adds the pairwise IsREL term (:func:`rank_loss`) times its weight.
    Returns ``(loss, outputs)``. A :class:`~selfrag.training.packing.SharedPrefixCollator` batch (its
    ``prefix_sources``) reads each labelled position's logits from the prefix-tree node that predicts it.
    """
    labels = inputs["labels"]
    targets = labels[:, 1:][labels[:, 1:] != -100]
    sources = inputs.get("prefix_sources")
    if sources is None:
        keep = predicting_positions(labels)
        logits, outputs = logits_at(model, {key: value for key, value in inputs.items() if key != "labels"}, keep)
        previous = inputs["input_ids"][keep]  # the token read at each predicting position
    else:  # training.share_prefixes: each labelled position is predicted by its record's node of the prefix tree
        outputs = model(**{key: value for key, value in inputs.items() if key not in ("labels", "prefix_sources")},
                        logits_to_keep=sources)
        logits = outputs.logits.reshape(-1, outputs.logits.shape[-1])
        previous = inputs["input_ids"][0, sources]
    ce = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
    if table is None and start is None:
        loss = ce.mean() if ce.numel() else ce.sum()
    else:
        weights = table.to(ce.device)[targets] if table is not None else torch.ones_like(ce)
        if start is not None:
            verdict_before = torch.isin(previous, start.after.to(ce.device))
            first_word = verdict_before & ~torch.isin(targets, start.reflection.to(ce.device))
            weights = torch.where(first_word, torch.full_like(weights, start.weight), weights)
        loss = (ce * weights).sum() / weights.sum().clamp_min(1e-8)
    if rank is not None:
        loss = loss + rank.weight * rank_loss(logits, targets, rank)
    return loss, outputs


