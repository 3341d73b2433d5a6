"""Fixtures for the training tests: hand-built records, a prepared tiny tokenizer/model, a records file."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from training_records import training_records

from selfrag.jsonl import write_jsonl_atomic


def _root_conftest() -> Any:
    # Every test folder's conftest is a module named "conftest"; load the root one by path.
    spec = importlib.util.spec_from_file_location("_selfrag_root_conftest", Path(__file__).parents[1] / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_model_builder() -> Callable[..., Any]:
    return _root_conftest().build_tiny_model  # type: ignore[no-any-return]


@pytest.fixture()
def prepared(tiny_tokenizer, tiny_model_builder):  # type: ignore[no-untyped-def]
    """A fresh (model, tokenizer, token_ids, old_vocab_size) after prepare_tokens(strategy=add)."""
    from selfrag.training.tokens import prepare_tokens

    tokenizer = copy.deepcopy(tiny_tokenizer)
    old_size = len(tokenizer)
    model = tiny_model_builder(old_size)
    token_ids = prepare_tokens(model, tokenizer, "add")
    return model, tokenizer, token_ids, old_size


@pytest.fixture()
def records_file(tmp_path: Path) -> Path:
    path = tmp_path / "records.jsonl"
    write_jsonl_atomic(path, [record.to_json() for record in training_records()])
    return path
