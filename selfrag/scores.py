"""The reflection scores' formulas, written once: over one token group's probabilities, as floats or as tensors.

    numerator, denominator = support_terms([p_full, p_partial, p_no_support])   # floats: the runtime
    numerator, denominator = support_terms(torch.softmax(logits[support_ids], -1))   # a tensor: training's judgement

Each formula is a ratio of probabilities renormalised over one group (paper's definitions, with ``exp`` of the
log-probs, not the log-probs themselves). It returns the ratio's two terms, so that the caller decides what a zero
denominator means: the runtime (:mod:`selfrag.inference.scoring`) reads it as "no score" (every id of the group
underflowed or was not reported), training's judgement (:mod:`selfrag.training.judgement`) divides softmax values
whose sum is 1. ``probabilities`` is indexed in the group's vocabulary order (:func:`selfrag.reflection.tokens_of`)
and holds plain numbers or 0-d tensors alike: only ``+``, ``*`` and indexing are used, so no model library is
imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from selfrag.reflection import UTILITY_WEIGHTS

#: the weight of ``[Partially supported]`` in the support score
PARTIAL_WEIGHT = 0.5


def first_of_two_terms(probabilities: Sequence[Any]) -> tuple[Any, Any]:
    """``p_0 / (p_0 + p_1)`` as (numerator, denominator): ``P([Retrieval]) / (P([Retrieval]) + P([No Retrieval]))``
    and ``p(Relevant) / (p(Relevant) + p(Irrelevant))``."""
    first, second = probabilities[0], probabilities[1]
    return first, first + second


def support_terms(probabilities: Sequence[Any]) -> tuple[Any, Any]:
    """``(p(Full) + 0.5 p(Partial)) / (p(Full) + p(Partial) + p(No support))`` as (numerator, denominator)."""
    full, partial, no_support = probabilities[0], probabilities[1], probabilities[2]
    return full + PARTIAL_WEIGHT * partial, full + partial + no_support


def utility_terms(probabilities: Sequence[Any]) -> tuple[Any, Any]:
    """``sum(w_k p_k) / sum(p_k)`` over ``[Utility:1..5]``, ``w = (-1, -0.5, 0, 0.5, 1)``, as (numerator,
    denominator)."""
    values = [probabilities[k] for k in range(len(UTILITY_WEIGHTS))]
    weighted = values[0] * UTILITY_WEIGHTS[0]
    total = values[0]
    for weight, value in zip(UTILITY_WEIGHTS[1:], values[1:], strict=True):
        weighted = weighted + weight * value
        total = total + value
    return weighted, total
