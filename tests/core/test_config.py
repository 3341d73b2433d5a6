from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from selfrag.config import at_least_one, describe, help_field, load_config, to_dict, write_resolved
from selfrag.errors import ConfigError


@dataclass
class Optim:
    learning_rate: float = help_field("step size", 1e-3)
    steps: int = help_field("number of steps", 10)

    def validate(self) -> list[str]:
        if self.learning_rate <= 0:
            return [f"learning_rate must be > 0, got {self.learning_rate}; try 1e-3"]
        return []


@dataclass
class Example:
    output_dir: Path = help_field("where to write")
    mode: Literal["adaptive", "always"] = help_field("retrieval mode", "adaptive")
    optim: Optim = help_field("optimiser", default_factory=Optim)
    tags: list[str] = help_field("tags", default_factory=list)
    extra: dict[str, Any] = help_field("pass-through options", default_factory=dict)
    limit: int | None = help_field("cap", None)


def test_yaml_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("output_dir: out\noptim:\n  steps: 3\n")
    config = load_config(Example, path, ["optim.learning_rate=0.5", "tags=[a, b]", "limit=4", "extra.beta=2"])
    assert config.output_dir == Path("out") and config.optim.steps == 3 and config.optim.learning_rate == 0.5
    assert config.tags == ["a", "b"] and config.limit == 4 and config.extra == {"beta": 2}
    assert to_dict(config)["output_dir"] == "out"
    written = write_resolved(config, tmp_path / "run")
    assert load_config(Example, written) == config


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(
            Example, None, ["optim.learning_rat=1", "optim.steps=many", "mode=sometimes", "optim.learning_rate=-1"]
        )
    problems = caught.value.problems
    assert any("unknown config key 'optim.learning_rat'; did you mean 'optim.learning_rate'" in p for p in problems)
    assert any("optim.steps must be an integer, got 'many'" in p for p in problems)
    assert any("mode must be one of ['adaptive', 'always'], got 'sometimes'" in p for p in problems)
    assert any("output_dir is required" in p for p in problems)
    assert any("optim.learning_rate must be > 0" in p for p in problems)
    assert len(problems) == 5


def test_validate_messages_carry_the_prefix() -> None:
    with pytest.raises(ConfigError, match="optim.learning_rate must be > 0, got -1.0; try 1e-3"):
        load_config(Example, None, ["output_dir=x", "optim.learning_rate=-1"])


def test_at_least_one_names_each_count_below_one_where_the_configs_use_it() -> None:
    from selfrag.evaluation.config import EvalConfig
    from selfrag.inference.engines.options import EngineOptions
    from selfrag.inference.retrievers.index import IndexConfig
    from selfrag.rl.config import RLTrainingOptions, RolloutConfig

    assert at_least_one(RolloutConfig(depth=0, segment_tokens=-2), ("segment_tokens", "depth", "max_segments"),
                        "rollout.") == [
        "rollout.segment_tokens must be at least 1, got -2", "rollout.depth must be at least 1, got 0"]
    assert RolloutConfig(max_segments=0).validate() == ["max_segments must be at least 1, got 0"]
    assert RLTrainingOptions(save_steps=0).validate() == ["save_steps must be at least 1, got 0"]
    assert EngineOptions(batch_size=0, concurrency=0).validate("engine_options.") == [
        "engine_options.batch_size must be at least 1, got 0", "engine_options.concurrency must be at least 1, got 0"]
    assert IndexConfig(Path("c.jsonl"), "index", shard_size=0).validate() == ["shard_size must be at least 1, got 0"]
    with pytest.raises(ConfigError, match=r"^batch_size must be at least 1, got 0$"):
        load_config(EvalConfig, None, ["data=d.jsonl", "model=m", "output_dir=o", "batch_size=0"])


def test_missing_file_and_bad_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(Example, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(Example, None, ["output_dir"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Example, bad)


def test_describe_lists_help() -> None:
    lines = describe(Example)
    assert any(line.startswith("optim.learning_rate (float, 0.001): step size") for line in lines)
