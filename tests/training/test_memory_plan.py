"""training.memory_plan: gradient checkpointing and the micro-batch from the memory estimate, each boundary tested
on both sides (the 8B shape, 2048-token examples, 16 examples an optimizer step, cards sized to the estimates)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from selfrag.errors import ConfigError
from selfrag.training.memory import SHAPES, Setup, estimate_memory
from selfrag.training.plan import BatchPlan, labelled_share, plan_batch, plan_run

SHAPE = SHAPES["meta-llama/Llama-3.1-8B-Instruct"]
SETUP = Setup(batch_size=4, max_length=2048)
STEP = 16  # batch_size 4 x gradient_accumulation_steps 4


def card_for(micro_batch: int, checkpointing: bool) -> float:
    """The smallest card (GB) that holds this micro-batch: the estimate plus the 5% that fits() leaves free."""
    setup = replace(SETUP, batch_size=micro_batch, gradient_checkpointing=checkpointing)
    return estimate_memory(SHAPE, setup).total_gb / 0.95


def just(card_gb: float, side: str) -> float:
    return card_gb * (1 + 1e-9) if side == "fits" else card_gb * (1 - 1e-6)


def chosen(card_gb: float, keep: bool = False) -> tuple[int, int, bool]:
    plan = plan_batch(SHAPE, SETUP, card_gb, STEP, keep_micro_batch=keep)
    return plan.micro_batch, plan.accumulation, plan.checkpointing


def test_the_estimates_order_the_way_the_boundaries_assume() -> None:
    assert card_for(16, True) < card_for(4, False)  # checkpointing holds 16 where 4 without it needs more
    assert card_for(4, False) < card_for(8, False) < card_for(16, False)


def test_checkpointing_is_off_exactly_where_the_configured_micro_batch_fits_without_it() -> None:
    assert chosen(just(card_for(4, False), "fits")) == (4, 4, False)
    # one byte short: 2 fits without checkpointing, but 16 with it, so checkpointing comes on with the larger batch
    assert chosen(just(card_for(4, False), "short")) == (16, 1, True)


def test_the_largest_micro_batch_that_fits_without_checkpointing() -> None:
    assert chosen(just(card_for(8, False), "fits")) == (8, 2, False)
    assert chosen(just(card_for(8, False), "short")) == (4, 4, False)
    assert chosen(just(card_for(16, False), "fits")) == (16, 1, False)


def test_the_largest_micro_batch_that_fits_with_checkpointing() -> None:
    assert chosen(just(card_for(16, True), "fits")) == (16, 1, True)
    assert chosen(just(card_for(16, True), "short")) == (8, 2, True)


def test_a_kept_micro_batch_only_chooses_checkpointing_and_a_card_too_small_is_refused() -> None:
    assert chosen(just(card_for(4, False), "fits"), keep=True) == (4, 4, False)
    assert chosen(just(card_for(4, False), "short"), keep=True) == (4, 4, True)
    assert chosen(just(card_for(4, True), "fits"), keep=True) == (4, 4, True)
    with pytest.raises(ConfigError, match="even with gradient checkpointing"):
        chosen(just(card_for(4, True), "short"), keep=True)
    with pytest.raises(ConfigError, match="micro-batch 1 of 2048 tokens"):
        chosen(just(card_for(1, True), "short"))


def test_the_plan_is_printed_and_applied_to_the_trainer_settings(tmp_path: Path) -> None:
    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.trainer import sft_options

    plan = BatchPlan(8, 2, False, 60.2, 139.8)
    assert plan.line() == ("memory plan: micro-batch 8 x 2 accumulation, gradient checkpointing off "
                           "(estimate 60.2 GB of a 139.8 GB card)")
    config = load_config(TrainConfig, model="m", records="r.jsonl", output_dir=str(tmp_path),
                         trl={"gradient_checkpointing": True})
    options = sft_options(config, tmp_path / "checkpoints", plan)
    assert (options["per_device_train_batch_size"], options["gradient_accumulation_steps"],
            options["gradient_checkpointing"]) == (8, 2, False)
    assert sft_options(config, tmp_path / "checkpoints")["gradient_checkpointing"] is True
    assert plan_run(config, None, [], "reserved") is None  # memory_plan off (the default)


def test_labelled_share_is_measured_on_the_examples() -> None:
    assert labelled_share([{"labels": [-100, -100, 5, 6]}, {"labels": [-100, 7]}]) == pytest.approx(0.5)


def test_plan_run_reads_the_card_and_the_models_shape(prepared, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import torch

    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.memory import GB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=24 * GB))
    config = load_config(TrainConfig, model="m", records="r.jsonl", output_dir=str(tmp_path),
                         training={"memory_plan": True, "batch_size": 2, "gradient_accumulation_steps": 3})
    plan = plan_run(config, prepared[0], [{"input_ids": [1] * 300, "labels": [-100] * 200 + [5] * 100}], "add")
    assert plan == BatchPlan(6, 1, False, plan.estimate_gb, 24.0)  # the tiny model fits the whole step
