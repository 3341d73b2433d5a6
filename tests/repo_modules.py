"""Import a module of the repository's ``benchmarks/`` or ``scripts/`` folder in a test: they are scripts, not
packages, so their folder goes on ``sys.path`` while the test holds the module, and comes off after."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def repo_module(folder: str, name: str) -> Iterator[ModuleType]:
    path = str(ROOT / folder)
    sys.path.insert(0, path)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(path)
