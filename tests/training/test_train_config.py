"""TrainConfig: typed fields, pass-through TRL/PEFT options checked against the real classes, errors together."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.training.config import TrainConfig

RECIPE = Path(__file__).parents[2] / "configs" / "train" / "smollm2-135m-cpu.yaml"
REQUIRED = {"model": "m", "records": "r.jsonl", "output_dir": "out"}


def test_recipe_loads_with_cpu_settings() -> None:
    config = load_config(TrainConfig, RECIPE, ["records=data.jsonl", "output_dir=runs/x"])
    assert config.model == "smollm2-135m-instruct"
    assert config.training.learning_rate == 1e-3 and config.lora.r == 16 and config.training.batch_size == 4
    assert config.tokens.strategy == "add" and config.records == Path("data.jsonl")
    assert config.training.order == "question"  # the study's arm N: a question's records contrasted in one batch


def test_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(
            TrainConfig,
            overrides=["training.learning_rate=-1", "trl.warmup_stepz=0.1", "peft.use_rslorra=true",
                       "trl.learning_rate=1e-4", "lora.dropout=1.5"],
            **REQUIRED,
        )
    problems = caught.value.problems
    assert "training.learning_rate must be > 0, got -1.0; try 1e-3 for a small model" in problems
    assert any("unknown trl option 'warmup_stepz'; did you mean trl.warmup_steps?" in p for p in problems)
    assert any("unknown peft option 'use_rslorra'; did you mean peft.use_rslora?" in p for p in problems)
    assert any("trl.learning_rate is set by this recipe; set training.learning_rate" in p for p in problems)
    assert any(p.startswith("lora.dropout must be in [0, 1)") for p in problems)
    assert len(problems) == 5


def test_required_fields_and_unknown_keys() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(TrainConfig, overrides=["training.learnig_rate=1e-3", "tokens.strategy=other"], model="m")
    text = str(caught.value)
    assert "records is required" in text and "output_dir is required" in text
    assert "did you mean 'training.learning_rate'" in text


def test_valid_pass_through_options_are_kept() -> None:
    config = load_config(TrainConfig, overrides=["trl.warmup_steps=0.1", "peft.use_rslora=true"], **REQUIRED)
    assert config.trl == {"warmup_steps": 0.1} and config.peft == {"use_rslora": True}


def test_full_fine_tuning_refuses_lora_only_settings() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(TrainConfig, overrides=["method=full", "quantization.load_in_4bit=true", "peft.use_rslora=true"],
                    **REQUIRED)
    problems = caught.value.problems
    assert any("method=full trains every weight and needs an unquantised base" in p for p in problems)
    assert any("peft options (use_rslora) apply to method=lora" in p for p in problems)
    assert load_config(TrainConfig, overrides=["method=full"], **REQUIRED).method == "full"
