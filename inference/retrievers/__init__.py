"""Retrievers for the runtime, behind a plain dict.

    retriever = RETRIEVERS["bm25"](corpus="data/corpus.jsonl")
    retriever = RETRIEVERS["dense"](corpus="data/corpus.jsonl")       # sentence-transformers all-MiniLM-L6-v2
    retriever = load_index("runs/index")                             # built once by `selfrag index`
    retriever = load_index("runs/faiss", nprobe=64)                  # a FAISS index, searched wider
    retriever = load_index("runs/wiki", rerank=400)                  # IVF-PQ, 400 candidates re-ranked exactly
    hits = retriever.search("who wrote Hamlet?", k=3)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selfrag.corpus import load_corpus
from selfrag.retrieval import BM25Retriever, Hit, Retriever

if TYPE_CHECKING:
    from .index import load_index


def build_bm25(corpus: str | Path | Sequence[str | Path], stemmer_language: str | None = "english",
               **chunking: int) -> BM25Retriever:
    """BM25 over a corpus file or folder, or several joined (see :func:`selfrag.corpus.load_corpus`; ``chunking``: its
    chunk_words and chunk_overlap for a folder)."""
    return BM25Retriever(load_corpus(corpus, **chunking), stemmer_language=stemmer_language)


def build_dense(corpus: str | Path | Sequence[str | Path], chunk_words: int = 200, chunk_overlap: int = 40,
                **options: Any) -> Retriever:
    """Dense retrieval over a corpus file or folder, or several joined (options: model, batch_size, device; a folder is
    cut into ``chunk_words``-word passages sharing ``chunk_overlap`` words)."""
    from .dense import DenseRetriever

    return DenseRetriever(load_corpus(corpus, chunk_words, chunk_overlap), **options)


def __getattr__(name: str) -> Any:
    # load_index is :func:`selfrag.inference.retrievers.index.load_index` itself, imported on first use: that module
    # brings NumPy, which importing this package does not need
    if name == "load_index":
        from .index import load_index

        return load_index
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Retriever name -> factory taking its keyword options.
RETRIEVERS: dict[str, Callable[..., Retriever]] = {"bm25": build_bm25, "dense": build_dense}

__all__ = ["RETRIEVERS", "Hit", "Retriever", "build_bm25", "build_dense", "load_index"]
