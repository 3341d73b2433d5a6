"""configs/models shapes: the Llama-3 tokenizer built in code, and random weights only when random_init says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from selfrag.errors import ConfigError, ModelNotFoundError
from selfrag.shapes import SHAPE_FILE, build_llama3_tokenizer, ensure_tokenizer, has_weights, llama3_special_tokens

REPO = Path(__file__).resolve().parents[2]
SHAPES = REPO / "configs" / "models"


@pytest.fixture(scope="module")
def llama3_tokenizer():  # type: ignore[no-untyped-def]
    return build_llama3_tokenizer()


def test_the_shipped_shapes_are_the_public_architectures() -> None:
    eight = json.loads((SHAPES / "llama-3.1-8b" / "config.json").read_text())
    assert (eight["num_hidden_layers"], eight["hidden_size"], eight["intermediate_size"]) == (32, 4096, 14336)
    assert (eight["num_attention_heads"], eight["num_key_value_heads"], eight["vocab_size"]) == (32, 8, 128256)
    assert eight["tie_word_embeddings"] is False and eight["rope_theta"] == 500000.0
    assert eight["rope_scaling"]["rope_type"] == "llama3" and eight["max_position_embeddings"] == 131072
    one = json.loads((SHAPES / "llama-3.2-1b" / "config.json").read_text())
    assert (one["num_hidden_layers"], one["hidden_size"], one["intermediate_size"], one["tie_word_embeddings"]) == (
        16, 2048, 8192, True)
    for name in ("llama-3.1-8b", "llama-3.2-1b", "smollm2-135m"):
        assert not has_weights(SHAPES / name) and (SHAPES / name / SHAPE_FILE).is_file()


def test_llama3_tokenizer_has_the_layout_of_llama_3_1(llama3_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from selfrag.training.tokens import reserved_tokens, resolve_strategy

    tokenizer = llama3_tokenizer
    assert len(tokenizer) == 128256
    assert tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False) == 128000
    names = llama3_special_tokens()
    assert tokenizer.convert_ids_to_tokens([128000, 128001, 128009, 128010, 128011, 128255]) == [
        "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|python_tag|>", "<|reserved_special_token_3|>",
        "<|reserved_special_token_247|>"]
    assert names == tokenizer.convert_ids_to_tokens(list(range(128000, 128256)))
    assert len(reserved_tokens(tokenizer)) == 248  # what strategy reserved takes 15 of
    assert resolve_strategy(tokenizer, "auto") == "reserved"
    text = "Who ruled Normandy in the 10th century? Rollo, a Viking, and his heirs."
    ids = tokenizer.encode(text)
    assert ids[0] == 128000 and tokenizer.decode(ids[1:]) == text  # byte-level: lossless
    assert len(ids) < len(text) / 3  # merges learned from English, not bytes
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_both_strategies_prepare_the_real_size_matrix(llama3_tokenizer) -> None:  # type: ignore[no-untyped-def]
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from selfrag.training.tokens import prepare_tokens

    config = LlamaConfig(vocab_size=128256, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    for strategy, rows in (("reserved", 128256), ("add", 128256 + 15)):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        tokenizer = copy.deepcopy(llama3_tokenizer)
        ids = prepare_tokens(model, tokenizer, strategy)
        assert model.get_input_embeddings().weight.shape[0] == rows == len(tokenizer)
        assert model.get_output_embeddings().weight.shape[0] == rows
        expected = range(128241, 128256) if strategy == "reserved" else range(128256, 128271)
        assert sorted(ids.all_ids) == list(expected), strategy


def test_resolve_builds_a_shapes_tokenizer_once(tmp_path: Path) -> None:
    from selfrag.models import resolve_model

    shape = tmp_path / "shape"
    shutil.copytree(SHAPES / "llama-3.2-1b", shape, ignore=shutil.ignore_patterns("tokenizer*", "chat_template*"))
    assert not (shape / "tokenizer.json").exists()
    assert resolve_model(str(shape)) == str(shape)
    built = (shape / "tokenizer.json").stat().st_mtime_ns
    assert ensure_tokenizer(shape) == shape and (shape / "tokenizer.json").stat().st_mtime_ns == built
    assert not list(tmp_path.glob(".shape.tokenizer-*"))  # built beside, moved in


def test_random_weights_only_when_asked(tmp_path: Path) -> None:
    import torch

    from selfrag.loading import load_base_model

    shape = tmp_path / "tiny"
    shape.mkdir()
    config = json.loads((SHAPES / "llama-3.2-1b" / "config.json").read_text())
    config.update(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, vocab_size=64)
    (shape / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelNotFoundError, match="random_init=true") as refused:
        load_base_model(str(shape))
    assert "\n" not in str(refused.value)
    first = load_base_model(str(shape), "float32", random_init=True, seed=3, device="cpu")
    again = load_base_model(str(shape), "float32", random_init=True, seed=3, device="cpu")
    other = load_base_model(str(shape), "float32", random_init=True, seed=4, device="cpu")
    weight = first.get_input_embeddings().weight
    assert weight.dtype == torch.float32 and weight.shape == (64, 16)
    assert torch.equal(weight, again.get_input_embeddings().weight)
    assert not torch.equal(weight, other.get_input_embeddings().weight)
    meta = load_base_model(str(shape), "bfloat16", random_init=True, device="meta")
    assert meta.get_input_embeddings().weight.device.type == "meta"


def test_random_init_with_quantization_is_a_config_problem() -> None:
    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig

    with pytest.raises(ConfigError, match="random_init=true builds random unquantised weights"):
        load_config(TrainConfig, REPO / "configs" / "train" / "llama-3.1-8b-instruct-qlora.yaml",
                    ["records=r.jsonl", "output_dir=o", "random_init=true"])
