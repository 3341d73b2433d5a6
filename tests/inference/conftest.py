"""Fixtures of the server tests (tests/inference/test_server*.py), shared instead of copied per file."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def engine(reflection_tokenizer: Any, token_ids: Any) -> Any:
    """A fresh scripted server engine per test (tests gate it or count its calls); a module may define its own."""
    from server_harness import ScriptedBackendEngine  # imported here: the other inference tests need no server

    return ScriptedBackendEngine(reflection_tokenizer, token_ids)


@pytest.fixture
def live(engine: Any) -> Iterator[Any]:
    """A server on this test's ``engine``, stopped after it (the gate opened first, should the test have closed it)."""
    from server_harness import serving

    with serving(engine) as server:
        yield server
