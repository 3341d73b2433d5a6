"""Metrics, as pure functions over per-example records (no model, no engine): each is tested on hand-made data.

* ``match``: a normalised gold string occurs in the normalised answer (the Self-RAG paper's metric);
  ``accuracy``: exact match for QA (``match`` for the paper's PopQA/TriviaQA files), the chosen label for a
  closed set, the true/false verdict for a claim;
  ``f1``: SQuAD's token F1 against the best gold (QA only): partial credit for a span that overlaps the gold.
* reflection agreement: accuracy and a confusion matrix per type, AUROC of each type's score;
* unsupported-claim rate, abstain rate on unanswerable and false-abstain rate on answerable questions, the share
  of answers that hedge (reported, not zeroed),
  retrieval and re-retrieval rates, engine calls and tokens per query, latency p50/p95.

A rate over no items is ``None`` (shown ``n/a``), never 0.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(" " if c in string.punctuation else c for c in text.lower())
    return " ".join(_ARTICLES.sub(" ", text).split())


def match(answer: str, golds: Iterable[str]) -> bool:
    """A gold answer occurs in the answer, after normalisation (the paper's ``match``)."""
    normalized = f" {normalize(answer)} "
    return any(normalize(gold) and f" {normalize(gold)} " in normalized for gold in golds)


def token_f1(answer: str, golds: Iterable[str]) -> float:
    """SQuAD's token F1 of the normalised answer against each normalised gold, the best one (0 without golds)."""
    predicted = normalize(answer).split()
    best = 0.0
    for gold in golds:
        truth = normalize(gold).split()
        common = sum(min(predicted.count(t), truth.count(t)) for t in set(predicted) & set(truth))
        if common:
            precision, recall = common / len(predicted), common / len(truth)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def exact_match(answer: str, golds: Iterable[str]) -> bool:
    return any(normalize(answer) == normalize(gold) for gold in golds)


def choice_prediction(answer: str, choices: Sequence[tuple[str, str]]) -> str | None:
    """The label an answer picks: a leading label (``B``, ``B.``, ``(B)``), else the one choice text it contains."""
    labels = [label for label, _ in choices]
    head = re.match(r"\W*(?:the answer is\s*)?\(?([A-Za-z0-9]{1,2})\)?(?:[.):\s]|$)", answer.strip(), re.IGNORECASE)
    if head and head.group(1).upper() in [label.upper() for label in labels]:
        return next(label for label in labels if label.upper() == head.group(1).upper())
    found = [label for label, text in choices if normalize(text) and match(answer, [text])]
    return found[0] if len(found) == 1 else None


def claim_prediction(answer: str) -> str | None:
    """``true``/``false`` from the first verdict word of an answer (yes/correct count as true)."""
    for word in normalize(answer).split():
        if word in ("true", "yes", "correct", "supported"):
            return "true"
        if word in ("false", "no", "incorrect", "wrong", "refuted"):
            return "false"
    return None


def is_correct(record: Mapping[str, Any]) -> bool:
    """Accuracy of one record by its kind (qa: exact match; choice: label; claim: verdict)."""
    kind, answer, golds = record["kind"], record["answer"], record["gold_answers"]
    if kind == "choice":
        return choice_prediction(answer, [tuple(c) for c in record["choices"]]) == record["answer_key"]
    if kind == "claim":
        return claim_prediction(answer) == golds[0]
    return match(answer, golds) if record.get("metric") == "match" else exact_match(answer, golds)


def rate(count: float, total: int) -> float | None:
    return count / total if total else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def auroc(scores: Sequence[float], positives: Sequence[bool]) -> float | None:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties count one half.

    None when either class is empty (the area is undefined).
    """
    pos = [s for s, p in zip(scores, positives, strict=True) if p]
    neg = [s for s, p in zip(scores, positives, strict=True) if not p]
    if not pos or not neg:
        return None
    # rank-sum (Mann-Whitney U) with average ranks for ties: O(n log n)
    ordered = sorted((s, p) for s, p in zip(scores, positives, strict=True))
    rank_sum, index = 0.0, 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1][0] == ordered[index][0]:
            end += 1
        average = (index + end) / 2 + 1
        rank_sum += average * sum(1 for k in range(index, end + 1) if ordered[k][1])
        index = end + 1
    u = rank_sum - len(pos) * (len(pos) + 1) / 2
    return u / (len(pos) * len(neg))


def confusion_matrix(gold: Sequence[str], predicted: Sequence[str | None], labels: Sequence[str]) -> dict[str, Any]:
    """``{"labels", "matrix"}``: ``matrix[i][j]`` counts gold ``labels[i]`` predicted ``labels[j]``; a last
    column counts items with no prediction (the model emitted none of the type's tokens)."""
    index = {label: i for i, label in enumerate(labels)}
    matrix = [[0] * (len(labels) + 1) for _ in labels]
    for g, p in zip(gold, predicted, strict=True):
        matrix[index[g]][index[p] if p in index else len(labels)] += 1
    return {"labels": list(labels), "columns": [*labels, "none"], "matrix": matrix}


def reflection_agreement(
    items: Sequence[Mapping[str, Any]], labels: Sequence[str], positive: set[str]
) -> dict[str, Any]:
    """Agreement of predicted with gold tokens for one type; AUROC of the score against ``gold in positive``.

    Each item: ``{"gold": token, "predicted": token or None, "score": float or None}``.
    """
    gold = [item["gold"] for item in items]
    predicted = [item["predicted"] for item in items]
    scored = [item for item in items if item["score"] is not None]
    return {
        "items": len(items),
        "accuracy": rate(sum(g == p for g, p in zip(gold, predicted, strict=True)), len(items)),
        "confusion": confusion_matrix(gold, predicted, labels),
        "auroc": auroc([item["score"] for item in scored], [item["gold"] in positive for item in scored]),
        "positive": sorted(positive),
    }


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every mode-level figure over one mode's per-example records (see :mod:`selfrag.evaluation.run`)."""
    answerable = [r for r in records if r["answerable"]]
    answerable_qa = [r for r in answerable if r.get("kind", "qa") == "qa"]
    unanswerable = [r for r in records if not r["answerable"]]
    judged = [c for r in records if not r["abstained"] for c in r.get("claims", []) if c["supported"] is not None]
    seconds = [r["seconds"] for r in records]
    retrieved = [r for r in records if r["retrieved"]]
    decided = [r for r in records if r.get("needs_retrieval") is not None]
    n = len(records)
    return {
        "examples": n,
        "answerable": len(answerable),
        "unanswerable": len(unanswerable),
        "match": rate(sum(match(r["answer"], r["gold_answers"]) for r in answerable if not r["abstained"]),
                      len(answerable)),
        "accuracy": rate(sum(is_correct(r) for r in answerable if not r["abstained"]), len(answerable)),
        # an abstention scores 0, as a wrong answer does; over answerable QA questions only
        "f1": rate(sum(token_f1(r["answer"], r["gold_answers"]) for r in answerable_qa if not r["abstained"]),
                   len(answerable_qa)),
        "unsupported_claim_rate": rate(sum(not c["supported"] for c in judged), len(judged)),
        "claims_judged": len(judged),
        "abstain_rate_unanswerable": rate(sum(r["abstained"] for r in unanswerable), len(unanswerable)),
        # answered as if the passages held the answer: neither abstained nor flagged (the runtime cannot know that a
        # question is unanswerable; its verdicts can only say so). Records without the flag count as unflagged.
        "unflagged_rate_unanswerable": rate(
            sum(not r["abstained"] and not r.get("low_confidence") for r in unanswerable), len(unanswerable)),
        "false_abstain_rate": rate(sum(r["abstained"] for r in answerable), len(answerable)),
        # answers that hedge ("I don't know ...") without the abstain sentence: judged by their text like any answer
        "hedged_rate": rate(sum(bool(r.get("hedged")) for r in records), n),
        "retrieval_rate": rate(len(retrieved), n),
        "retrieve_decision_accuracy": rate(sum(r["retrieved"] == r["needs_retrieval"] for r in decided), len(decided)),
        "re_retrieval_rate": rate(sum(r.get("retrieval_rounds", 0) > 1 for r in records), n),
        "engine_calls_per_query": rate(sum(r["engine_calls"] for r in records), n),
        "prompt_tokens_per_query": rate(sum(r["prompt_tokens"] for r in records), n),
        # records kept by a run before this figure existed count their whole prompts
        "prompt_tokens_computed_per_query": rate(
            sum(r.get("prompt_tokens_computed", r["prompt_tokens"]) for r in records), n),
        "generated_tokens_per_query": rate(sum(r["generated_tokens"] for r in records), n),
        "latency_p50": percentile(seconds, 50),
        "latency_p95": percentile(seconds, 95),
        "seconds_total": sum(seconds),
    }
