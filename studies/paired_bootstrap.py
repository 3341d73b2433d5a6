"""Paired comparison of two trained models scored on the same held-out items (the study's ``compare``).

    python studies/judgement_study.py compare S-qs-order-300steps W-qs-order-rank1

The product scores one model (``selfrag.training.judgement``: AUROC with a bootstrap interval per model); whether
one recipe beats another on the same items is the study's question, answered here with a paired bootstrap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from selfrag.training.judgement import BOOTSTRAP, auroc


def pairwise_auroc(p: np.ndarray, n: np.ndarray) -> float:
    """AUROC by comparing every pair, ties counting one half: fast enough for a bootstrap of a few thousand items
    (the same value as ``selfrag.training.judgement.auroc``)."""
    return float(((p[:, None] > n[None, :]).sum() + 0.5 * (p[:, None] == n[None, :]).sum()) / (len(p) * len(n)))


def paired_auroc_difference(
    a: Mapping[str, Mapping[str, Any]],
    b: Mapping[str, Mapping[str, Any]],
    positive: str,
    negative: str,
    score: str = "s_rel",
    resamples: int = BOOTSTRAP,
    seed: int = 0,
) -> dict[str, Any]:
    """AUROC of two models scored on the *same* items, and a 95% paired-bootstrap interval of ``b - a``.

    ``a`` and ``b`` map an item id to its :func:`score_examples` row. The positives (``kind == positive``) and
    negatives (``kind == negative``) must be the same ids in both; each resample draws item indices once and
    scores both models on them, so the interval is of the difference, not two overlapping single intervals.
    ``p_not_better`` is the share of resamples where ``b`` is not above ``a``.
    """

    def ids(rows: Mapping[str, Mapping[str, Any]], kind: str) -> list[str]:
        return sorted(i for i, r in rows.items() if r.get("kind") == kind and r.get(score) is not None)

    pos_ids, neg_ids = ids(a, positive), ids(a, negative)
    if pos_ids != ids(b, positive) or neg_ids != ids(b, negative):
        raise ValueError(f"the two models were not scored on the same {positive}/{negative} items")
    if len(pos_ids) < 2 or len(neg_ids) < 2:
        raise ValueError(f"need at least 2 {positive} and 2 {negative} items, got {len(pos_ids)} and {len(neg_ids)}")

    def scores(rows: Mapping[str, Mapping[str, Any]], chosen: list[str]) -> np.ndarray:
        return np.asarray([float(rows[i][score]) for i in chosen], dtype=np.float64)

    pa, na, pb, nb = scores(a, pos_ids), scores(a, neg_ids), scores(b, pos_ids), scores(b, neg_ids)

    rng = np.random.default_rng(seed)
    differences = []
    for _ in range(resamples):
        i = rng.integers(0, len(pos_ids), len(pos_ids))
        j = rng.integers(0, len(neg_ids), len(neg_ids))
        differences.append(pairwise_auroc(pb[i], nb[j]) - pairwise_auroc(pa[i], na[j]))
    low, high = np.percentile(differences, [2.5, 97.5])
    value_a, value_b = auroc(pa.tolist(), na.tolist()), auroc(pb.tolist(), nb.tolist())
    return {
        "a": value_a,
        "b": value_b,
        "difference": value_b - value_a,
        "low": float(low),
        "high": float(high),
        "p_not_better": float(np.mean([d <= 0 for d in differences])),
        "n_pos": len(pos_ids),
        "n_neg": len(neg_ids),
    }
