"""Fixtures for the inference tests: the tiny tokenizer with the 15 reflection tokens added."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _root_conftest() -> Any:
    # Every test folder's conftest is a module named "conftest", so the root one cannot be imported by
    # name from here; load it by path for its model builder.
    spec = importlib.util.spec_from_file_location("_selfrag_root_conftest", Path(__file__).parents[1] / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_model_builder() -> Callable[..., Any]:
    """``build_tiny_model(vocab_size, seed=0)`` from tests/conftest.py."""
    return _root_conftest().build_tiny_model  # type: ignore[no-any-return]
