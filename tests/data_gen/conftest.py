"""A hand-made corpus and query set small enough to check every label by eye."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def ray_turn() -> Iterator[None]:
    """Held while a module starts and uses a local Ray cluster: a Ray head binds fixed default ports (GCS 6379, the
    client server, the dashboard agent), so two clusters at once -- two xdist workers, or two pytest runs on one
    machine -- would collide; the second waits for the first."""
    with open(Path(tempfile.gettempdir()) / "selfrag-tests-ray-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
