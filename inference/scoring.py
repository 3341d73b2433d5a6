"""Scores read from the model's own reflection-token log-probs (pure functions, no backend).

All scores are ratios of *probabilities* (``exp`` of the reported log-probs), renormalised over one
token group; the formulas are written once, in :mod:`selfrag.scores` (training's judgement uses them too).
The reference implementation compared raw log-probs for the retrieve decision; that is a different (and
wrong) quantity.

A score is None when the group's tokens have no reported log-prob (or the model never generated the
group at all); it then contributes 0 to the combined score and is listed in ``missing``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from selfrag import reflection as rf
from selfrag.reflection import Group, ReflectionIds
from selfrag.scores import first_of_two_terms, support_terms, utility_terms

from .engines.base import Generation
from .trace import CandidateScore, Relevance

COMPONENTS = ("relevance", "support", "utility")


def group_probabilities(logprobs: Mapping[int, float], ids: Sequence[int]) -> list[float] | None:
    """``exp`` of each id's log-prob (0 for an absent id); None when no id of the group is present."""
    if not any(token_id in logprobs for token_id in ids):
        return None
    return [math.exp(logprobs[token_id]) if token_id in logprobs else 0.0 for token_id in ids]


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator <= 0.0 else numerator / denominator


def retrieve_probability(logprobs: Mapping[int, float], token_ids: ReflectionIds) -> float | None:
    """``P([Retrieval]) / (P([Retrieval]) + P([No Retrieval]))`` at one position; None if both are absent."""
    probabilities = group_probabilities(logprobs, (token_ids.id(rf.RETRIEVAL), token_ids.id(rf.NO_RETRIEVAL)))
    return None if probabilities is None else _ratio(*first_of_two_terms(probabilities))


def relevance_score(logprobs: Mapping[int, float], token_ids: ReflectionIds) -> float | None:
    """``p(Relevant) / (p(Relevant) + p(Irrelevant))`` at one position (the first generated one)."""
    probabilities = group_probabilities(logprobs, token_ids.ids(Group.RELEVANCE))
    return None if probabilities is None else _ratio(*first_of_two_terms(probabilities))


@dataclass(frozen=True)
class RelevanceVerdict:
    """A passage branch's first position read at a threshold: the generation to continue from and why."""

    generation: Generation  # the decode as given; only its first position, the verdict, where that was overridden
    score: float | None  # relevance_score at the first position (None: neither token has a log-prob)
    token: str | None  # the verdict the branch continues from (the generated token when score is None)
    generated: str | None  # the token the model itself generated there (None: not a relevance token)

    @property
    def overridden(self) -> bool:
        return self.score is not None and self.token != self.generated


def relevance_verdict(first: Generation, token_ids: ReflectionIds, threshold: float) -> RelevanceVerdict:
    """``[Relevant]`` when the relevance score at the branch's first position is ``>= threshold``, else
    ``[Irrelevant]``. Where the model generated another token there, the generation becomes that one verdict token
    (to be continued from it: the branch then rests on the verdict the policy acts on).

    A model can rank passages well while its generated (argmax) verdict sits on one side; the threshold, measured by
    ``selfrag calibrate``, moves the cut. A decode whose score cannot be read (neither token reported) is left as
    generated.
    """
    generated_id = first.token_ids[0] if first.token_ids else None
    generated = None
    if generated_id is not None and token_ids.group_of_id(int(generated_id)) is Group.RELEVANCE:
        generated = token_ids.token(int(generated_id))
    score = relevance_score(first.score_logprobs[0], token_ids) if first.score_logprobs else None
    if score is None:
        return RelevanceVerdict(first, None, generated, generated)
    token = rf.RELEVANT if score >= threshold else rf.IRRELEVANT
    if token != generated:  # a stop or end-of-sequence id here becomes the verdict too, so the branch goes on
        first = Generation(
            token_ids=(token_ids.id(token),),
            text=token,
            score_logprobs=first.score_logprobs[:1],
            finish_reason="length",
            prompt_tokens=first.prompt_tokens,
            seconds=first.seconds,
            score_bounds=first.score_bounds[:1],
        )
    return RelevanceVerdict(first, score, token, generated)


