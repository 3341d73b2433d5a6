"""Fixtures for the inference tests: the tiny tokenizer with the 15 reflection tokens added."""

from __future__ import annotations

import copy

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
