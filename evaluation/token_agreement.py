"""Reflection-token agreement: the trained model's verdicts, teacher-forced, against gold labels.

For each labelled item and type, one decode step after the gold prefix (the paper's trajectory layout):

* retrieve: ``prompt`` -> p_retrieve;
* relevance: ``prompt [Retrieval]<paragraph>…</paragraph>`` -> s_rel;
* support: ``… [Relevant or gold] {answer}`` -> s_sup;
* utility: ``… [support or gold]`` (or ``prompt [No Retrieval] {answer}`` without a passage) -> s_use.

Each type's prefix is a prefix of the item's one record, so an engine that scores prefixes (the hf engine:
:class:`~selfrag.inference.engines.base.PrefixScorer`) reads them all from one forward pass per item; any other
engine gets one one-token decode per prefix.

The predicted token is the argmax within the type's group; the score is the runtime's score of that type. The runtime
does not act on the relevance argmax but on ``score >= relevance_threshold`` (the model's calibrated cut); given that
threshold, :func:`agreement` reports the relevance verdicts at it too (``relevance.at_threshold``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from selfrag import reflection as rf
from selfrag.inference.engines.base import Engine, GenerationRequest, PrefixScorer, PrefixScoreRequest
from selfrag.inference.scoring import relevance_score, retrieve_probability, support_score, utility_score
from selfrag.prompting import encode_prompt, encode_text, passage_ids
from selfrag.reflection import Group

from .data import LABEL_GROUPS, LabelExample
from .metrics import reflection_agreement

POSITIVE = {
    "retrieve": {rf.RETRIEVAL},
    "relevance": {rf.RELEVANT},
    "support": {rf.FULLY_SUPPORTED},
    "utility": {"[Utility:4]", "[Utility:5]"},
}
_SCORES = {
    "retrieve": retrieve_probability,
    "relevance": relevance_score,
    "support": support_score,
    "utility": utility_score,
}


#: an item's record and the length of each type's prefix in it
Record = tuple[tuple[int, ...], dict[str, int]]


def _record(engine: Engine, item: LabelExample) -> Record:
    """The item's gold record up to its utility position, and the length of each type's prefix in it: every type's
    prefix is a prefix of this one record (without a passage: the prompt, then ``[No Retrieval] {answer}``)."""
    tokenizer, ids = engine.tokenizer, engine.token_ids
    record = list(encode_prompt(tokenizer, item.question, engine.prompt_template))
    ends = {"retrieve": len(record)}
    if item.passage is None:  # only retrieve and utility are labelled without a passage (data.py checks)
        record += [ids.id(rf.NO_RETRIEVAL), *encode_text(tokenizer, item.answer)]
    else:
        record += passage_ids(tokenizer, ids, item.passage)
        ends["relevance"] = len(record)
        record += [ids.id(item.labels.get("relevance", rf.RELEVANT)), *encode_text(tokenizer, item.answer)]
        ends["support"] = len(record)
        record.append(ids.id(item.labels.get("support", rf.FULLY_SUPPORTED)))
    ends["utility"] = len(record)
    return tuple(record), ends


def _teacher_forced(engine: PrefixScorer, records: Sequence[Record], kinds: Sequence[list[str]],
                    score_ids: tuple[int, ...]) -> list[dict[int, float]]:
    """Each item's labelled types read from one forward pass over its record, up to its last labelled prefix."""
    requests = []
    for (record, ends), labelled in zip(records, kinds, strict=True):
        lengths = tuple(ends[kind] for kind in labelled)
        requests.append(PrefixScoreRequest(record[: max(lengths)], lengths, score_ids))
    scored = engine.score_prefixes(requests) if requests else []
    return [logprobs for per_item in scored for logprobs in per_item]


def _decoded(engine: Engine, records: Sequence[Record], kinds: Sequence[list[str]],
             score_ids: tuple[int, ...]) -> list[dict[int, float]]:
    """One one-token decode per (item, labelled type), all in one engine call (an engine that is no PrefixScorer)."""
    requests = [GenerationRequest(prompt_ids=record[: ends[kind]], max_tokens=1, score_token_ids=score_ids)
                for (record, ends), labelled in zip(records, kinds, strict=True) for kind in labelled]
    generations = engine.generate(requests) if requests else []
    return [dict(generation.score_logprobs[0]) if generation.score_logprobs else {} for generation in generations]


def predict(engine: Engine, items: Sequence[LabelExample]) -> list[dict[str, Any]]:
    """One row per (item, labelled type): gold, predicted token, score. An engine that scores prefixes (the hf engine)
    reads all of an item's types from one forward pass over its record; another gets one one-token decode per row,
    all in one engine call."""
    ids = engine.token_ids
    items = [item for item in items if any(kind in item.labels for kind in LABEL_GROUPS)]
    kinds = [[kind for kind in LABEL_GROUPS if kind in item.labels] for item in items]
    records = [_record(engine, item) for item in items]
    if isinstance(engine, PrefixScorer):
        scores = iter(_teacher_forced(engine, records, kinds, ids.all_ids))
    else:
        scores = iter(_decoded(engine, records, kinds, ids.all_ids))
    rows = []
    for item, labelled in zip(items, kinds, strict=True):
        for kind in labelled:
            logprobs: Mapping[int, float] = next(scores)
            group = rf.tokens_of(LABEL_GROUPS[kind])
            present = [(logprobs[ids.id(token)], token) for token in group if ids.id(token) in logprobs]
            rows.append({
                "id": item.id,
                "type": kind,
                "gold": item.labels[kind],
                "predicted": max(present)[1] if present else None,
                "score": _SCORES[kind](logprobs, ids),
            })
    return rows


def agreement(rows: Sequence[Mapping[str, Any]], relevance_threshold: float | None = None) -> dict[str, Any]:
    """Per type: accuracy, confusion matrix and AUROC (see :func:`selfrag.evaluation.metrics.reflection_agreement`);
    with ``relevance_threshold``, relevance's ``at_threshold``: the same for the verdict the runtime acts on."""
    result = {}
    for kind, group in LABEL_GROUPS.items():
        items = [row for row in rows if row["type"] == kind]
        if items:
            result[kind] = reflection_agreement(items, rf.tokens_of(group), POSITIVE[kind])
    relevance = [row for row in rows if row["type"] == "relevance"]
    if relevance and relevance_threshold is not None:
        verdicts = [{**row, "predicted": None if row["score"] is None else
                     (rf.RELEVANT if row["score"] >= relevance_threshold else rf.IRRELEVANT)} for row in relevance]
        at = reflection_agreement(verdicts, rf.tokens_of(LABEL_GROUPS["relevance"]), POSITIVE["relevance"])
        result["relevance"]["at_threshold"] = {"threshold": relevance_threshold, "accuracy": at["accuracy"],
                                               "confusion": at["confusion"]}
    return result


__all__ = ["POSITIVE", "Group", "agreement", "predict"]
