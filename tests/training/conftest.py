"""Fixtures for the training tests: hand-built records, a prepared tiny tokenizer/model, a records file."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from training_records import training_records

from selfrag.jsonl import write_jsonl_atomic


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


@pytest.fixture(scope="session")
def records_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training records as a file, written once for every training test that only reads it."""
    path = tmp_path_factory.mktemp("records") / "records.jsonl"
    write_jsonl_atomic(path, [record.to_json() for record in training_records()])
    return path
