"""The RL study's held-out sources: every arm trains without the left-out slices, and those slices' questions with
gold answers are all judged (not only their test splits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rl_loso
import rl_study
import yaml

from selfrag.config import from_dict
from selfrag.corpus import load_queries
from selfrag.data_gen.config import GenerateConfig

LEFT_OUT = ["nq-open", "retrievalqa"]


@pytest.mark.parametrize("arm", sorted(rl_loso.RECIPES))
def test_each_arm_keeps_every_source_but_the_left_out_ones(arm: str, tmp_path: Path) -> None:
    shipped = yaml.safe_load(rl_loso.RECIPES[arm].read_text(encoding="utf-8"))
    settings = rl_loso.data_recipe(rl_loso.RECIPES[arm], LEFT_OUT, tmp_path / "data")
    for key in ("more_passages", "more_queries", "more_answers"):
        kept = [Path(path) for path in settings[key]]
        assert all(path.is_file() for path in kept)
        assert not any(name in path.parts for path in kept for name in LEFT_OUT)
        assert len(kept) == len(shipped.get(key) or []) - sum(
            any(name in Path(path).parts for name in LEFT_OUT) for path in shipped.get(key) or [])
    assert any("hotpotqa" in Path(path).parts for path in settings["more_queries"])
    assert settings.get("answer_form") == shipped.get("answer_form")
    from_dict(GenerateConfig, settings)  # a valid generate config as written


def test_the_left_out_slices_are_judged_whole(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    arm.mkdir()
    splits = rl_loso.write_splits(tmp_path / "splits")
    assert sum(1 for _ in (splits / "test.jsonl").open()) == 60 and sum(1 for _ in (splits / "dev.jsonl").open()) == 12
    whole = rl_study.question_sets(splits, {"a": arm}, tmp_path / "whole", LEFT_OUT)
    tests_only = rl_study.question_sets(splits, {"a": arm}, tmp_path / "tests")
    for name in LEFT_OUT:
        queries = load_queries(rl_loso.SLICES / name / "queries.jsonl")
        judged = [json.loads(line) for line in whole[name][0].read_text(encoding="utf-8").splitlines()]
        assert len(judged) == sum(1 for q in queries if q.answers or not q.answerable) > 30
        assert 0 < sum(1 for _ in tests_only[name][0].open()) < len(judged) / 5
    assert set(whole) == {"quickstart", *LEFT_OUT}
