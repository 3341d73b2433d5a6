"""Agreement between two raters (the teacher and a human reviewer): accuracy, Cohen's kappa and their intervals.

    result = agreement(["[Relevant]", "[Irrelevant]"], ["[Relevant]", "[Relevant]"], seed=0)
    result.kappa, result.kappa_interval, result.accuracy_interval

Cohen's kappa is ``(p_o - p_e) / (1 - p_e)``: the observed agreement ``p_o`` corrected by the agreement
``p_e`` two raters with the same label frequencies would reach by chance. It is undefined (None) when
``p_e == 1`` (both raters gave one and the same label throughout). Its interval is a percentile bootstrap
over the items (``resamples`` draws, seeded, so a report is reproducible); a resample whose kappa is
undefined is left out. The accuracy interval is Wilson's score interval (analytic).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class Agreement:
    """Two raters over the same ``count`` items."""

    count: int
    agreed: int
    accuracy: float | None  # observed agreement p_o; None without items
    accuracy_interval: tuple[float, float] | None  # Wilson score interval at ``level``
    kappa: float | None  # None: undefined (no items, or chance agreement is 1)
    kappa_interval: tuple[float, float] | None  # percentile bootstrap at ``level``; None when undefined
    level: float


def cohen_kappa(first: Sequence[str], second: Sequence[str]) -> float | None:
    """Cohen's kappa of two label sequences of equal length; None when it is undefined."""
    if len(first) != len(second):
        raise ValueError(f"the two raters must label the same items: got {len(first)} and {len(second)} labels")
    count = len(first)
    if count == 0:
        return None
    observed = sum(a == b for a, b in zip(first, second, strict=True)) / count
    first_counts, second_counts = Counter(first), Counter(second)
    chance = sum(first_counts[label] * second_counts[label] for label in first_counts) / count**2
    if chance >= 1.0:
        return None
    return (observed - chance) / (1.0 - chance)


def wilson_interval(successes: int, count: int, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson's score interval for a proportion; None without trials."""
    if count == 0:
        return None
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / count
    denominator = 1 + z * z / count
    centre = (p + z * z / (2 * count)) / denominator
    half = z * math.sqrt(p * (1 - p) / count + z * z / (4 * count * count)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_kappa(first: Sequence[str], second: Sequence[str], level: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of Cohen's kappa over items; None when fewer than two resamples define it."""
    count = len(first)
    if count == 0:
        return None
    labels = sorted(set(first) | set(second))
    code = {label: index for index, label in enumerate(labels)}
    a = np.array([code[label] for label in first])
    b = np.array([code[label] for label in second])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, count, size=(resamples, count))  # (resamples, count) item indices
    kappas = []
    for row in picks:
        value = _kappa_codes(a[row], b[row], len(labels))
        if value is not None:
            kappas.append(value)
    if len(kappas) < 2:
        return None
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(kappas, [tail, 100 - tail])
    return float(low), float(high)


def agreement(first: Sequence[str], second: Sequence[str], level: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> Agreement:
    """Accuracy with Wilson's interval and Cohen's kappa with a bootstrap interval."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}; use 0.95 for 95% intervals")
    kappa = cohen_kappa(first, second)
    agreed = sum(a == b for a, b in zip(first, second, strict=True))
    count = len(first)
    return Agreement(
        count=count,
        agreed=agreed,
        accuracy=agreed / count if count else None,
        accuracy_interval=wilson_interval(agreed, count, level),
        kappa=kappa,
        kappa_interval=None if kappa is None else bootstrap_kappa(first, second, level, resamples, seed),
        level=level,
    )


def _kappa_codes(a: np.ndarray, b: np.ndarray, labels: int) -> float | None:
    count = len(a)
    observed = float(np.mean(a == b))
    chance = float(np.dot(np.bincount(a, minlength=labels), np.bincount(b, minlength=labels))) / count**2
    if chance >= 1.0:
        return None
    return (observed - chance) / (1.0 - chance)
