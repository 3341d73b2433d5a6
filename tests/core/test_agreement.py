"""Cohen's kappa, Wilson's interval and the bootstrap interval against hand computations."""

from __future__ import annotations

import random

import pytest

from selfrag.agreement import agreement, bootstrap_kappa, cohen_kappa, wilson_interval

TEACHER = ["R", "R", "R", "I", "I", "R"]
HUMAN = ["R", "I", "R", "I", "R", "R"]


def test_kappa_matches_the_hand_computation() -> None:
    # p_o = 4/6; both raters say R 4 times and I 2 times: p_e = (4*4 + 2*2) / 36 = 5/9
    # kappa = (2/3 - 5/9) / (1 - 5/9) = (1/9) / (4/9) = 0.25
    assert cohen_kappa(TEACHER, HUMAN) == pytest.approx(0.25)


def test_kappa_of_perfect_and_of_systematic_disagreement() -> None:
    assert cohen_kappa(["a", "b", "a"], ["a", "b", "a"]) == pytest.approx(1.0)
    assert cohen_kappa(["a", "b", "a", "b"], ["b", "a", "b", "a"]) == pytest.approx(-1.0)


def test_kappa_is_undefined_when_chance_agreement_is_one() -> None:
    assert cohen_kappa(["a", "a"], ["a", "a"]) is None
    assert cohen_kappa([], []) is None
    result = agreement(["a", "a"], ["a", "a"])
    assert result.kappa is None and result.kappa_interval is None and result.accuracy == 1.0


def test_kappa_matches_scikit_learn_where_installed() -> None:
    metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is not installed")
    rng = random.Random(3)
    first = [rng.choice("abc") for _ in range(50)]
    second = [label if rng.random() < 0.6 else rng.choice("abc") for label in first]
    assert cohen_kappa(first, second) == pytest.approx(metrics.cohen_kappa_score(first, second))


def test_wilson_interval_matches_the_published_values() -> None:
    low, high = wilson_interval(8, 10)  # 8/10 at 95%: 0.4902 .. 0.9433
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 0) is None
    assert wilson_interval(5, 5)[1] == 1.0  # type: ignore[index]


def test_bootstrap_interval_is_seeded_and_holds_the_estimate() -> None:
    first, second = TEACHER * 5, HUMAN * 5
    interval = bootstrap_kappa(first, second, seed=1)
    assert interval == bootstrap_kappa(first, second, seed=1)
    assert interval is not None and interval[0] < 0.25 < interval[1]
    assert interval != bootstrap_kappa(first, second, seed=2)


def test_unequal_lengths_and_bad_level_are_errors() -> None:
    with pytest.raises(ValueError, match="same items"):
        cohen_kappa(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="level"):
        agreement(["a"], ["a"], level=95)
