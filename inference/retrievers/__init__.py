"""Retrievers for the runtime, behind a plain dict.

    retriever = RETRIEVERS["bm25"](corpus="data/corpus.jsonl")
    hits = retriever.search("who wrote Hamlet?", k=3)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from selfrag.corpus import load_corpus
from selfrag.retrieval import BM25Retriever, Hit, Retriever


def build_bm25(corpus: str | Path, stemmer_language: str | None = "english") -> BM25Retriever:
    """BM25 over a corpus file or folder (see :func:`selfrag.corpus.load_corpus`)."""
    return BM25Retriever(load_corpus(corpus), stemmer_language=stemmer_language)


#: Retriever name -> factory taking its keyword options.
RETRIEVERS: dict[str, Callable[..., Retriever]] = {"bm25": build_bm25}

__all__ = ["RETRIEVERS", "Hit", "Retriever", "build_bm25"]
