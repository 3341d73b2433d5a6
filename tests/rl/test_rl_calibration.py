"""``selfrag rl`` keeps the start model's calibration marked as measured on it, and says to calibrate again
(issue #56: the RL output used to drop it without a word)."""

from __future__ import annotations

from pathlib import Path

from selfrag.artifacts import ModelMeta
from selfrag.reflection import ReflectionIds
from selfrag.rl.run import RLResult, carried_calibration, measured_on

CALIBRATION = {"threshold": 0.3, "relevance_threshold": 0.4, "support_bound": 0.1, "measured": {"re_retrieved": 2}}
HISTORY = [{"step": 1.0, "reward": 0.1}, {"step": 2.0, "reward": 0.2}]


def test_the_calibration_is_kept_and_marked_with_the_model_it_was_measured_on(tmp_path: Path) -> None:
    carried = carried_calibration(CALIBRATION, tmp_path / "sft")
    assert carried == {**CALIBRATION, "measured_on": str(tmp_path / "sft")}
    # carried again by a second RL run: it still names the model it was measured on
    assert carried_calibration(carried, tmp_path / "rl")["measured_on"] == str(tmp_path / "sft")  # type: ignore[index]
    assert carried_calibration(None, tmp_path / "sft") is None


def test_measured_on_names_only_a_carried_calibration(token_ids: ReflectionIds) -> None:
    def meta(calibration: dict | None) -> ModelMeta:  # type: ignore[type-arg]
        return ModelMeta(token_ids, "add", "auto", "base", "adapter", calibration)

    assert measured_on(meta({**CALIBRATION, "measured_on": "runs/sft"})) == "runs/sft"
    assert measured_on(meta(CALIBRATION)) is None  # measured on this model by selfrag calibrate
    assert measured_on(meta(None)) is None and measured_on(None) is None


def test_the_summary_says_in_one_line_to_calibrate_the_rl_model(tmp_path: Path) -> None:
    out = tmp_path / "rl"
    carried = RLResult(out, HISTORY, 3, None, calibration_from="runs/sft").summary()
    plain = RLResult(out, HISTORY, 3, None).summary()
    assert carried.startswith(plain + "\n") and carried.count("\n") == plain.count("\n") + 1
    line = carried.splitlines()[-1]
    assert "runs/sft" in line and f"selfrag calibrate model={out}" in line
    assert "calibrat" not in plain
    finished = RLResult(out, HISTORY, 3, None, already_trained=True, calibration_from="runs/sft").summary()
    assert "already trained" in finished and finished.splitlines()[-1] == line
