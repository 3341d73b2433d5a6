"""The reserved-token copy of a base: same computation for every old token, zero rows for the reserved ones."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from reserved_base import add_reserved_tokens, make_reserved_base

from selfrag.errors import InputError
from selfrag.training.tokens import reserved_tokens, resolve_strategy


def test_copy_has_zero_reserved_rows_and_the_same_logits(tiny_base_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    copy_dir = make_reserved_base(str(tiny_base_dir), tmp_path / "copy", count=16)
    original = AutoModelForCausalLM.from_pretrained(str(tiny_base_dir)).eval()
    model = AutoModelForCausalLM.from_pretrained(str(copy_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(copy_dir))
    reserved = reserved_tokens(tokenizer)
    assert [n for n, _ in reserved] == list(range(16)) and resolve_strategy(tokenizer, "auto") == "reserved"
    ids = [token_id for _, token_id in reserved]
    assert torch.count_nonzero(model.get_input_embeddings().weight[ids]) == 0
    old = original.get_input_embeddings().weight.shape[0]
    sample = torch.tensor([tokenizer.encode("The Normans came from Normandy.")])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=sample).logits[..., :old], original(input_ids=sample).logits)
    with pytest.raises(InputError, match="not empty"):
        make_reserved_base(str(tiny_base_dir), copy_dir)


def test_adding_twice_is_refused(tiny_tokenizer, tiny_model_builder) -> None:  # type: ignore[no-untyped-def]
    tokenizer = copy.deepcopy(tiny_tokenizer)
    model = tiny_model_builder(len(tokenizer))
    add_reserved_tokens(model, tokenizer, count=15)
    with pytest.raises(InputError, match="already has <\\|reserved_special_token_0\\|>"):
        add_reserved_tokens(model, tokenizer, count=15)


@pytest.mark.slow
def test_smollm2_reserved_copy_trains_a_plain_lora(tmp_path: Path) -> None:
    """The real SmolLM2 copy (what the engines' vLLM LoRARequest parity test loads): a few steps, plain keys."""
    from safetensors import safe_open
    from training_records import training_records

    from selfrag.config import load_config
    from selfrag.jsonl import write_jsonl_atomic
    from selfrag.loading import load_model
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    base = make_reserved_base("smollm2-135m-instruct", tmp_path / "smollm2-reserved")
    records = tmp_path / "records.jsonl"
    write_jsonl_atomic(records, [record.to_json() for record in training_records()])
    config = load_config(TrainConfig, model=str(base), records=str(records), output_dir=str(tmp_path / "adapter"),
                         training={"max_steps": 3, "batch_size": 2, "eval_fraction": 0.0, "logging_steps": 1})
    result = run(config)
    assert load_model(config.output_dir)[2].strategy == "reserved"
    with safe_open(str(tmp_path / "adapter" / "adapter_model.safetensors"), framework="pt") as handle:
        keys = list(handle.keys())
    assert all(key.endswith((".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B"))
               for key in keys)
    assert len(result.losses) == 3
