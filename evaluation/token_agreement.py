"""Reflection-token agreement: the trained model's verdicts, teacher-forced, against gold labels.

For each labelled item and type, one decode step after the gold prefix (the paper's trajectory layout):

* retrieve: ``prompt`` -> p_retrieve;
* relevance: ``prompt [Retrieval]<paragraph>…</paragraph>`` -> s_rel;
* support: ``… [Relevant or gold] {answer}`` -> s_sup;
* utility: ``… [support or gold]`` (or ``prompt [No Retrieval] {answer}`` without a passage) -> s_use.

The predicted token is the argmax within the type's group; the score is the runtime's score of that type. The runtime
does not act on the relevance argmax but on ``score >= relevance_threshold`` (the model's calibrated cut); given that
threshold, :func:`agreement` reports the relevance verdicts at it too (``relevance.at_threshold``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from selfrag import reflection as rf
from selfrag.inference.engines.base import Engine, GenerationRequest
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


def _prefix(engine: Engine, item: LabelExample, kind: str) -> tuple[int, ...]:
    tokenizer, ids = engine.tokenizer, engine.token_ids
    prompt = list(encode_prompt(tokenizer, item.question, engine.prompt_template))
    if kind == "retrieve":
        return tuple(prompt)
    if item.passage is None:  # utility without a passage
        return (*prompt, ids.id(rf.NO_RETRIEVAL), *encode_text(tokenizer, item.answer))
    prefix = prompt + passage_ids(tokenizer, ids, item.passage)
    if kind == "relevance":
        return tuple(prefix)
    prefix += [ids.id(item.labels.get("relevance", rf.RELEVANT)), *encode_text(tokenizer, item.answer)]
    if kind == "support":
        return tuple(prefix)
    return (*prefix, ids.id(item.labels.get("support", rf.FULLY_SUPPORTED)))


def predict(engine: Engine, items: Sequence[LabelExample]) -> list[dict[str, Any]]:
    """One row per (item, labelled type): gold, predicted token, score. One engine call for all."""
    ids = engine.token_ids
    jobs = [(item, kind) for item in items for kind in LABEL_GROUPS if kind in item.labels]
    requests = [GenerationRequest(prompt_ids=_prefix(engine, item, kind), max_tokens=1,
                                  score_token_ids=ids.all_ids) for item, kind in jobs]
    generations = engine.generate(requests) if requests else []
    rows = []
    for (item, kind), generation in zip(jobs, generations, strict=True):
        logprobs: Mapping[int, float] = generation.score_logprobs[0] if generation.score_logprobs else {}
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
