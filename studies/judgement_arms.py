"""The judgement study's arms, read from ``studies/judgement_arms.yaml`` (data, not code).

    python -c "import judgement_arms; print(sorted(judgement_arms.load_arms()))"   # from studies/

An arm is one ``selfrag train`` run: its recipe, the study's common overrides, then its own overrides, in that order
(a later ``key=value`` wins). :func:`Arm.overrides_in_order` is exactly what ``judgement_study.py run`` passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
ARMS_FILE = Path(__file__).resolve().with_name("judgement_arms.yaml")
RUNS = REPO / "runs" / "study"
LOGS = REPO / "runs" / "study-logs"
ARM_KEYS = {"question", "recipe", "overrides", "timing_note"}


class ArmsFileError(ValueError):
    """The arms file is malformed: the message names the file, the arm, the field and the fix."""


@dataclass(frozen=True)
class Arm:
    """One arm: what it tests, the recipe it starts from, and its overrides (after the study's common ones)."""

    name: str
    question: str
    recipe: str
    common: tuple[str, ...]
    overrides: tuple[str, ...]
    timing_note: str | None = None

    def overrides_in_order(self) -> list[str]:
        """The common overrides, then the arm's own: what ``selfrag train`` receives after ``--config recipe``."""
        return [*self.common, *self.overrides]


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) and "=" in item for item in value):
        raise ArmsFileError(f"{where} must be a list of key=value strings, got {value!r}; "
                            "e.g. [training.max_steps=150]")
    return tuple(value)


def load_arms(path: Path = ARMS_FILE) -> dict[str, Arm]:
    """Every arm of ``path``, in file order; a malformed file raises :class:`ArmsFileError` in one line."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or set(data) != {"recipe", "common", "arms"}:
        raise ArmsFileError(f"{path}: expected the top-level keys recipe, common and arms, "
                            f"got {sorted(data) if isinstance(data, dict) else data!r}")
    common = _strings(data["common"], f"{path}: common")
    arms: dict[str, Arm] = {}
    for name, entry in (data["arms"] or {}).items():
        where = f"{path}: arms.{name}"
        if not isinstance(entry, dict) or not {"question", "overrides"} <= set(entry) or set(entry) - ARM_KEYS:
            raise ArmsFileError(f"{where} must hold question and overrides (optional: recipe, timing_note), "
                                f"got {sorted(entry) if isinstance(entry, dict) else entry!r}")
        arms[str(name)] = Arm(name=str(name), question=str(entry["question"]),
                              recipe=str(entry.get("recipe", data["recipe"])), common=common,
                              overrides=_strings(entry["overrides"], f"{where}.overrides"),
                              timing_note=entry.get("timing_note"))
    return arms


def held_out_records(path: Path = ARMS_FILE) -> str:
    """The held-out articles' records every arm is judged on (the common ``eval_records=`` override)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    found = [item.split("=", 1)[1] for item in data["common"] if item.startswith("eval_records=")]
    if not found:
        raise ArmsFileError(f"{path}: common has no eval_records=...; add eval_records=runs/data-test/records.jsonl")
    return found[-1]
