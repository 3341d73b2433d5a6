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


def test_serving_rows_count_the_tokens_a_question_after_the_warm_up() -> None:
    """gpu_vllm's rows: a p50 says little where random weights stop at random, so each row has the tokens generated
    and the engine calls a question, counted over the timed calls only (the warm-up's are dropped)."""
    from selfrag.evaluation.counting import Usage

    with repo_module("benchmarks", "gpu_vllm") as gpu_vllm:
        class Counter:
            def __init__(self) -> None:
                self.usage = Usage()

            def reset(self) -> Usage:
                usage, self.usage = self.usage, Usage()
                return usage

        counted = Counter()

        def run(batch: list[str]) -> None:  # each question: 2 calls, 10 tokens
            counted.usage.calls += 2 * len(batch)
            counted.usage.generated_tokens += 10 * len(batch)

        row = gpu_vllm.timed_batches(run, [f"q{index}" for index in range(6)], 4, counted)
    assert row["questions"] == 6 and row["generated_tokens_per_question"] == 10.0
    assert row["engine_calls_per_question"] == 2.0
