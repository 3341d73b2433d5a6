"""The leave-one-source-out arms: arm ``-S`` trains on the mixed-source recipe with none of S's questions, passages
or answers, and keeps every other source; arm ``all`` is the recipe as shipped."""

from __future__ import annotations

import json
from pathlib import Path

import leave_one_source_out as loso
import pytest
import yaml


def _files(settings: dict[str, object]) -> list[str]:
    keys = ("passages", "queries", "answers", "more_passages", "more_queries", "more_answers")
    paths: list[str] = []
    for key in keys:
        value = settings.get(key)
        paths += [str(v) for v in value] if isinstance(value, list) else [] if value is None else [str(value)]
    return paths


def test_all_is_the_shipped_recipe(tmp_path: Path) -> None:
    shipped = yaml.safe_load(loso.RECIPE.read_text(encoding="utf-8"))
    settings = loso.arm_recipe("all", tmp_path / "data")
    assert settings["more_queries"] == [loso.REPO / p for p in shipped["more_queries"]]
    assert settings["limit"] == shipped["limit"] and settings["output"] == tmp_path / "data"


@pytest.mark.parametrize("source", ["hotpotqa", "nq-open", "retrievalqa", "begin"])
def test_leaving_a_slice_out_removes_its_files_only(source: str, tmp_path: Path) -> None:
    everything = _files(loso.arm_recipe("all", tmp_path / "all"))
    left = _files(loso.arm_recipe(f"-{source}", tmp_path / "left"))
    assert not [p for p in left if f"/slices/{source}/" in p]
    assert sorted(p for p in everything if f"/slices/{source}/" not in p) == sorted(left)


def test_leaving_squad_out_keeps_the_no_retrieval_questions(tmp_path: Path) -> None:
    settings = loso.arm_recipe("-squad", tmp_path / "arm" / "data")
    kept = [json.loads(line) for line in Path(settings["queries"]).read_text(encoding="utf-8").splitlines()]
    assert kept and {q["meta"]["source"] for q in kept} == {"gsm8k", "general"}
    assert settings["answers"] is None and settings["limit"] is None
    assert not [p for p in _files(settings) if "/demo/corpus" in p or "answers-sentences.jsonl" in p and "/demo/" in p]


def test_an_unknown_arm_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown arm '-wiki'"):
        loso.arm_recipe("-wiki", tmp_path)
