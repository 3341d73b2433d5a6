"""``lora.layers``: LoRA on the top N blocks only, the reflection rows learning from the head, and a backward pass
that stops at the lowest adapted block (the tiny 2-layer model, real steps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from training_records import train_and_compare

from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.loading import load_model
from selfrag.training.config import TrainConfig
from selfrag.training.model import prepare_model
from selfrag.training.trainer import input_side_detached


def make_config(base: Path, records: Path, out: Path, layers: int | None = 1, **settings: Any) -> TrainConfig:
    training = {"learning_rate": 1e-2, "max_steps": 8, "batch_size": 4, "logging_steps": 1, "eval_fraction": 0.25,
                "max_length": 512}
    return load_config(TrainConfig, model=str(base), records=str(records), output_dir=str(out), training=training,
                       lora={"r": 4, "alpha": 8, "dropout": 0.0, "layers": layers}, **settings)


def test_only_the_top_block_is_adapted_and_the_rows_still_learn(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path
) -> None:
    config = make_config(tiny_base_dir, records_path, tmp_path / "top1")
    result, initial, final = train_and_compare(config)
    lora = [name for name in final if "lora_" in name]
    rows = [name for name in final if "trainable_tokens_delta" in name]
    assert lora and rows
    assert all(".layers.1." in name for name in lora), [name for name in lora if ".layers.1." not in name]
    # every linear module of the top block is adapted ('all-linear' spelled out for PEFT's layers_to_transform)
    adapted = {name.split(".layers.1.")[1].split(".lora_")[0] for name in lora}
    assert adapted == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    for name in lora:
        assert not torch.equal(final[name], initial[name]), f"LoRA weight {name} did not change"
    for name in rows:  # learned from the (tied) head alone: every reflection row still moved
        assert (final[name] != initial[name]).any(dim=1).all(), f"some reflection rows in {name} did not change"
    for name in set(final) - set(lora) - set(rows):
        assert torch.equal(final[name], initial[name]), f"frozen weight {name} changed"

    # saved and reloaded: the same logits, and no hook left on the returned model
    model, tokenizer, _ = load_model(config.output_dir)
    ids = torch.tensor([tokenizer.encode("Where did the Normans live? [Retrieval]<paragraph>x</paragraph>")])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, result.model(input_ids=ids).logits, atol=1e-5)
    assert not result.model.get_input_embeddings()._forward_hooks


def block_outputs_require_grad(model: Any, ids: torch.Tensor) -> list[bool]:
    """Whether each block's output requires grad in one training forward: the blocks the backward pass goes
    through (a block with nothing to train below it, and an input that requires none, gives an output without)."""
    seen: list[bool] = []

    def record(module: Any, args: Any, output: Any) -> None:
        seen.append((output[0] if isinstance(output, tuple) else output).requires_grad)

    blocks = model.base_model.model.model.layers
    handles = [block.register_forward_hook(record) for block in blocks]
    try:
        model(input_ids=ids).logits.sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def test_the_backward_pass_stops_below_the_lowest_adapted_block(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path
) -> None:
    model = prepare_model(make_config(tiny_base_dir, records_path, tmp_path / "x")).model
    ids = torch.tensor([[5, 6, 7, 8]])
    assert block_outputs_require_grad(model, ids) == [True, True]  # the input rows require grad: all the way down
    with input_side_detached(model, True):
        assert block_outputs_require_grad(model, ids) == [False, True]  # block 0: nothing to train in or below it
    with input_side_detached(model, True, checkpointing=True):  # re-entrant checkpointing needs a grad input
        assert block_outputs_require_grad(model, ids) == [True, True]
    with input_side_detached(model, False):
        assert block_outputs_require_grad(model, ids) == [True, True]
    assert not model.get_input_embeddings()._forward_hooks


def test_lora_layers_refusals(tiny_base_dir: Path, records_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="layers must be a number of blocks >= 1"):
        make_config(tiny_base_dir, records_path, tmp_path / "a", layers=0)
    with pytest.raises(ConfigError, match=r"layers must be a share of the blocks in \(0, 1\]"):
        make_config(tiny_base_dir, records_path, tmp_path / "a", layers=1.5)
    with pytest.raises(ConfigError, match="method=full trains every weight"):
        make_config(tiny_base_dir, records_path, tmp_path / "b", method="full")
    with pytest.raises(ConfigError, match="tokens.strategy=reserved trains them"):
        make_config(tiny_base_dir, records_path, tmp_path / "c", tokens={"strategy": "reserved"})
    with pytest.raises(ConfigError, match="peft.layers_to_transform is set by this recipe; set lora.layers"):
        make_config(tiny_base_dir, records_path, tmp_path / "d", peft={"layers_to_transform": [1]})
    with pytest.raises(ConfigError, match="this base has 2 transformer blocks; set lora.layers to at most 2, a share"):
        prepare_model(make_config(tiny_base_dir, records_path, tmp_path / "e", layers=3))
    regex = load_config(TrainConfig, model=str(tiny_base_dir), records=str(records_path),
                        output_dir=str(tmp_path / "f"), lora={"layers": 1, "target_modules": ".*proj"})
    with pytest.raises(ConfigError, match="target_modules as a list of module names"):
        prepare_model(regex)


@pytest.mark.parametrize(("layers", "adapted"), [(1, [1]), (2, [0, 1]), (0.5, [1]), (0.2, [1]), (1.0, [0, 1])])
def test_a_count_or_a_share_of_the_blocks(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path, layers: float, adapted: list[int]
) -> None:
    """An integer is a number of top blocks; a float in (0, 1] that share of them, rounded, at least one (the CPU
    recipe's 0.5 is SmolLM2-135M's top 15 of 30, and the top block of the tests' 2-block model)."""
    config = make_config(tiny_base_dir, records_path, tmp_path / "x", layers=layers)
    assert type(config.lora.layers) is type(layers)
    model = prepare_model(config).model
    lora = [name for name, _ in model.named_parameters() if "lora_A" in name]
    assert sorted({int(name.split(".layers.")[1].split(".")[0]) for name in lora}) == adapted
    assert model.peft_config["default"].layers_to_transform == adapted
