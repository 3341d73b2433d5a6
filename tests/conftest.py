"""Shared fixtures: a tiny BPE tokenizer with a chat template and a tiny Llama model, built locally; the tokenizer
with the 15 reflection tokens and a saved tiny merged model that holds them.

Nothing here downloads; the tokenizer is trained in a second on tests/assets/tiny_corpus.txt.

Under pytest-xdist (``bash scripts/test.sh`` runs ``-n auto --dist loadfile``: each module on one worker, its module
fixtures built once) each worker runs torch and BLAS on one thread, so N workers on N cores do not oversubscribe.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of N workers on N cores: one thread each (set before torch loads)
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ASSETS = Path(__file__).parent / "assets"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the modules that hold slow tests first, then the rest by their number of tests, so that
    no worker starts a minutes-long module while the other has nothing left (scripts/test.sh passes
    --no-loadscope-reorder so the workers take the modules in this order)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(tests: list[pytest.Item]) -> tuple[bool, int]:
        return not any(test.get_closest_marker("slow") for test in tests), -len(tests)

    items[:] = [item for tests in sorted(modules.values(), key=weight) for item in tests]

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


@pytest.fixture(scope="session")
def reflection_tokenizer(tiny_tokenizer):  # type: ignore[no-untyped-def]
    """A copy of the tiny tokenizer holding each reflection string as one special token."""
    import copy

    from selfrag.reflection import TOKENS

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.add_tokens(list(TOKENS), special_tokens=True)
    return tokenizer


@pytest.fixture(scope="session")
def token_ids(reflection_tokenizer):  # type: ignore[no-untyped-def]
    from selfrag.reflection import reflection_ids

    return reflection_ids(reflection_tokenizer)


@pytest.fixture(scope="session")
def merged_model_dir(tmp_path_factory, reflection_tokenizer, token_ids, tiny_model_builder):  # type: ignore[no-untyped-def]
    """``merged_model_dir(seed)``: a saved tiny merged model with the reflection tokens and its selfrag.json, its
    weights spread (the default init, std 0.02, decodes one token forever)."""
    import torch

    from selfrag.artifacts import ModelMeta, save_meta

    def make(seed: int) -> Path:
        path = tmp_path_factory.mktemp(f"tiny-selfrag-{seed}")
        model = tiny_model_builder(len(reflection_tokenizer), seed=seed)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, 0.3)
        model.save_pretrained(str(path))
        reflection_tokenizer.save_pretrained(str(path))
        save_meta(path, ModelMeta(token_ids, "add", "auto", "tiny-base", "merged"))
        return path

    return make


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """SIGINT as an interactive terminal has it (Python's KeyboardInterrupt handler), whatever the test run inherited:
    a suite started in the background (``cmd &``, ``nohup``) has SIGINT ignored, which the trainers leave alone."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
