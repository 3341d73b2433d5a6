"""GPU recipes and accelerate configs, checked without a GPU or a download.

Each recipe loads and validates (its trl/peft/quantization pass-through keys against the real classes),
survives a write/read of its resolved config, and builds the real ``trl.SFTConfig``, ``peft.LoraConfig``
and (QLoRA) ``transformers.BitsAndBytesConfig`` it would train with. The LoRA config is built on a tiny
stand-in of the recipe's architecture (same module names), with reserved tokens where the family has them.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from reserved_base import add_reserved_tokens

from selfrag.config import load_config, write_resolved
from selfrag.training.config import TrainConfig
from selfrag.training.model import lora_config, model_load_options
from selfrag.training.tokens import prepare_tokens, resolve_strategy
from selfrag.training.trainer import sft_options

ROOT = Path(__file__).resolve().parents[2]
GPU_RECIPES = {
    "llama-3.1-8b-instruct-lora.yaml": ("reserved", "llama", False),
    "llama-3.1-8b-instruct-qlora.yaml": ("reserved", "llama", True),
    "qwen2.5-7b-instruct-lora.yaml": ("add", "qwen2", False),
}
ACCELERATE = {
    "single_gpu.yaml": "NO",
    "ddp.yaml": "MULTI_GPU",
    "fsdp.yaml": "FSDP",
    "deepspeed_zero3.yaml": "DEEPSPEED",
    "multi_node.yaml": "MULTI_GPU",
}


def load_recipe(name: str, tmp_path: Path) -> TrainConfig:
    return load_config(
        TrainConfig, ROOT / "configs" / "train" / name, [f"records={tmp_path / 'r.jsonl'}", f"output_dir={tmp_path}"]
    )


def stand_in(family: str, tokenizer: Any, tied: bool) -> Any:
    """A 1-layer model of the recipe's architecture, sized to ``tokenizer``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    sizes = {"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": tied}
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**sizes))
    return LlamaForCausalLM(LlamaConfig(**sizes))


def test_every_gpu_recipe_is_tested() -> None:
    recipes = {path.name for path in (ROOT / "configs" / "train").glob("*.yaml")}
    assert set(GPU_RECIPES) <= recipes
    # the CPU recipes have their own tests
    assert recipes - set(GPU_RECIPES) == {"smollm2-135m-cpu.yaml", "smollm2-135m-cpu-full.yaml"}


