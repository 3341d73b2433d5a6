"""selfrag: reflection-token Self-RAG — data generation, LoRA training and a branching runtime.

    from selfrag import InferenceConfig, SelfRAG, load_engine, open_retriever

    rag = SelfRAG(load_engine("runs/quickstart/model"), open_retriever(corpus="corpus.jsonl"), InferenceConfig(top_k=3))
    answer = rag.answer("Who ruled Normandy?")    # answer.answer, .citations, .abstained, .low_confidence, .trace

The public names are imported on first use (module ``__getattr__``, by the module paths in ``_PUBLIC``):
``import selfrag`` loads no stage and no model library, so the core stays light and imports no stage
(docs/ARCHITECTURE.md; tests/core/test_public_api.py). Type checkers and IDEs read the same names from the
``TYPE_CHECKING`` imports below, which never run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # _PUBLIC's names as explicit re-exports, for type checkers only (test_public_api keeps them equal)
    from selfrag.inference.answer import Answer as Answer
    from selfrag.inference.config import InferenceConfig as InferenceConfig
    from selfrag.inference.engines import load_engine as load_engine
    from selfrag.inference.retrievers.spec import open_retriever as open_retriever
    from selfrag.inference.runtime import SelfRAG as SelfRAG

__version__ = "0.1.0"

#: public name -> the module that defines it (imported when the name is first read)
_PUBLIC: dict[str, str] = {
    "SelfRAG": "selfrag.inference.runtime",
    "InferenceConfig": "selfrag.inference.config",
    "load_engine": "selfrag.inference.engines",
    "open_retriever": "selfrag.inference.retrievers.spec",
    "Answer": "selfrag.inference.answer",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'selfrag' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next read is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
