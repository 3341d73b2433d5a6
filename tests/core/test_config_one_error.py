"""One wrong-typed value is one error line (issue 56): `training.max_steps=eight` also printed "num_decay_steps=0.2 is
a ratio of training.max_steps, which is not set", a check of the default that stood in for the refused value."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.config import from_dict
from selfrag.errors import ConfigError

REPO = Path(__file__).parents[2]


@dataclass
class Steps:
    max_steps: int = -1
    warmup_steps: int = 0


@dataclass
class Recipe:
    steps: Steps = field(default_factory=Steps)
    decay: float = 0.2
    steps_total: int = 0

    def validate(self) -> list[str]:
        problems = []
        if self.decay < 1 and self.steps.max_steps < 0:
            problems.append(f"decay={self.decay} is a ratio of steps.max_steps, which is not set")
        if self.steps_total < 0:
            problems.append("steps_total must be >= 0")
        return problems


def test_a_check_of_the_default_that_stood_in_is_not_reported() -> None:
    with pytest.raises(ConfigError) as error:
        from_dict(Recipe, {"steps": {"max_steps": "eight"}})
    assert error.value.problems == ["steps.max_steps must be an integer, got 'eight'; e.g. steps.max_steps=-1"]


def test_other_problems_are_still_reported_with_it() -> None:
    with pytest.raises(ConfigError) as error:
        from_dict(Recipe, {"steps": {"max_steps": "eight"}, "steps_total": -1})
    assert len(error.value.problems) == 2 and error.value.problems[1] == "steps_total must be >= 0"
    with pytest.raises(ConfigError) as error:  # a key that only starts like the refused one is another key
        from_dict(Recipe, {"steps": {"warmup_steps": "x"}})
    assert any("is a ratio of steps.max_steps" in problem for problem in error.value.problems)


def test_train_with_a_wrong_typed_max_steps_prints_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["train", "--config", str(REPO / "configs/train/smollm2-135m-cpu.yaml"), f"records={tmp_path}/r.jsonl",
                 f"output_dir={tmp_path}/out", "training.max_steps=eight"])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines() == [
        "selfrag train: error: training.max_steps must be an integer, got 'eight'; e.g. training.max_steps=-1"]
