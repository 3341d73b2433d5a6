"""The judgement study's arms as data (studies/judgement_arms.yaml) resolve to what the in-code arms did.

``arms_before_move.json`` was computed once from the in-code ``ARMS``/``COMMON``/``RECIPES`` of
benchmarks/judgement_study.py before the arms moved to YAML: per arm, its recipe and
``apply_overrides({}, COMMON + overrides)`` (the settings it sets on top of its recipe, later overrides winning).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from judgement_arms import ArmsFileError, load_arms

from selfrag.config import apply_overrides, load_config
from selfrag.training.config import TrainConfig
from selfrag.training.judgement import select_items

REPO = Path(__file__).resolve().parents[2]
PINNED = json.loads((Path(__file__).with_name("arms_before_move.json")).read_text(encoding="utf-8"))


def test_every_arm_resolves_to_its_settings_before_the_move() -> None:
    arms = load_arms()
    assert sorted(arms) == sorted(PINNED)
    for name, arm in arms.items():
        resolved = {"recipe": arm.recipe, "settings": apply_overrides({}, arm.overrides_in_order())}
        assert resolved == PINNED[name], name


def test_every_arm_builds_a_valid_train_config(tmp_path: Path) -> None:
    for name, arm in load_arms().items():
        config = load_config(TrainConfig, REPO / arm.recipe, [*arm.overrides_in_order(), f"output_dir={tmp_path}"])
        assert config.training.max_steps == PINNED[name]["settings"]["training"]["max_steps"], name


def test_an_arm_runs_selfrag_train_with_its_recipe_then_common_then_own_overrides() -> None:
    from judgement_study import RUNS, train_command

    arm = load_arms()["X-full-rank1-1000steps"]
    command = train_command(arm)
    assert command[:6] == [sys.executable, "-m", "selfrag.app.cli", "train", "--config",
                           "configs/train/smollm2-135m-cpu-full.yaml"]
    assert command[6] == f"output_dir={RUNS / arm.name}"
    assert command[7:] == [*arm.common, *arm.overrides]
    assert arm.common[-1] == "training.relevance_rank=0" and "training.relevance_rank=1" in arm.overrides


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("recipe: r.yaml\ncommon: []\narms:\n  Z:\n    question: q\n    overides: [a=1]\n", "arms.Z"),
        ("recipe: r.yaml\ncommon: []\narms:\n  Z:\n    question: q\n    overrides: [max_steps]\n", "arms.Z.overrides"),
        ("recipe: r.yaml\narms: {}\n", "top-level keys"),
    ],
)
def test_a_malformed_arms_file_is_one_line_naming_the_arm_and_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "arms.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ArmsFileError) as caught:
        load_arms(path)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_the_table_rebuilt_without_runs_keeps_every_row_of_the_written_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import judgement_table

    monkeypatch.setattr(judgement_table, "RUNS", tmp_path / "no-runs-here")
    written = judgement_table.TABLE.read_text(encoding="utf-8")
    rebuilt = judgement_table.table(load_arms())
    assert sorted(rebuilt.splitlines()) == sorted(written.splitlines())
    assert "| A-baseline | 150 | 2301 (shared, old loss) |" in rebuilt


def test_the_probe_takes_questions_in_the_order_the_study_selects_them() -> None:
    from relevance_probe import stable_order

    ids = [f"q{i}" for i in range(40)]
    chosen = select_items([{"id": f"{q}-gold", "query_id": q, "kind": "gold"} for q in ids], 15)
    assert [row["query_id"] for row in chosen] == sorted(ids, key=stable_order)[:15]
