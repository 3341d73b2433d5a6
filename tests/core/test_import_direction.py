"""The core contract (``selfrag/``) never imports a stage or the application layer (DESIGN.md: imports go one way)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "selfrag"
FORBIDDEN = ("selfrag.data_gen", "selfrag.training", "selfrag.inference", "selfrag.app")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_core_imports_no_stage() -> None:
    offenders = [
        f"{path.name}: {name}"
        for path in sorted(CORE.glob("*.py"))
        for name in _imports(path)
        if name.startswith(FORBIDDEN)
    ]
    assert offenders == []


def test_training_imports_only_core() -> None:
    training = CORE.parent / "training"
    offenders = [
        f"{path.name}: {name}"
        for path in sorted(training.glob("*.py"))
        for name in _imports(path)
        if name.startswith(("selfrag.data_gen", "selfrag.inference", "selfrag.app"))
    ]
    assert offenders == []
