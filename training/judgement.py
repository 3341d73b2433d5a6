"""Does the model *judge*? Relevance and support scores on held-out questions, with intervals.

    report = judge(model, examples, token_ids, items=300)
    # {"relevance": {"easy": {"auroc": 0.99, "low": 0.98, "high": 0.995, "accuracy": ..., "n_pos": 300, ...}}, ...}

The examples are encoded records of a held-out split (``selfrag generate split=test`` with easy, hard and
support negatives), teacher-forced in one forward pass each, in fp32. Per record:

- ``s_rel = p([Relevant]) / (p([Relevant]) + p([Irrelevant]))`` at its IsREL position;
- ``s_sup = (p(Full) + 0.5 p(Partial)) / (p(Full) + p(Partial) + p(No support))`` at its IsSUP position
  (the runtime's formulas: :mod:`selfrag.scores`, applied here to tensors).

Relevance AUROC: gold passages (``meta.kind == "gold"``) against each negative kind -- ``easy`` (another
article), ``hard`` (same article, no answer), ``distractor`` (BM25 top-k), ``own-passage`` (an unanswerable
question's own paragraph). Support AUROC: the gold passage with its own answer against the same passage with
another question's answer of the same form (``support-negative``), so the answer's shape gives nothing away.
Intervals: 95% percentile bootstrap (1,000 resamples of each class, seeded). Accuracy: the argmax within the
token group equals the label, per class. Also: per-type teacher-forced accuracy with confusion matrices over
every scored position of the selected records.

Items are chosen by a stable hash of the question id, the same questions for every class, so two runs are
scored on the same items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from selfrag import reflection as rf
from selfrag.fsutil import write_json
from selfrag.logits import logits_at
from selfrag.reflection import Group, ReflectionIds
from selfrag.scores import first_of_two_terms, support_terms
from selfrag.splits import stable_hash
from selfrag.training.dataset import SCORED_GROUPS, reflection_positions
from selfrag.training.shortcuts import StepShortcuts

RELEVANCE_NEGATIVES = ("easy", "hard", "article", "erased", "distractor", "own-passage")
SUPPORT_NEGATIVE = "support-negative"
BOOTSTRAP = 1000


def auroc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(score of a random positive > a random negative), ties counting one half (Mann-Whitney U / n1 n2)."""
    pos = np.asarray(positive, dtype=np.float64)
    neg = np.asarray(negative, dtype=np.float64)
    if not len(pos) or not len(neg):
        return float("nan")
    scores = np.concatenate([pos, neg])
    order = scores.argsort(kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks over ties
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def _pairwise_auroc(p: np.ndarray, n: np.ndarray) -> float:
    """:func:`auroc` vectorised for the bootstrap: compares every pair (n <= a few thousand)."""
    return float(((p[:, None] > n[None, :]).sum() + 0.5 * (p[:, None] == n[None, :]).sum()) / (len(p) * len(n)))


def auroc_interval(
    positive: Sequence[float], negative: Sequence[float], resamples: int = BOOTSTRAP, seed: int = 0
) -> tuple[float, float]:
    """95% percentile-bootstrap interval of :func:`auroc` (each class resampled with replacement)."""
    pos = np.asarray(positive, dtype=np.float64)
    neg = np.asarray(negative, dtype=np.float64)
    if len(pos) < 2 or len(neg) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        p = pos[rng.integers(0, len(pos), len(pos))]
        n = neg[rng.integers(0, len(neg), len(neg))]
        values.append(_pairwise_auroc(p, n))
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def select_items(examples: Sequence[Mapping[str, Any]], items: int) -> list[Mapping[str, Any]]:
    """At most ``items`` records per kind, from the same questions (stable hash order of the question id)."""
    by_query: dict[str, list[Mapping[str, Any]]] = {}
    for example in examples:
        by_query.setdefault(str(example.get("query_id", example["id"])), []).append(example)
    chosen: list[Mapping[str, Any]] = []
    taken: dict[str, int] = {}
    for query_id in sorted(by_query, key=stable_hash):
        for example in by_query[query_id]:
            kind = str(example.get("kind"))
            if taken.get(kind, 0) < items:
                taken[kind] = taken.get(kind, 0) + 1
                chosen.append(example)
    return chosen


@torch.no_grad()
def score_examples(
    model: Any, examples: Sequence[Mapping[str, Any]], token_ids: ReflectionIds, batch_size: int = 16
) -> list[dict[str, Any]]:
    """Per example: s_rel, s_sup (None where absent), and per-group (label, predicted) at each scored position.

    Examples run in right-padded batches of similar length (positions count from the start, so padding at
    the end changes no score).
    """
    device = next(model.parameters()).device
    rel = torch.tensor(token_ids.ids(Group.RELEVANCE), device=device)  # Relevant, Irrelevant
    sup = torch.tensor(token_ids.ids(Group.SUPPORT), device=device)  # Full, Partial, No support
    group_ids = {group: torch.tensor(token_ids.ids(group), device=device) for group in SCORED_GROUPS}
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    rows: list[dict[str, Any] | None] = [None] * len(examples)
    # the trained reflection rows read in place, without PEFT's copy of the whole vocabulary matrix a batch
    with StepShortcuts(model, rows=True, dropout=False).on():
        _score_batches(model, examples, order, rows, batch_size, token_ids, (rel, sup, group_ids, device))
    return [row for row in rows if row is not None]


def _score_batches(model: Any, examples: Sequence[Mapping[str, Any]], order: list[int],
                   rows: list[dict[str, Any] | None], batch_size: int, token_ids: ReflectionIds, ids_of: Any) -> None:
    rel, sup, group_ids, device = ids_of
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            batch = [examples[i] for i in order[start : start + batch_size]]
            width = max(len(e["input_ids"]) for e in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long, device=device)
            mask = torch.zeros((len(batch), width), dtype=torch.long, device=device)
            for row_number, example in enumerate(batch):
                ids[row_number, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
                mask[row_number, : len(example["input_ids"])] = 1
            # Logits only at the positions that predict a reflection token (not batch x length x vocab).
            positions = [reflection_positions(dict(example), token_ids) for example in batch]
            keep = torch.zeros((len(batch), width), dtype=torch.bool, device=device)
            for row_number, example_positions in enumerate(positions):
                for group_positions in example_positions.values():
                    keep[row_number, [position - 1 for position in group_positions]] = True
            kept = logits_at(model, {"input_ids": ids, "attention_mask": mask}, keep)[0].float()
            # before[row][position]: the logits that predict the token at ``position`` of that row
            before: list[dict[int, torch.Tensor]] = [{} for _ in batch]
            for k, (r, c) in enumerate(keep.nonzero().tolist()):
                before[r][c + 1] = kept[k]
            for row_number, (index, example) in enumerate(zip(order[start : start + batch_size], batch, strict=True)):
                example_positions = positions[row_number]
                logits_before = before[row_number].__getitem__
                row: dict[str, Any] = {"id": example.get("id"), "kind": example.get("kind"), "s_rel": None}
                row["s_sup"] = None
                if example_positions[Group.RELEVANCE]:
                    row["s_rel"] = _score(first_of_two_terms, logits_before(example_positions[Group.RELEVANCE][0]), rel)
                if example_positions[Group.SUPPORT]:
                    row["s_sup"] = _score(support_terms, logits_before(example_positions[Group.SUPPORT][0]), sup)
                row["pairs"] = {
                    group.value: [
                        (int(example["labels"][position]), int(ids_t[logits_before(position)[ids_t].argmax()]))
                        for position in group_positions
                    ]
                    for group, group_positions in example_positions.items()
                    for ids_t in (group_ids[group],)
                }
                rows[index] = row
    finally:
        model.train(was_training)


def _score(terms: Any, logits: torch.Tensor, group: torch.Tensor) -> float:
    """One formula of :mod:`selfrag.scores` on the group's probabilities (a softmax over its logits: the same ratio
    as over the whole vocabulary's, without the vocabulary)."""
    numerator, denominator = terms(torch.softmax(logits[group].float(), dim=-1))
    return float(numerator / denominator)


def _binary(positive: list[float], negative: list[float], seed: int) -> dict[str, Any]:
    low, high = auroc_interval(positive, negative, seed=seed)
    return {
        "auroc": auroc(positive, negative),
        "low": low,
        "high": high,
        "accuracy_pos": float(np.mean([s > 0.5 for s in positive])) if positive else None,
        "accuracy_neg": float(np.mean([s <= 0.5 for s in negative])) if negative else None,
        "n_pos": len(positive),
        "n_neg": len(negative),
    }


def summarise(rows: Sequence[Mapping[str, Any]], token_ids: ReflectionIds, seed: int = 0) -> dict[str, Any]:
    """AUROC/accuracy per negative kind, support AUROC, per-type accuracy and confusion matrices."""
    gold_rel = [r["s_rel"] for r in rows if r["kind"] == "gold" and r["s_rel"] is not None]
    relevance = {}
    for kind in RELEVANCE_NEGATIVES:
        negative = [r["s_rel"] for r in rows if r["kind"] == kind and r["s_rel"] is not None]
        if negative:
            relevance[kind] = _binary(gold_rel, negative, seed)
    gold_sup = [r["s_sup"] for r in rows if r["kind"] == "gold" and r["s_sup"] is not None]
    wrong_sup = [r["s_sup"] for r in rows if r["kind"] == SUPPORT_NEGATIVE and r["s_sup"] is not None]
    support = _binary(gold_sup, wrong_sup, seed) if gold_sup and wrong_sup else {}
    accuracy: dict[str, Any] = {}
    confusion: dict[str, Any] = {}
    for group in SCORED_GROUPS:
        names = list(rf.tokens_of(group))
        matrix = {label: dict.fromkeys(names, 0) for label in names}
        total = correct = 0
        for row in rows:
            for label, predicted in row["pairs"].get(group.value, []):
                label_token, predicted_token = token_ids.token(label), token_ids.token(predicted)
                if label_token is None or predicted_token is None:
                    continue
                matrix[label_token][predicted_token] += 1
                total += 1
                correct += int(label == predicted)
        accuracy[group.value] = correct / total if total else None
        confusion[group.value] = {label: counts for label, counts in matrix.items() if sum(counts.values())}
    return {"relevance": relevance, "support": support, "accuracy": accuracy, "confusion": confusion}


def judge(
    model: Any, examples: Sequence[Mapping[str, Any]], token_ids: ReflectionIds, items: int, seed: int = 0
) -> dict[str, Any]:
    """Score ``items`` questions' records of each kind and summarise (see the module docstring)."""
    rows = score_examples(model, select_items(examples, items), token_ids)
    return summarise(rows, token_ids, seed)


def headline(report: Mapping[str, Any]) -> dict[str, float | None]:
    """The few numbers worth a log line: relevance AUROC easy/hard, support AUROC, IsREL accuracy."""
    relevance, support = report.get("relevance", {}), report.get("support", {})
    return {
        "rel_auroc_easy": relevance.get("easy", {}).get("auroc"),
        "rel_auroc_hard": relevance.get("hard", {}).get("auroc"),
        "sup_auroc": support.get("auroc"),
        "rel_accuracy": report.get("accuracy", {}).get("relevance"),
        "sup_accuracy": report.get("accuracy", {}).get("support"),
    }


def write_report(path: Path, report: Mapping[str, Any]) -> Path:
    write_json(path, report)
    return path


def plot(path: Path, losses: Sequence[Mapping[str, float]], during: Sequence[Mapping[str, Any]]) -> Path | None:
    """Training loss and held-out judgement (AUROC, IsREL accuracy) against the step, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency; keep training usable without it
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if losses:
        left.plot([e["step"] for e in losses], [e["loss"] for e in losses], color="tab:blue")
    left.set_xlabel("step")
    left.set_ylabel("training loss")
    left.set_title("loss")
    for key, label in (
        ("rel_auroc_easy", "relevance AUROC (easy)"),
        ("rel_auroc_hard", "relevance AUROC (hard)"),
        ("sup_auroc", "support AUROC"),
        ("rel_accuracy", "IsREL accuracy"),
    ):
        points = [(e["step"], e["judgement"][key]) for e in during if e.get("judgement", {}).get(key) is not None]
        if points:
            right.plot(*zip(*points, strict=True), marker="o", label=label)
    for kind in ("relevance", "support"):  # the held-out split's reflection accuracy (training.eval_fraction)
        points = [(e["step"], e["reflection_accuracy"][kind]) for e in during
                  if isinstance(e.get("reflection_accuracy", {}).get(kind), float)]
        if points:
            right.plot(*zip(*points, strict=True), marker="s", linestyle="--", label=f"held-out {kind} accuracy")
    right.set_ylim(0.0, 1.02)
    right.set_xlabel("step")
    right.set_title("held-out judgement")
    if right.get_lines():
        right.legend(loc="lower right", fontsize=8)
    else:
        right.text(0.5, 0.5, "no held-out records\n(training.eval_fraction, eval_records)", ha="center",
                   va="center", transform=right.transAxes)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
