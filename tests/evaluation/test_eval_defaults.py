"""`selfrag eval`'s defaults: the prompted-critic mode (~18 s a question on 2 CPU cores) runs only when listed, and
an estimate is printed before a run."""

from __future__ import annotations

from pathlib import Path

from selfrag.config import load_config
from selfrag.evaluation.config import EvalConfig
from selfrag.evaluation.run import estimate

REPO = Path(__file__).parents[2]


def test_prompted_runs_only_when_listed() -> None:
    config = load_config(EvalConfig, None, ["data=d.jsonl", "model=m", "output_dir=o"])
    assert config.modes == ["no_retrieval", "plain_rag", "single_pass"]
    demo = load_config(EvalConfig, REPO / "configs/eval/demo.yaml", ["model=m", "output_dir=o"])
    assert "prompted" not in demo.modes
    listed = load_config(EvalConfig, None, ["data=d.jsonl", "model=m", "output_dir=o", "modes=[prompted]"])
    assert listed.modes == ["prompted"]


def test_the_estimate_names_the_cost_before_a_long_run() -> None:
    config = load_config(EvalConfig, None, ["data=d.jsonl", "model=m", "output_dir=o", "inference.max_tokens=48"])
    line = estimate(config, 500)
    assert line.startswith("estimate: 500 questions x 3 modes, up to ~31 min on 2 CPU cores")
    assert "add prompted to modes" in line
    config.modes = ["prompted", "single_pass"]
    line = estimate(config, 500)
    assert "prompted ~2.5 h" in line and "up to ~2.7 h" in line and "add prompted" not in line
