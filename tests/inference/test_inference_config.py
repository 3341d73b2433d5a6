"""InferenceConfig: defaults, YAML recipe, validation messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.inference.config import InferenceConfig

RECIPE = Path(__file__).parents[2] / "configs" / "inference" / "default.yaml"


def test_recipe_equals_defaults() -> None:
    assert load_config(InferenceConfig, RECIPE) == InferenceConfig()


def test_overrides_and_nested_weights() -> None:
    config = load_config(InferenceConfig, RECIPE, ["threshold=0.3", "weights.utility=0", "on_unsupported=flag"])
    assert config.threshold == 0.3 and config.weights.utility == 0.0 and config.on_unsupported == "flag"


def test_problems_name_field_value_and_fix() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(InferenceConfig, None, ["threshold=1.5", "top_k=0", "mode=sometimes", "weights.suport=1"])
    message = str(error.value)
    assert "threshold must be in [0, 1], got 1.5; use mode=always" in message
    assert "top_k must be at least 1, got 0" in message
    assert "mode must be one of" in message
    assert "did you mean 'weights.support'" in message
