"""Two levers from the profile of an 8B training step on a lent H200 (2026-11-30, results/gpu.md): PEFT's cast of
each LoRA input to fp32 skipped under bf16 autocast (``training.lora_input_cast``), and the attention backends a
step may use (``training.attention_kernels``). Both change how a step computes, not what it computes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_train_run import make_config

from selfrag.config import load_config
from selfrag.errors import ConfigError, InputError
from selfrag.training.config import TrainConfig
from selfrag.training.run import run
from selfrag.training.trainer import LoraInputCast, attention_kernels


def _lora_on_bf16_base(tiny_model_builder) -> Any:  # type: ignore[no-untyped-def]
    from peft import LoraConfig, get_peft_model

    base = tiny_model_builder(64).to(torch.bfloat16)  # the 8B recipe's dtype: bfloat16 base, fp32 LoRA (PEFT's)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # non-zero B, so the adapters take part in the output
            torch.nn.init.normal_(parameter, std=0.02)
    return model


def _step(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """One forward + backward under bf16 autocast: the loss, the LoRA gradients, and how many dtype copies ran."""
    model.zero_grad()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    copies = sum(event.count for event in profiler.key_averages() if event.key == "aten::_to_copy")
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, copies


def test_skipping_the_cast_under_autocast_gives_the_same_step_with_fewer_copies(tiny_model_builder) -> None:  # type: ignore[no-untyped-def]
    model = _lora_on_bf16_base(tiny_model_builder)
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    cast_loss, cast_grads, cast_copies = _step(model, ids)
    lever = LoraInputCast(model, skip=True)
    assert len(lever.layers) == 14  # 2 blocks x 7 linear layers
    with lever.skipped():
        assert not any(layer.cast_input_dtype_enabled for layer in lever.layers)
        loss, grads, copies = _step(model, ids)
    assert all(layer.cast_input_dtype_enabled for layer in lever.layers)  # put back: scoring outside autocast casts
    assert torch.equal(loss, cast_loss)
    assert grads.keys() == cast_grads.keys() and len(grads) == 28
    for name, grad in grads.items():
        torch.testing.assert_close(grad, cast_grads[name], rtol=0, atol=0, msg=name)
    # two copies fewer per adapted layer: the input to fp32, and autocast's back to bf16
    assert copies <= cast_copies - 2 * len(lever.layers), (copies, cast_copies)


def test_off_or_without_lora_layers_it_changes_nothing(tiny_model_builder) -> None:  # type: ignore[no-untyped-def]
    model = _lora_on_bf16_base(tiny_model_builder)
    assert LoraInputCast(model, skip=False).layers == []
    assert LoraInputCast(tiny_model_builder(64), skip=True).layers == []


def test_a_bf16_run_trains_with_the_cast_skipped_in_its_steps_only(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """selfrag train with a bfloat16 base and bf16 autocast: the steps run without PEFT's cast, the scoring after them
    (outside autocast, where the fp32 adapter needs it) with it; 'always' keeps the cast and trains the same."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from selfrag.training import sft_trainer

    seen: list[bool] = []
    step = sft_trainer.SFTTrainer.training_step

    def spying(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        layers = [m for m in model.modules()
                  if isinstance(m, BaseTunerLayer) and hasattr(m, "cast_input_dtype_enabled")]
        assert layers
        seen.append(any(layer.cast_input_dtype_enabled for layer in layers))
        return step(self, model, *args, **kwargs)

    monkeypatch.setattr(sft_trainer.SFTTrainer, "training_step", spying)
    losses = {}
    for setting in ("auto", "always"):
        seen.clear()
        config = make_config(tiny_base_dir, records_path, tmp_path / setting, bf16=True, max_steps=3,
                             lora_input_cast=setting)
        config.dtype = "bfloat16"
        result = run(config)  # scores the held-out set after the steps, outside autocast
        assert seen == [setting == "always"] * 3
        losses[setting] = [row["loss"] for row in result.losses]
        assert json.loads((tmp_path / setting / "metrics.json").read_text())["reflection_accuracy"] is not None
    assert losses["auto"] == pytest.approx(losses["always"], abs=1e-6)


def test_attention_kernels_are_checked_and_a_missing_one_is_one_line(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"attention_kernels must name each of flash, efficient, cudnn, math"):
        load_config(TrainConfig, model="m", records="r", output_dir="o", training={"attention_kernels": ["fast"]})
    default = run(make_config(tiny_base_dir, records_path, tmp_path / "default", max_steps=2))
    math = run(make_config(tiny_base_dir, records_path, tmp_path / "math", max_steps=2, attention_kernels=["math"]))
    assert [row["loss"] for row in math.losses] == pytest.approx([row["loss"] for row in default.losses], abs=1e-5)
    # cudnn has no CPU kernel: torch refuses at the first step, reported as the setting's fault
    with pytest.raises(InputError, match=r"^training.attention_kernels=\['cudnn'\]: torch has no such attention"):
        run(make_config(tiny_base_dir, records_path, tmp_path / "cudnn", max_steps=2, attention_kernels=["cudnn"]))
    with pytest.raises(RuntimeError, match="boom"), attention_kernels(["math"]):
        raise RuntimeError("boom")  # other errors pass through as they are
