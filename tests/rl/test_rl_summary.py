"""What ``selfrag rl`` prints when it ends: the step time leaves out the first step, which starts the rollout engine."""

from __future__ import annotations

from pathlib import Path

from selfrag.rl.run import RLResult, step_clock


def _row(step: int, seconds: float, rollout: float) -> dict[str, float]:
    return {"step": step, "reward": 0.0, "step_seconds": seconds, "rollout_seconds": rollout}


def test_the_first_step_which_starts_vllm_is_left_out_of_the_mean() -> None:
    # the lent H200, 2026-11-30: vLLM's start (compile, CUDA graphs) fell in step 1's rollouts
    rows = [_row(1, 86.66, 85.14), _row(2, 2.14, 1.33), _row(3, 1.96, 1.21)]
    line = step_clock(rows)
    assert line.startswith("2.0 s a step, 1.3 s of it decoding rollouts")
    assert "the first took 86.7 s" in line
    summary = RLResult(Path("out"), rows, questions=4, resumed_from=None).summary()
    assert "2.0 s a step" in summary and "30." not in summary  # not the mean with the start in it (30.3 s)


def test_one_logged_step_says_it_includes_the_warm_up() -> None:
    line = step_clock([_row(1, 5.0, 4.0)])
    assert line == "5.0 s a step, 4.0 s of it decoding rollouts (one logged step, with the warm-up)"
