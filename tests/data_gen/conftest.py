"""A hand-made corpus and query set small enough to check every label by eye."""

from __future__ import annotations

from pathlib import Path

import pytest
from datagen_inputs import PASSAGES, QUERIES, write_jsonl  # noqa: F401  (other tests import them from here too)


@pytest.fixture(autouse=True)
def own_teacher_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own per-teacher cache folder (the default one lives in the user's cache dir)."""
    folder = tmp_path / "teacher-caches"
    monkeypatch.setenv("SELFRAG_TEACHER_CACHE", str(folder))
    return folder


@pytest.fixture
def tiny_data(tmp_path: Path) -> tuple[Path, Path]:
    """(corpus.jsonl, queries.jsonl) of the hand-made data."""
    return write_jsonl(tmp_path / "corpus.jsonl", PASSAGES), write_jsonl(tmp_path / "queries.jsonl", QUERIES)
