"""Shared fixtures: a tiny BPE tokenizer with a chat template and a tiny Llama model, built locally.

Nothing here downloads; the tokenizer is trained in a second on tests/assets/tiny_corpus.txt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ASSETS = Path(__file__).parent / "assets"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(ASSETS / "tiny_corpus.txt")], trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|im_end|>", bos_token="<|im_start|>"
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_model(vocab_size: int, seed: int = 0):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=2,
        pad_token_id=2,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config)


@pytest.fixture(scope="session")
def tiny_tokenizer():  # type: ignore[no-untyped-def]
    """A fresh tiny tokenizer (no reflection tokens yet). Session-scoped: copy before mutating."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer) -> Path:  # type: ignore[no-untyped-def]
    """A saved tiny base model + tokenizer directory (like a converted base model)."""
    path = tmp_path_factory.mktemp("tiny-base")
    model = build_tiny_model(len(tiny_tokenizer))
    model.save_pretrained(str(path))
    tiny_tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_model_builder():  # type: ignore[no-untyped-def]
    """``build_tiny_model(vocab_size, seed=0)``, for tests that add tokens before building the model."""
    return build_tiny_model