def relevance_entry(
    passage_ids: Sequence[str], verdicts: Sequence[RelevanceVerdict], threshold: float,
    round_: int | None = None, segment: int | None = None,
) -> Relevance:
    """The trace entry of one set of branches' relevance verdicts (short form: of ``round_``; long form: before
    ``segment``)."""
    overridden = tuple(pid for pid, v in zip(passage_ids, verdicts, strict=True) if v.overridden)
    return Relevance(
        relevance_threshold=threshold,
        relevance={pid: v.score for pid, v in zip(passage_ids, verdicts, strict=True)},
        chosen={pid: v.token for pid, v in zip(passage_ids, verdicts, strict=True)},
        generated={pid: v.generated for pid, v in zip(passage_ids, verdicts, strict=True)},
        overridden=overridden,
        reason=f"{rf.RELEVANT} where the relevance score is >= {threshold}, else {rf.IRRELEVANT}; "
        f"{len(overridden)} of {len(verdicts)} differ from the token the model generated",
        round=round_,
        segment=segment,
    )


def support_score(logprobs: Mapping[int, float], token_ids: ReflectionIds) -> float | None:
    """``(p(Full) + 0.5 p(Partial)) / (p(Full) + p(Partial) + p(No support))`` at one position."""
    probabilities = group_probabilities(logprobs, token_ids.ids(Group.SUPPORT))
    return None if probabilities is None else _ratio(*support_terms(probabilities))


def utility_score(logprobs: Mapping[int, float], token_ids: ReflectionIds) -> float | None:
    """``sum(w_k p_k) / sum(p_k)`` over ``[Utility:1..5]`` with ``w = (-1, -0.5, 0, 0.5, 1)``."""
    probabilities = group_probabilities(logprobs, token_ids.ids(Group.UTILITY))
    return None if probabilities is None else _ratio(*utility_terms(probabilities))


def first_position(generated: Sequence[int], token_ids: ReflectionIds, group: Group) -> int | None:
    """Index of the first generated id that belongs to ``group`` (None if there is none)."""
    for index, token_id in enumerate(generated):
        if token_ids.group_of_id(int(token_id)) is group:
            return index
    return None


def score_continuation(
    generated: Sequence[int],
    logprobs: Sequence[Mapping[int, float]],
    token_ids: ReflectionIds,
    weights: Mapping[str, float],
) -> CandidateScore:
    """Score a continuation of ``prompt + [Retrieval]<paragraph>…</paragraph>``.

    Relevance is read at the first generated position; support at the first position whose generated
    token is a support token; utility at the first utility-token position. ``weights`` maps
    ``relevance``/``support``/``utility`` to their weights.
    """
    at_support = first_position(generated, token_ids, Group.SUPPORT)
    at_utility = first_position(generated, token_ids, Group.UTILITY)
    components = {
        "relevance": relevance_score(logprobs[0], token_ids) if logprobs else None,
        "support": None if at_support is None else support_score(_at(logprobs, at_support), token_ids),
        "utility": None if at_utility is None else utility_score(_at(logprobs, at_utility), token_ids),
    }
    total = sum(weights[name] * value for name, value in components.items() if value is not None)
    at_relevance = first_position(generated, token_ids, Group.RELEVANCE)
    return CandidateScore(
        relevance=components["relevance"],
        support=components["support"],
        utility=components["utility"],
        total=total,
        relevance_token=None if at_relevance is None else token_ids.token(int(generated[at_relevance])),
        support_token=None if at_support is None else token_ids.token(int(generated[at_support])),
        utility_token=None if at_utility is None else token_ids.token(int(generated[at_utility])),
        missing=tuple(name for name in COMPONENTS if components[name] is None),
    )


def with_retrieval(score: CandidateScore | None, rank: int, weight: float) -> CandidateScore | None:
    """``score`` with the retrieval component, ``1 / (1 + rank)`` for the passage's 0-based ``rank`` in its round's
    retrieval, added to the total at ``weight`` (``inference.weights.retrieval``); unchanged where the weight is 0."""
    if score is None or not weight:
        return score
    value = 1.0 / (1 + rank)
    return replace(score, retrieval=value, total=score.total + weight * value)


def _at(logprobs: Sequence[Mapping[int, float]], index: int) -> Mapping[int, float]:
    return logprobs[index] if index < len(logprobs) else {}
