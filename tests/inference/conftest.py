"""Fixtures for the inference tests: the tiny tokenizer with the 15 reflection tokens added."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from selfrag.reflection import TOKENS, ReflectionIds, reflection_ids


@pytest.fixture(scope="session")
def reflection_tokenizer(tiny_tokenizer):  # type: ignore[no-untyped-def]
    """A copy of the tiny tokenizer holding each reflection string as one special token."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.add_tokens(list(TOKENS), special_tokens=True)
    return tokenizer


@pytest.fixture(scope="session")
def token_ids(reflection_tokenizer) -> ReflectionIds:  # type: ignore[no-untyped-def]
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
