"""The recipe-seeds study: every arm is the quickstart's recipe with valid overrides, and the table marks each figure
below its aim and counts the seeds that meet every aim."""

from __future__ import annotations

from pathlib import Path

import pytest
import recipe_seeds as study

from selfrag.config import load_config
from selfrag.training.config import TrainConfig


@pytest.mark.parametrize("arm", sorted(study.ARMS))
def test_each_arm_is_a_valid_training_config(arm: str, tmp_path: Path) -> None:
    overrides = [f"records={tmp_path / 'r.jsonl'}", f"output_dir={tmp_path / arm}", "training.seed=2",
                 *study.COMMON, *study.ARMS[arm][1]]
    config = load_config(TrainConfig, study.REPO / study.RECIPE, overrides)
    assert config.training.seed == 2 and config.eval_records is None
    steps = {"fp32-150": 150, "bf16-300": 300, "top15-300": 300, "top10-300": 300, "top15-200": 200,
             "top15-300-fp32": 300}
    assert config.training.max_steps == steps[arm]
    assert config.lora.layers == {"top15-300": 15, "top10-300": 10, "top15-200": 15, "top15-300-fp32": 15}.get(arm)
    assert config.training.bf16 is (arm not in ("fp32-150", "top15-300-fp32"))


def _row(arm: str, seed: int, easy: float, article: float, support: float, well_formed: float) -> dict[str, object]:
    return {"arm": arm, "seed": seed, "easy": easy, "article": article, "hard": 0.8, "support": support,
            "well_formed": well_formed, "train_s": 400.0}


def test_the_table_marks_figures_below_their_aims_and_counts_seeds_meeting_every_aim() -> None:
    rows = [_row("top15-300", 0, 0.97, 0.96, 1.0, 0.92), _row("top15-300", 1, 0.99, 0.92, 1.0, 0.9),
            _row("bf16-300", 0, 0.96, 0.95, 0.99, 0.97)]
    text = study.table(rows)
    lines = text.splitlines()
    assert "| top15-300 | 0 | 0.970 | 0.960 | 0.800 | 1.000 | 0.920 | 400 |" in lines
    assert "| top15-300 | 1 | 0.990 | **0.920** | 0.800 | 1.000 | 0.900 | 400 |" in lines
    assert "| bf16-300 | 0 | **0.960** | 0.950 | 0.800 | 0.990 | 0.970 | 400 |" in lines
    assert "| top15-300 | 2 | 0.980 | 0.940 | 1.000 | 0.910 | 1/2 |" in lines  # mean of each; seed 1 misses one aim
    assert "| bf16-300 | 1 | 0.960 | 0.950 | 0.990 | 0.970 | 0/1 |" in lines
    assert lines.index("| bf16-300 | 0 | **0.960** | 0.950 | 0.800 | 0.990 | 0.970 | 400 |") < lines.index(
        "| top15-300 | 0 | 0.970 | 0.960 | 0.800 | 1.000 | 0.920 | 400 |")  # arms in the study's order


def test_support_is_read_from_the_scored_items_as_the_judgement_reads_it() -> None:
    from selfrag.training.judgement import summarise

    rows = {f"{kind}-{i}": {"kind": kind, "s_sup": score, "s_rel": 0.5, "pairs": {}}
            for kind, scores in (("gold", [0.9, 0.8, 0.4]), ("support-negative", [0.3, 0.5, 0.1]), ("easy", [0.2]))
            for i, score in enumerate(scores)}
    rows["gold-x"] = {"kind": "gold", "s_sup": None, "s_rel": 0.5, "pairs": {}}  # no IsSUP position: left out
    expected = summarise(list(rows.values()), token_ids=None)["support"]["auroc"]  # type: ignore[arg-type]
    assert study._support(rows) == expected == 8 / 9
    assert study._support({"easy-0": rows["easy-0"]}) is None
