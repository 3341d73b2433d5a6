"""The training variants the GPU check can run (``--train-variants``): each one's settings load on the 8B recipe,
and the command line offers exactly those. A variant that failed to load would cost a lent GPU's call."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_modules import repo_module

from selfrag.config import load_config
from selfrag.training.config import TrainConfig

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "train" / "llama-3.1-8b-instruct-lora.yaml"


@pytest.fixture(scope="module")
def modules():  # type: ignore[no-untyped-def]
    with repo_module("benchmarks", "gpu_random_init") as random_init, repo_module("benchmarks", "gpu_check") as check:
        yield random_init, check


def test_every_variant_loads_on_the_8b_recipe(modules) -> None:  # type: ignore[no-untyped-def]
    random_init, _ = modules
    for name, overrides in random_init.TRAIN_VARIANTS.items():
        config = load_config(TrainConfig, RECIPE, ["records=r.jsonl", "output_dir=out", *overrides])
        if "no-dropout" in name:
            assert config.lora.dropout == 0
        assert config.training.memory_plan == ("plan" in name), name
        assert config.training.lora_input_cast == ("always" if name == "lora-cast" else "auto"), name
        assert config.training.attention_kernels == (["flash", "efficient"] if name == "flash-attention" else [])


def test_the_command_line_offers_the_variants_there_are(modules) -> None:  # type: ignore[no-untyped-def]
    random_init, check = modules
    args = check.parse_args(["--random-init", "--train-variants", *random_init.TRAIN_VARIANTS])
    assert args.train_variants == list(random_init.TRAIN_VARIANTS)
    with pytest.raises(SystemExit):
        check.parse_args(["--random-init", "--train-variants", "no-such-variant"])
