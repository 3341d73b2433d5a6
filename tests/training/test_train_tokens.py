"""Token set-up: each reflection string becomes one id, new rows start at the mean of the old ones."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from selfrag.errors import ConfigError, TokenizerError
from selfrag.reflection import TOKENS
from selfrag.training.tokens import prepare_tokens, resolve_strategy


def test_each_reflection_string_is_one_id_and_new_rows_are_the_mean(prepared) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer, token_ids, old_size = prepared
    for token in TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [token_ids.id(token)]
    assert sorted(token_ids.all_ids) == list(range(old_size, old_size + len(TOKENS)))
    weight = model.get_input_embeddings().weight
    assert weight.shape[0] == len(tokenizer)
    expected = weight[:old_size].mean(dim=0)
    for token_id in token_ids.all_ids:
        torch.testing.assert_close(weight[token_id], expected)


def test_prepare_is_idempotent_and_keeps_existing_special_tokens(tiny_tokenizer, tiny_model_builder) -> None:  # type: ignore[no-untyped-def]
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.add_special_tokens({"extra_special_tokens": ["<tool>"]})
    model = tiny_model_builder(len(tokenizer))
    first = prepare_tokens(model, tokenizer, "add")
    size, rows = len(tokenizer), model.get_input_embeddings().weight.clone()
    second = prepare_tokens(model, tokenizer, "add")
    assert second == first
    assert len(tokenizer) == size
    assert torch.equal(model.get_input_embeddings().weight, rows)
    assert "<tool>" in tokenizer.extra_special_tokens
    assert tokenizer.encode("<tool>", add_special_tokens=False) == [tokenizer.convert_tokens_to_ids("<tool>")]


def test_untied_head_rows_are_the_mean_too(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = copy.deepcopy(tiny_tokenizer)
    old_size = len(tokenizer)
    config = LlamaConfig(vocab_size=old_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    model: Any = LlamaForCausalLM(config)
    token_ids = prepare_tokens(model, tokenizer, "add")
    head = model.get_output_embeddings().weight
    assert head.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    torch.testing.assert_close(head[token_ids.id("[Relevant]")], head[:old_size].mean(dim=0))


def reserved_tokenizer(tiny_tokenizer, count: int = 20):  # type: ignore[no-untyped-def]
    tokenizer = copy.deepcopy(tiny_tokenizer)
    names = [f"<|reserved_special_token_{n}|>" for n in range(count)]
    tokenizer.add_special_tokens({"extra_special_tokens": names}, replace_extra_special_tokens=False)
    return tokenizer


def test_reserved_strategy_renames_the_highest_reserved_tokens(tiny_tokenizer, tiny_model_builder, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tokenizer = reserved_tokenizer(tiny_tokenizer)
    size = len(tokenizer)
    model = tiny_model_builder(size)
    rows_before = model.get_input_embeddings().weight.detach().clone()
    token_ids = prepare_tokens(model, tokenizer, "reserved")
    assert len(tokenizer) == size == model.get_input_embeddings().weight.shape[0]  # nothing added
    assert sorted(token_ids.all_ids) == list(range(size - len(TOKENS), size))  # reserved 5..19
    for token in TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [token_ids.id(token)]
        assert tokenizer.decode([token_ids.id(token)]) == token
    low = tokenizer.convert_tokens_to_ids("<|reserved_special_token_0|>")
    assert tokenizer.encode("<|reserved_special_token_0|>", add_special_tokens=False) == [low]
    assert len(tokenizer.encode("<|reserved_special_token_19|>", add_special_tokens=False)) > 1  # renamed away
    # The base stays as it is (vLLM serves the adapter on the unchanged base); LoRA carries the start values.
    assert torch.equal(model.get_input_embeddings().weight, rows_before)
    tokenizer.save_pretrained(str(tmp_path))
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert prepare_tokens(model, reloaded, "reserved") == token_ids  # idempotent, survives a save


def test_strategy_errors_name_the_fix(tiny_tokenizer, tiny_model_builder) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TokenizerError, match="has 3; use tokens.strategy=add"):
        tokenizer = reserved_tokenizer(tiny_tokenizer, count=3)
        prepare_tokens(tiny_model_builder(len(tokenizer)), tokenizer, "reserved")
    with pytest.raises(ConfigError, match="must be one of"):
        prepare_tokens(tiny_model_builder(len(tiny_tokenizer)), copy.deepcopy(tiny_tokenizer), "bogus")


def test_auto_picks_reserved_only_with_enough_reserved_tokens(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert resolve_strategy(copy.deepcopy(tiny_tokenizer), "auto") == "add"
    assert resolve_strategy(reserved_tokenizer(tiny_tokenizer, count=14), "auto") == "add"
    assert resolve_strategy(reserved_tokenizer(tiny_tokenizer, count=15), "auto") == "reserved"
    assert resolve_strategy(reserved_tokenizer(tiny_tokenizer, count=3), "add") == "add"
    assert resolve_strategy(reserved_tokenizer(tiny_tokenizer, count=3), "reserved") == "reserved"  # errors later


def test_auto_on_a_prepared_tokenizer_keeps_its_strategy(tiny_tokenizer, tiny_model_builder) -> None:  # type: ignore[no-untyped-def]
    reserved = reserved_tokenizer(tiny_tokenizer, count=20)
    prepare_tokens(tiny_model_builder(len(reserved)), reserved, "auto")
    assert resolve_strategy(reserved, "auto") == "reserved"
    added = copy.deepcopy(tiny_tokenizer)
    prepare_tokens(tiny_model_builder(len(added)), added, "auto")
    assert resolve_strategy(added, "auto") == "add"


def test_reserved_lora_start_is_exact_and_masks_keep_other_rows(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from selfrag.training.tokens import init_reserved_lora, reserved_row_deltas

    tokenizer = reserved_tokenizer(tiny_tokenizer, count=20)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    model: Any = LlamaForCausalLM(config)
    token_ids = prepare_tokens(model, tokenizer, "reserved")
    known = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False)
    ids = sorted(token_ids.all_ids)
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=8, target_modules=["embed_tokens", "lm_head"]))
    init_reserved_lora(peft_model, token_ids, known)
    embedding_delta, head_delta = reserved_row_deltas(peft_model)
    embedding = peft_model.get_input_embeddings().get_base_layer().weight
    head = peft_model.get_output_embeddings().get_base_layer().weight
    torch.testing.assert_close((embedding + embedding_delta)[ids], embedding[:known].mean(0).expand(15, -1))
    torch.testing.assert_close((head + head_delta)[ids], head[:known].mean(0).expand(15, -1))
    sample = torch.tensor([[3, ids[0], 7, ids[5], 9]])
    peft_model(input_ids=sample, labels=sample).loss.backward()
    a = peft_model.get_input_embeddings().lora_embedding_A["default"]
    b = peft_model.get_output_embeddings().lora_B["default"].weight
    assert set(a.grad.abs().sum(0).nonzero().flatten().tolist()) <= set(ids)  # only reflection columns
    assert set(b.grad.abs().sum(1).nonzero().flatten().tolist()) == set(ids)  # only reflection rows