@pytest.mark.parametrize("name", sorted(GPU_RECIPES))
def test_recipe_loads_resolves_and_builds_its_trainer_arguments(name: str, tmp_path: Path, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from peft import LoraConfig
    from trl import SFTConfig

    strategy, family, quantized = GPU_RECIPES[name]
    config = load_recipe(name, tmp_path)
    assert config.tokens.strategy == strategy and config.dtype == "bfloat16"
    # The resolved config written into every output reads back to the same config.
    resolved = write_resolved(config, tmp_path / "resolved")
    assert dataclasses.asdict(load_config(TrainConfig, resolved)) == dataclasses.asdict(config)

    options = sft_options(config, tmp_path / "checkpoints")
    if not torch.cuda.is_available():  # bf16 is refused on a machine without a GPU unless told it trains on CPU
        assert options["use_cpu"] is True
    sft = SFTConfig(**options)
    assert sft.bf16 and sft.gradient_checkpointing and sft.learning_rate == config.training.learning_rate
    assert sft.gradient_accumulation_steps == config.training.gradient_accumulation_steps

    tokenizer = copy.deepcopy(tiny_tokenizer)
    model = stand_in(family, tokenizer, tied=False)
    if strategy == "reserved":  # Llama-3 ships <|reserved_special_token_N|>
        add_reserved_tokens(model, tokenizer, count=20)
    assert resolve_strategy(tokenizer, "auto") == strategy
    token_ids = prepare_tokens(model, tokenizer, strategy)
    lora = lora_config(config, token_ids, model, strategy)
    assert isinstance(lora, LoraConfig) and lora.r == config.lora.r and lora.lora_alpha == config.lora.alpha
    targets = set(lora.target_modules)
    if strategy == "reserved":  # plain LoRA: the linear layers plus embed_tokens and lm_head, nothing else
        assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= targets
        assert {"embed_tokens", "lm_head"} <= targets
        assert not lora.trainable_token_indices and not lora.modules_to_save
    else:
        assert lora.target_modules == "all-linear" or "lm_head" not in targets
        assert set(lora.trainable_token_indices["embed_tokens"]) == set(token_ids.all_ids)

    load = model_load_options(config)
    assert load["dtype"] is torch.bfloat16
    if quantized:
        quantization = load["quantization_config"]
        assert quantization.load_in_4bit and quantization.bnb_4bit_quant_type == "nf4"
        assert quantization.bnb_4bit_compute_dtype is torch.bfloat16 and quantization.bnb_4bit_use_double_quant
        assert sft.optim.value == "paged_adamw_8bit"
    else:
        assert "quantization_config" not in load


def test_quantization_typos_fail_when_the_config_loads(tmp_path: Path) -> None:
    from selfrag.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown quantization option 'load_in_4bits'; did you mean"):
        load_config(TrainConfig, ROOT / "configs/train/llama-3.1-8b-instruct-qlora.yaml",
                    [f"records={tmp_path}/r", f"output_dir={tmp_path}", "quantization.load_in_4bits=true"])


@pytest.mark.parametrize("name", sorted(ACCELERATE))
def test_accelerate_configs_are_valid_and_documented(name: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    path = ROOT / "configs" / "accelerate" / name
    text = path.read_text()
    assert "accelerate launch --config_file configs/accelerate/" + name in text  # the command is in the file
    data = yaml.safe_load(text)
    known = {field.name for field in dataclasses.fields(ClusterConfig)}
    assert set(data) <= known, set(data) - known
    config = ClusterConfig.from_yaml_file(str(path))
    assert config.distributed_type.value == ACCELERATE[name]
    assert str(config.mixed_precision) in ("bf16", "PrecisionType.BF16")
    # accelerate launch turns each fsdp_config / deepspeed_config entry into its own launch flag.
    from accelerate.commands.launch import launch_command_parser

    flags = {action.dest for action in launch_command_parser()._actions}
    for section in ("fsdp_config", "deepspeed_config"):
        assert set(data.get(section, {})) <= flags, set(data[section]) - flags
    if name == "deepspeed_zero3.yaml":
        assert data["deepspeed_config"]["zero_stage"] == 3


@pytest.mark.parametrize("steps", [4, 150, 300])
def test_cpu_recipe_holds_its_learning_rate_then_decays_over_the_last_fifth(steps: int, tmp_path: Path) -> None:
    """The CPU recipe's schedule, as the trainer builds it: warm-up, constant, a cosine decay over the last fifth
    of whatever max_steps the run has (the decay is a ratio, so CI's 4-step run and a 300-step rerun keep it)."""
    from transformers import get_scheduler
    from trl import SFTConfig

    config = load_config(TrainConfig, ROOT / "configs" / "train" / "smollm2-135m-cpu.yaml",
                         [f"records={tmp_path / 'r.jsonl'}", f"output_dir={tmp_path}", f"training.max_steps={steps}"])
    sft = SFTConfig(**sft_options(config, tmp_path / "checkpoints"))
    assert sft.lr_scheduler_kwargs == {"num_decay_steps": max(1, round(0.2 * steps))}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=sft.learning_rate)
    scheduler = get_scheduler(sft.lr_scheduler_type, optimizer, num_warmup_steps=sft.get_warmup_steps(steps),
                              num_training_steps=steps, scheduler_specific_kwargs=sft.lr_scheduler_kwargs)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    decay_from = steps - max(1, round(0.2 * steps))
    assert rates[decay_from - 1] == pytest.approx(sft.learning_rate)  # full rate until the decay starts
    assert all(later <= earlier for earlier, later in itertools.pairwise(rates[decay_from:]))
    if steps >= 150:  # 4 steps: the one decay step still runs at the full rate (cosine starts at 1)
        assert rates[-1] < 0.01 * sft.learning_rate


def test_a_decay_ratio_needs_max_steps(tmp_path: Path) -> None:
    from selfrag.errors import ConfigError

    recipe = ROOT / "configs" / "train" / "smollm2-135m-cpu.yaml"
    paths = [f"records={tmp_path / 'r.jsonl'}", f"output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="ratio of training.max_steps"):
        load_config(TrainConfig, recipe, [*paths, "training.max_steps=-1"])
    # a wrong value elsewhere in training leaves the section at its defaults: only that value is reported, not a
    # "max_steps is not set" that the recipe does set
    for bad, line in (("training.batch_size=abc", "training.batch_size must be an integer, got 'abc'"),
                      ("training.relevance_rank=nan", "training.relevance_rank must be a finite number, got 'nan'")):
        with pytest.raises(ConfigError) as caught:
            load_config(TrainConfig, recipe, [*paths, bad])
        assert len(caught.value.problems) == 1 and caught.value.problems[0].startswith(line), caught.value.problems
    for bad in ("nan", "1.5", ".nan"):  # one line each, no traceback
        with pytest.raises(ConfigError, match="num_decay_steps: expected a step count or a ratio"):
            load_config(TrainConfig, recipe, [*paths, f"trl.lr_scheduler_kwargs.num_decay_steps={bad}"])
    # JSON text is transformers' own form too: read like the mapping, its ratio resolved the same way
    config = load_config(
        TrainConfig, recipe, [*paths, "training.max_steps=300", "trl.lr_scheduler_kwargs='{\"num_decay_steps\": 0.2}'"]
    )
    assert sft_options(config, tmp_path / "c")["lr_scheduler_kwargs"] == {"num_decay_steps": 60}
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(TrainConfig, recipe, [*paths, "trl.lr_scheduler_kwargs=abc"])


def test_bf16_auto_is_on_only_where_the_hardware_computes_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """training.bf16=auto: autocast where the CPU has AVX512-BF16 or AMX (or a CUDA GPU has bf16), fp32 elsewhere,
    where emulated bf16 is slower; true/false force it, and trl.bf16 wins over both."""
    from trl import SFTConfig

    from selfrag.training import trainer

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n\n"
                       "processor\t: 1\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    assert {"avx512_bf16", "avx2"} <= trainer.cpu_flags(cpuinfo) and "amx_bf16" not in trainer.cpu_flags(cpuinfo)
    assert trainer.cpu_flags(tmp_path / "missing") == set()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = ROOT / "configs" / "train" / "smollm2-135m-cpu.yaml"
    paths = [f"records={tmp_path / 'r.jsonl'}", f"output_dir={tmp_path}"]
    for flags, expected in (({"avx2", "avx512f"}, False), ({"avx512_bf16"}, True), ({"amx_bf16"}, True)):
        monkeypatch.setattr(trainer, "cpu_flags", lambda flags=flags: flags)
        config = load_config(TrainConfig, recipe, [*paths, "training.bf16=auto"])
        sft = trainer.sft_arguments(config, tmp_path / "c")
        assert sft.bf16 is expected and sft.use_cpu is expected  # use_cpu: what transformers needs for CPU autocast
    monkeypatch.setattr(trainer, "cpu_flags", lambda: {"avx512_bf16"})

    def options(*overrides: str) -> dict[str, Any]:
        return trainer.sft_options(load_config(TrainConfig, recipe, [*paths, *overrides]), tmp_path)

    assert options("training.bf16=false")["bf16"] is False
    assert options("trl.bf16=false")["bf16"] is False
    monkeypatch.setattr(trainer, "cpu_flags", lambda: set())
    assert SFTConfig(**options("training.bf16=true")).bf16


def test_bf16_setting_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from selfrag.errors import ConfigError
    from selfrag.training import trainer

    recipe = ROOT / "configs" / "train" / "smollm2-135m-cpu.yaml"
    paths = [f"records={tmp_path / 'r.jsonl'}", f"output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=r"training.bf16 must be") as caught:
        load_config(TrainConfig, recipe, [*paths, "training.bf16=maybe"])
    assert len(caught.value.problems) == 1
    # settings transformers itself refuses are one config line each, not a traceback
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for refused in (["trl.use_cpu=false", "trl.bf16=true"], ["trl.fp16=true", "trl.bf16=true"]):
        config = load_config(TrainConfig, recipe, [*paths, *refused])
        with pytest.raises(ConfigError, match="^trl: transformers refused these settings: .*(bf16|fp16)") as caught:
            trainer.sft_arguments(config, tmp_path / "c")
        assert "\n" not in str(caught.value)
