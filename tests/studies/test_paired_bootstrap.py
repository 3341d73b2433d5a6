"""The study's paired bootstrap (studies/paired_bootstrap.py; moved with it from selfrag.training.judgement)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from paired_bootstrap import paired_auroc_difference, pairwise_auroc

from selfrag.training.judgement import auroc, auroc_interval


def test_paired_auroc_difference() -> None:
    rng = random.Random(1)
    rows_a: dict[str, dict[str, object]] = {}
    rows_b: dict[str, dict[str, object]] = {}
    for n in range(150):
        noise = rng.gauss(0.0, 1.0)
        rows_a[f"g{n}"] = {"kind": "gold", "s_rel": 0.5 + noise}  # a: gold and negatives drawn alike -> ~0.5
        rows_b[f"g{n}"] = {"kind": "gold", "s_rel": 2.0 + noise}  # b: the same items, gold moved up -> near 1
        other = rng.gauss(0.0, 1.0)
        rows_a[f"h{n}"] = {"kind": "hard", "s_rel": 0.5 + other}
        rows_b[f"h{n}"] = {"kind": "hard", "s_rel": other}
    rows_a["x"] = {"kind": "hard", "s_rel": None}  # unscored rows are left out of both sides alike
    rows_b["x"] = {"kind": "hard", "s_rel": None}
    result = paired_auroc_difference(rows_a, rows_b, "gold", "hard")
    assert result["n_pos"] == result["n_neg"] == 150
    assert result["a"] == auroc([r["s_rel"] for r in rows_a.values() if r["kind"] == "gold"],  # type: ignore[misc]
                                [r["s_rel"] for r in rows_a.values() if r["kind"] == "hard" and r["s_rel"] is not None])
    assert result["difference"] == result["b"] - result["a"] > 0.3
    assert 0 < result["low"] < result["difference"] < result["high"] and result["p_not_better"] == 0.0
    # the same model against itself: a zero-width interval at 0, never "better"
    same = paired_auroc_difference(rows_a, rows_a, "gold", "hard")
    assert same["difference"] == same["low"] == same["high"] == 0.0 and same["p_not_better"] == 1.0
    # pairing is what tells a small, consistent gain apart: gold moved up a little on the same items gives
    # single-model intervals that overlap, yet a paired interval above 0 (every resample can only gain)
    rows_c = {i: {**r, "s_rel": r["s_rel"] + 0.2} if r["kind"] == "gold" else r for i, r in rows_a.items()}  # type: ignore[operator]

    def single(rows: dict[str, dict[str, object]]) -> tuple[float, float]:
        gold = [float(r["s_rel"]) for r in rows.values() if r["kind"] == "gold"]  # type: ignore[arg-type]
        hard = [float(r["s_rel"]) for r in rows.values() if r["kind"] == "hard" and r["s_rel"] is not None]  # type: ignore[arg-type]
        return auroc_interval(gold, hard)

    assert single(rows_c)[0] < single(rows_a)[1]
    small = paired_auroc_difference(rows_a, rows_c, "gold", "hard")
    assert 0 < small["low"] < small["difference"] < 0.15 and small["p_not_better"] < 0.025
    # different items on the two sides are refused, not silently compared
    del rows_b["h3"]
    with pytest.raises(ValueError, match="not scored on the same gold/hard items"):
        paired_auroc_difference(rows_a, rows_b, "gold", "hard")


def test_pairwise_auroc_is_the_product_auroc() -> None:
    rng = random.Random(2)
    pos = [round(rng.gauss(1.0, 1.0), 1) for _ in range(60)]  # rounded: ties on both sides count one half
    neg = [round(rng.gauss(0.0, 1.0), 1) for _ in range(50)]
    assert pairwise_auroc(np.asarray(pos), np.asarray(neg)) == pytest.approx(auroc(pos, neg), abs=1e-12)
