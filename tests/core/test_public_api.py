"""The public API: ``from selfrag import SelfRAG, load_engine, open_retriever, InferenceConfig``, imported lazily.

The README's five-line example is run here as written, on the tiny model (only the model folder is swapped).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import get_overloads, get_type_hints

import pytest

import selfrag
from selfrag.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_importing_selfrag_loads_no_stage_and_no_model_library() -> None:
    code = ("import sys, selfrag; print(sorted(m for m in sys.modules if m.startswith(('selfrag.', 'torch', "
            "'transformers', 'fastapi'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_the_public_names_are_the_objects_their_modules_define() -> None:
    from selfrag.inference.config import InferenceConfig
    from selfrag.inference.engines import load_engine
    from selfrag.inference.retrievers.spec import open_retriever
    from selfrag.inference.runtime import SelfRAG

    assert selfrag.SelfRAG is SelfRAG and selfrag.InferenceConfig is InferenceConfig
    assert selfrag.load_engine is load_engine and selfrag.open_retriever is open_retriever
    assert {"SelfRAG", "load_engine", "open_retriever", "InferenceConfig"} <= set(selfrag.__all__) <= set(dir(selfrag))
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        selfrag.Nothing  # noqa: B018


def test_type_checkers_see_every_public_name_from_its_module() -> None:
    """The ``if TYPE_CHECKING:`` block of selfrag/__init__.py re-exports exactly ``_PUBLIC``, from the same modules."""
    tree = ast.parse((REPO / "selfrag" / "__init__.py").read_text(encoding="utf-8"))
    [block] = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    seen = {alias.name: statement.module for statement in block.body if isinstance(statement, ast.ImportFrom)
            for alias in statement.names if alias.asname == alias.name}
    assert seen == selfrag._PUBLIC


def test_open_retriever_is_typed_not_none_when_a_corpus_or_index_is_named() -> None:
    from selfrag.inference.retrievers.spec import open_retriever
    from selfrag.retrieval import Retriever

    returns = [get_type_hints(overload)["return"] for overload in get_overloads(open_retriever)]
    assert returns == [Retriever, Retriever, Retriever | None]
    assert [sorted(inspect.signature(overload).parameters) for overload in get_overloads(open_retriever)][:2] == [
        ["corpus", "field", "spec"], ["field", "index", "spec"]]


def test_load_engine_names_a_wrong_option_or_engine() -> None:
    with pytest.raises(ConfigError) as caught:
        selfrag.load_engine("unused", devic="cpu", dtype="float64")
    assert caught.value.problems == [
        "unknown engine option engine_options.devic (did you mean device?); engine=hf takes device, dtype, batch_size, "
        "seed",
        "engine_options.dtype must be one of ['auto', 'float32', 'bfloat16', 'float16'], got 'float64'",
    ]
    with pytest.raises(ConfigError, match="engine must be one of hf, vllm, openai, got 'fake'"):
        selfrag.load_engine("unused", "fake")


def _readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    [example] = [block for block in blocks if block.startswith("from selfrag import")]
    return example


def test_the_readme_example_runs_as_written_on_the_tiny_model(merged_model_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    example = _readme_example()
    assert len([line for line in example.splitlines() if line.strip()]) == 5
    assert '"selfrag-quickstart/model"' in example
    model = merged_model_dir(0)
    monkeypatch.chdir(REPO)  # the example names the demo corpus relative to the checkout
    printed = io.StringIO()
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(printed):
        exec(example.replace('"selfrag-quickstart/model"', repr(str(model))), namespace)  # noqa: S102
    answer = namespace["answer"]
    assert isinstance(answer, selfrag.Answer) and answer.question == "What did Guo Shoujing do for calendars?"
    assert answer.to_json()["trace"] and answer.to_json()["trace"][0]["step"] == "decide"
    assert printed.getvalue().startswith(answer.answer) and str(answer.low_confidence) in printed.getvalue()
