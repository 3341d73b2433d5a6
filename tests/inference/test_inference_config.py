"""InferenceConfig: defaults, YAML recipe, validation messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.inference.ask import AskConfig
from selfrag.inference.config import InferenceConfig
from selfrag.inference.server.config import ServeConfig

RECIPE = Path(__file__).parents[2] / "configs" / "inference" / "default.yaml"


ASK = ["model=m", "retriever.corpus=c.jsonl"]


def test_recipe_equals_defaults() -> None:
    """configs/inference/default.yaml lists every runtime setting as the inference section of every command."""
    assert load_config(AskConfig, RECIPE, ASK).inference == InferenceConfig()
    assert load_config(ServeConfig, RECIPE, ASK).inference == InferenceConfig()


def test_overrides_and_nested_weights() -> None:
    overrides = ["inference.threshold=0.3", "inference.weights.utility=0", "inference.on_unsupported=flag"]
    config = load_config(AskConfig, RECIPE, [*ASK, *overrides]).inference
    assert config.threshold == 0.3 and config.weights.utility == 0.0 and config.on_unsupported == "flag"


def test_problems_name_field_value_and_fix() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(InferenceConfig, None, ["threshold=1.5", "top_k=0", "mode=sometimes", "weights.suport=1"])
    message = str(error.value)
    assert "threshold must be in [0, 1], got 1.5; use mode=always" in message
    assert "top_k must be at least 1, got 0" in message
    assert "mode must be one of" in message
    assert "did you mean 'weights.support'" in message


CALIBRATION = {"threshold": 0.9, "relevance_threshold": 0.7, "support_bound": 0.3}


def test_unset_settings_take_the_calibration_and_set_ones_are_kept_even_at_the_built_in_value() -> None:
    assert InferenceConfig().threshold is None  # unset is None, not "equal to the default"
    resolved = InferenceConfig().resolved(CALIBRATION)
    assert (resolved.threshold, resolved.relevance_threshold, resolved.support_bound) == (0.9, 0.7, 0.3)
    # The built-in values given explicitly (a config, a command line, a request) are the user's: kept.
    explicit = InferenceConfig(threshold=0.2, relevance_threshold=0.5, support_bound=0.0).resolved(CALIBRATION)
    assert (explicit.threshold, explicit.relevance_threshold, explicit.support_bound) == (0.2, 0.5, 0.0)
    mixed = load_config(AskConfig, RECIPE, [*ASK, "inference.relevance_threshold=0.5"]).inference.resolved(CALIBRATION)
    assert (mixed.threshold, mixed.relevance_threshold, mixed.support_bound) == (0.9, 0.5, 0.3)


def test_without_calibration_or_with_it_turned_off_the_built_in_values_apply() -> None:
    for config, calibration in ((InferenceConfig(), None), (InferenceConfig(use_calibration=False), CALIBRATION)):
        resolved = config.resolved(calibration)
        assert (resolved.threshold, resolved.relevance_threshold, resolved.support_bound) == (0.2, 0.5, 0.0)
    unresolved = InferenceConfig()
    assert (unresolved.retrieve_threshold, unresolved.relevance_cut, unresolved.support_floor) == (0.2, 0.5, 0.0)
    odd = InferenceConfig().resolved({"threshold": float("nan"), "relevance_threshold": True, "support_bound": "x"})
    assert (odd.threshold, odd.relevance_threshold, odd.support_bound) == (0.2, 0.5, 0.0)


def test_the_recipes_leave_the_calibrated_settings_unset() -> None:
    serve = Path(__file__).parents[2] / "configs" / "serve" / "default.yaml"
    import yaml

    for path, section in ((RECIPE, None), (serve, "inference")):
        data = yaml.safe_load(path.read_text())
        data = data[section] if section else data
        assert all(data.get(name) is None for name in ("threshold", "relevance_threshold", "support_bound")), path


def test_a_removed_option_is_named_with_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """engine_options.legacy_decode (the first hf decode, a benchmark's baseline) is no user option any more: a config
    that sets it is told so in one line, not 'unknown key'."""
    with pytest.raises(ConfigError) as error:
        load_config(InferenceConfig, None, ["engine_options.legacy_decode=true"])
    [problem] = error.value.problems
    assert problem.startswith("engine_options.legacy_decode was removed: ") and "delete the key" in problem
    from selfrag.app.cli import main

    argv = ["ask", f"model={tmp_path}", f"retriever.corpus={tmp_path}", "q", "inference.engine_options.legacy_decode=1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "engine_options.legacy_decode was removed" in err[0]
