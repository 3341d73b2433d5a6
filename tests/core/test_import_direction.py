"""Imports go one way, as docs/ARCHITECTURE.md draws them: the page's table is read here and every import checked.

Each folder of the package may import only what its row of "Who may import whom" names (imports inside functions
included); benchmarks/ and studies/ use public names only; nothing in the package imports the folders outside it;
the runtime's algorithm imports no model library. The setting-flow section's names are checked to exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "ARCHITECTURE.md"
CORE = REPO / "selfrag"
#: the package's folders and their import names (pyproject's package-dir)
PACKAGES = {
    "selfrag": "selfrag",
    "app": "selfrag.app",
    "data_gen": "selfrag.data_gen",
    "training": "selfrag.training",
    "inference": "selfrag.inference",
    "evaluation": "selfrag.evaluation",
    "rl": "selfrag.rl",
}
STAGES = tuple(name for name in PACKAGES.values() if name != "selfrag")
OUTSIDE = ("benchmarks", "studies", "scripts", "tests")
#: the runtime's algorithm: talks to engines through the protocol, never to a model library
ALGORITHM = ("runtime.py", "rounds.py", "work.py", "finish.py", "branches.py", "prompted.py", "longform.py", "beams.py",
             "policy.py", "scoring.py", "closedset.py", "answer.py", "trace.py", "events.py", "segments.py")
MODEL_LIBRARIES = ("torch", "transformers", "vllm")


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every absolute import in ``path``, inside functions too; a package's
    ``__init__.py`` may re-export its lazy public names under ``if TYPE_CHECKING:`` (never run: no dependency)."""
    found: list[tuple[str, list[str]]] = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if path.name == "__init__.py":
        tree.body = [node for node in tree.body if not _is_type_checking_block(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _is_type_checking_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _is_core(module: str) -> bool:
    return (module == "selfrag" or module.startswith("selfrag.")) and not module.startswith(STAGES)


def _allowed_table() -> dict[str, list[str]]:
    """``{folder: [allowed import prefixes or "core"]}`` from the page's table."""
    section = PAGE.read_text(encoding="utf-8").split("## Who may import whom", 1)[1].split("\n## ", 1)[0]
    table: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("/`"):
            folder = cells[0].strip("`/")
            assert cells[1].strip("`") == PACKAGES[folder], f"{folder}: the page names {cells[1]}"
            table[folder] = [item.strip().strip("`") for item in cells[2].split(",")]
    return table


def _allowed(module: str, rules: list[str], own: str) -> bool:
    """May a file of package ``own`` import ``module``? Its own package and third-party modules always."""
    if module != "selfrag" and not module.startswith("selfrag."):
        return True
    if _is_core(module) if own == "selfrag" else module == own or module.startswith(own + "."):
        return True
    return any(_is_core(module) if rule == "core" else module == rule or module.startswith(rule + ".")
               for rule in rules)


def test_the_page_has_a_row_for_every_folder_of_the_package() -> None:
    assert sorted(_allowed_table()) == sorted(PACKAGES)


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_each_folder_imports_only_what_the_page_allows(folder: str) -> None:
    rules = _allowed_table()[folder]
    own = PACKAGES[folder]
    offenders = [
        f"{path.relative_to(REPO)}: {module}"
        for path in sorted((REPO / folder).rglob("*.py"))
        for module, _ in _imports(path)
        if not _allowed(module, rules, own)
    ]
    assert offenders == [], f"imports that docs/ARCHITECTURE.md does not allow for {folder}/"


def test_the_checker_catches_a_stage_importing_the_application_layer() -> None:
    rules = _allowed_table()
    assert not _allowed("selfrag.app.quickstart", rules["training"], "selfrag.training")
    assert not _allowed("selfrag.data_gen.run", rules["inference"], "selfrag.inference")
    assert not _allowed("selfrag.inference.runtime", rules["data_gen"], "selfrag.data_gen")
    assert _allowed("selfrag.inference.engines.base", rules["data_gen"], "selfrag.data_gen")
    assert _allowed("selfrag.config", rules["training"], "selfrag.training")
    assert not _allowed("selfrag.inference.engines", rules["selfrag"], "selfrag")
    assert not _allowed("selfrag.rl.rollout", rules["inference"], "selfrag.inference")  # only app imports rl
    assert not _allowed("selfrag.rl.run", rules["evaluation"], "selfrag.evaluation")
    assert not _allowed("selfrag.app.cli", rules["rl"], "selfrag.rl")
    assert _allowed("selfrag.rl.run", rules["app"], "selfrag.app")


def test_core_imports_no_stage() -> None:
    offenders = [
        f"{path.name}: {module}"
        for path in sorted(CORE.glob("*.py"))
        for module, _ in _imports(path)
        if module.startswith(STAGES)
    ]
    assert offenders == []


def test_training_imports_only_core() -> None:
    offenders = [
        f"{path.name}: {module}"
        for path in sorted((REPO / "training").glob("*.py"))
        for module, _ in _imports(path)
        if module.startswith(("selfrag.data_gen", "selfrag.inference", "selfrag.app"))
    ]
    assert offenders == []


@pytest.mark.parametrize("folder", ["benchmarks", "studies"])
def test_benchmarks_and_studies_import_no_private_name_of_the_package(folder: str) -> None:
    offenders = [
        f"{path.relative_to(REPO)}: from {module} import {name}"
        for path in sorted((REPO / folder).rglob("*.py"))
        for module, names in _imports(path)
        if module.startswith("selfrag")
        for name in names
        if name.startswith("_") or any(part.startswith("_") for part in module.split("."))
    ]
    assert offenders == []


def test_the_package_imports_nothing_outside_it() -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {module}"
        for folder in PACKAGES
        for path in sorted((REPO / folder).rglob("*.py"))
        for module, _ in _imports(path)
        if module.split(".")[0] in OUTSIDE
    ]
    assert offenders == []


def test_the_runtime_algorithm_imports_no_model_library() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert all(f"`{name}`" in page or f"`inference/{name}`" in page for name in ALGORITHM)
    offenders = [
        f"inference/{name}: {module}"
        for name in ALGORITHM
        if (REPO / "inference" / name).is_file()
        for module, _ in _imports(REPO / "inference" / name)
        if module.split(".")[0] in MODEL_LIBRARIES
    ]
    assert offenders == []


def _defines(path: Path, name: str) -> bool:
    """A module-level function, class or (annotated) assignment of ``name`` (a table such as cli's GONE_OPTIONS)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return True
    return False


def _class_has(cls: str, attribute: str) -> bool:
    for folder in PACKAGES:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and node.name == cls:
                    return any(
                        isinstance(item, ast.FunctionDef) and item.name == attribute
                        or isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                        and item.target.id == attribute
                        for item in node.body
                    )
    return False


def test_the_setting_flow_names_code_that_exists() -> None:
    section = PAGE.read_text(encoding="utf-8").split("## Where a setting flows", 1)[1]
    pairs = re.findall(r"`([\w/]+\.py)` `(\w+)`", section)
    assert len(pairs) >= 4
    for file, name in pairs:
        assert (REPO / file).is_file(), file
        assert _defines(REPO / file, name), f"{file} defines no {name}"
    attributes = re.findall(r"`([A-Z]\w+)\.(\w+)`", section)
    assert attributes
    for cls, attribute in attributes:
        assert _class_has(cls, attribute), f"{cls}.{attribute}"
    for file in re.findall(r"`([\w.-]+/[\w/.-]+\.(?:py|yaml))`", section):
        assert (REPO / file).is_file(), file


# -- no import circle ---------------------------------------------------------------------------------------------
# Every module of the package, benchmarks/ and studies/ (whose scripts import their siblings by file name) and what it
# imports, at the top, inside functions and under TYPE_CHECKING alike: a circle hidden by a lazy import is still one.
# A piece two modules share moves to the one below both (or to a third module), never into another lazy import.
SCRIPT_FOLDERS = ("benchmarks", "studies")


def _module_files() -> dict[str, Path]:
    """``{module name: file}``: the package's folders by pyproject's package-dir, the script folders flat."""
    found: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            found[".".join([name, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = path
    for folder in SCRIPT_FOLDERS:
        found |= {f"{folder}.{path.stem}": path for path in sorted((REPO / folder).glob("*.py"))}
    return found


def _imported_modules(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports: ``from a import b`` is ``a.b`` where that is a module, else
    ``a`` (or its nearest known parent); relative imports resolved; a script folder's sibling by its bare name."""
    folder = module.split(".")[0]

    def resolve(name: str) -> str | None:
        if folder in SCRIPT_FOLDERS and f"{folder}.{name.split('.')[0]}" in known:
            name = f"{folder}.{name}"
        parts = name.split(".")
        return next((".".join(parts[:end]) for end in range(len(parts), 0, -1) if ".".join(parts[:end]) in known),
                    None)

    found: set[str | None] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {resolve(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".") if is_package else module.split(".")[:-1]
            target = ".".join([*base[: len(base) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else str(node.module)
            target = resolve(target) or target
            found |= {f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else resolve(target)
                      for alias in node.names}
    return {name for name in found if name is not None and name != module}


def _import_graph() -> dict[str, set[str]]:
    files = _module_files()
    return {module: _imported_modules(module, path.read_text(encoding="utf-8"), path.name == "__init__.py",
                                      set(files))
            for module, path in files.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of two or more modules (Tarjan), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            part = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(part) > 1:
                circles.append(sorted(part))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(circles)


def test_no_import_circle_in_the_package_benchmarks_or_studies() -> None:
    graph = _import_graph()
    assert {"selfrag.corpus", "selfrag.inference.trace", "selfrag.inference.retrievers.index", "selfrag.training.run",
            "benchmarks.gpu_check", "studies.rl_study"} <= set(graph)
    circles = [" <-> ".join(circle) for circle in _circles(graph)]
    assert circles == [], "modules that import each other (lazy imports count): move what they share below both"


def test_the_circle_check_sees_lazy_relative_and_sibling_imports() -> None:
    known = {"selfrag.inference.trace", "selfrag.inference.scoring", "selfrag.inference", "selfrag.retrieval",
             "benchmarks.gpu_check", "benchmarks.gpu_random_init"}
    lazy = "def f():\n    from .scoring import CandidateScore\n"
    assert _imported_modules("selfrag.inference.trace", lazy, False, known) == {"selfrag.inference.scoring"}
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from selfrag.inference import scoring\n"
    assert _imported_modules("selfrag.inference.trace", typed, False, known) == {"selfrag.inference.scoring"}
    assert _imported_modules("selfrag.inference", "from . import trace\n", True, known) == {"selfrag.inference.trace"}
    assert _imported_modules("selfrag.inference.trace", "from selfrag.retrieval import Hit\n", False, known) \
        == {"selfrag.retrieval"}
    sibling = "def g():\n    import gpu_random_init\n"
    assert _imported_modules("benchmarks.gpu_check", sibling, False, known) == {"benchmarks.gpu_random_init"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert _circles(graph) == [["a", "b", "c"]]
