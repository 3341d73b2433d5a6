"""One retriever section for every stage, and the one function that opens it.

    retriever.index=runs/index                                        # any kind built by `selfrag index`
    retriever.url='postgresql://user@db:5432/rag?table=wiki'          # pgvector, shared by every process
    retriever.corpus=data/corpus.jsonl retriever.kind=bm25            # small corpora: built in memory now
    retriever.corpus=notes/ retriever.chunk_words=120                 # a folder of .txt/.md/.pdf, cut into passages

``generate``, ``eval``, ``calibrate``, ``rl``, ``ask`` and ``serve`` all call :func:`open_retriever`, so the same
index gives the same hits whichever stage asks, and every command spells it the same way: this section. A
``--corpus`` / ``--index`` option or a top-level ``corpus=`` / ``index=`` key is refused with this spelling in the
message (generate's data set's passages are ``passages=``: gold passages, the source of written questions; ``selfrag
index corpus=`` is what to build). A prebuilt index (``index`` or ``url``) is the way for anything beyond a few thousand
passages: every worker, shard and replica opens it instead of building its own.
Keep the password out of the URL (it is written into each run's config.yaml): set PGPASSWORD or use ~/.pgpass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

from selfrag.config import help_field
from selfrag.errors import ConfigError
from selfrag.retrieval import Retriever

URL_SCHEMES = ("postgresql://", "postgres://")
#: a command's top-level keys that once named its retriever (a config's ``REMOVED_KEYS``): what to write instead
RETRIEVER_KEYS = {
    "corpus": "write retriever.corpus=FILE (BM25 built now); every command names its retriever in the retriever "
              "section",
    "index": "write retriever.index=DIR, or retriever.url=postgresql://...?table=NAME for pgvector; every command "
             "names its retriever in the retriever section",
}


@dataclass
class RetrieverConfig:
    """Where passages come from: a prebuilt index (``index`` or ``url``), or a corpus indexed in memory now."""

    index: str | None = help_field(
        "a prebuilt index directory from `selfrag index` (bm25, dense or any later kind); the documented way", None
    )
    url: str | None = help_field(
        "a pgvector index loaded by `selfrag index kind=pgvector`: postgresql://user@host:5432/db?table=NAME "
        "(password: PGPASSWORD or ~/.pgpass, not the URL)",
        None,
    )
    corpus: str | None = help_field(
        "small corpora only: a corpus file or folder indexed in memory at start-up (by retriever.kind)", None
    )
    kind: Literal["bm25", "dense"] | None = help_field("with corpus=: bm25 (default) or dense", None)
    chunk_words: int | None = help_field(
        "with corpus= a folder: words per passage cut from a .txt/.md/.pdf file (null: 200); an index was cut when "
        "it was built (selfrag index chunk_words=N)", None
    )
    chunk_overlap: int | None = help_field(
        "with corpus= a folder: words shared by consecutive passages of a file (null: 40)", None
    )
    mode: Literal["dense", "lexical", "hybrid"] | None = help_field(
        "with url=: dense (HNSW, default), lexical (PostgreSQL full text) or hybrid (both, reciprocal rank fusion)",
        None,
    )
    ef_search: int | None = help_field("with url=: HNSW ef_search (default 100; higher: better recall, slower)", None)
    model: str | None = help_field(
        "query embedding model; null: the one the index records (a different dimension is refused)", None
    )

    def validate(self) -> list[str]:
        # the config loader prefixes each problem with the section's name
        return [problem.removeprefix("retriever.") for problem in spec_problems(self)]

    def is_set(self) -> bool:
        return any(value is not None for value in (self.index, self.url, self.corpus))


def spec_problems(spec: RetrieverConfig, field: str = "retriever") -> list[str]:
    """Contradictory or misplaced settings, one line each."""
    given = [name for name in ("index", "url", "corpus") if getattr(spec, name) is not None]
    problems = []
    if len(given) > 1:
        problems.append(
            f"{field}.{given[1]}: set one of index, url, corpus, got {' and '.join(given)}; keep the prebuilt index "
            f"({field}.index or {field}.url) and drop the other"
        )
    if spec.url is not None and not spec.url.startswith(URL_SCHEMES):
        problems.append(f"{field}.url must start with postgresql://, got {spec.url!r}; a folder goes in {field}.index")
    if spec.kind is not None and spec.corpus is None:
        problems.append(f"{field}.kind applies to {field}.corpus only (an index records its kind); drop it")
    for name in ("chunk_words", "chunk_overlap"):
        if getattr(spec, name) is not None and spec.corpus is None:
            problems.append(f"{field}.{name} applies to {field}.corpus (a folder) only: an index was cut into passages "
                            f"when it was built; rebuild it with selfrag index ... {name}=N")
    words, overlap = spec.chunk_words or 200, spec.chunk_overlap if spec.chunk_overlap is not None else 40
    if (spec.chunk_words is not None or spec.chunk_overlap is not None) and (words < 1 or not 0 <= overlap < words):
        problems.append(f"{field}.chunk_overlap must be in [0, chunk_words), got chunk_words={words}, "
                        f"chunk_overlap={overlap}; e.g. {field}.chunk_words=200 {field}.chunk_overlap=40")
    for name in ("mode", "ef_search"):
        if getattr(spec, name) is not None and spec.url is None:
            problems.append(f"{field}.{name} applies to {field}.url (pgvector) only; drop it or set {field}.url")
    if spec.ef_search is not None and spec.ef_search < 1:
        problems.append(f"{field}.ef_search must be >= 1, got {spec.ef_search}; e.g. 100")
    return problems


def merge_legacy(
    spec: RetrieverConfig | None, corpus: str | Path | None = None, index: str | Path | None = None,
    field: str = "retriever",
) -> RetrieverConfig:
    """A stage's older top-level ``corpus=`` / ``index=`` as a retriever section; refused beside a section."""
    spec = spec if spec is not None else RetrieverConfig()
    legacy = {"corpus": corpus, "index": index}
    given = {name: str(value) for name, value in legacy.items() if value is not None}
    if given and spec.is_set():
        names = " and ".join(f"{name}=" for name in given)
        raise ConfigError(
            [f"{names} and the {field} section both say where passages come from; keep one ({field}.index for a "
             "prebuilt index)"]
        )
    if len(given) > 1:
        raise ConfigError(["give one of corpus= (built in memory now) or index= (prebuilt), not both"])
    if "index" in given and given["index"].startswith(URL_SCHEMES):
        return RetrieverConfig(url=given["index"])
    if "index" in given:
        return RetrieverConfig(index=given["index"])
    if "corpus" in given:
        return RetrieverConfig(corpus=given["corpus"])
    return spec


@overload
def open_retriever(
    spec: RetrieverConfig | None = None, *, corpus: str | Path, field: str = "retriever"
) -> Retriever: ...


@overload
def open_retriever(
    spec: RetrieverConfig | None = None, *, index: str | Path, field: str = "retriever"
) -> Retriever: ...


@overload
def open_retriever(
    spec: RetrieverConfig | None = None, corpus: str | Path | None = None, index: str | Path | None = None,
    field: str = "retriever", more: Sequence[str | Path] = (),
) -> Retriever | None: ...


def open_retriever(
    spec: RetrieverConfig | None = None, corpus: str | Path | None = None, index: str | Path | None = None,
    field: str = "retriever", more: Sequence[str | Path] = (),
) -> Retriever | None:
    """The retriever a stage's settings name (None when none is named); every stage opens retrievers here.

    From Python (``selfrag.open_retriever``): ``open_retriever(index="runs/index")`` or ``open_retriever(corpus=
    "corpus.jsonl")`` (BM25 built now), typed as a :class:`Retriever` (never None: both name one), or a
    :class:`RetrieverConfig`, which may name none (a stage's optional section). ``more``: further passage files
    joined to the corpus in the one in-memory index (ids unique across them; ``selfrag rl``'s ``more_passages``)."""
    spec = merge_legacy(spec, corpus, index, field)
    problems = spec_problems(spec, field)
    if more and spec.corpus is None:
        problems.append(f"further passage files join {field}.corpus, searched in memory; a prebuilt index holds what "
                        f"it was built from: build one index of every passage file, or use {field}.corpus")
    if problems:
        raise ConfigError(problems)
    if spec.index is not None and spec.index.startswith(URL_SCHEMES):
        spec = RetrieverConfig(url=spec.index, model=spec.model)
    if spec.url is not None:
        from .pgvector import PgVectorRetriever

        return PgVectorRetriever(spec.url, mode=spec.mode or "dense", ef_search=spec.ef_search or 100, model=spec.model)
    if spec.index is not None:
        from .index import load_index

        retriever = load_index(spec.index)
        _check_model(retriever, spec, field)
        return retriever
    if spec.corpus is not None:
        from . import RETRIEVERS

        options: dict[str, Any] = {"model": spec.model} if spec.model and spec.kind == "dense" else {}
        options.update({name: value for name in ("chunk_words", "chunk_overlap")
                        if (value := getattr(spec, name)) is not None})
        return RETRIEVERS[spec.kind or "bm25"]([spec.corpus, *more] if more else spec.corpus, **options)
    return None


def _check_model(retriever: Retriever, spec: RetrieverConfig, field: str) -> None:
    recorded = getattr(retriever, "model_name", None)
    if spec.model is not None and recorded is not None and spec.model != recorded:
        raise ConfigError(
            [f"{field}.model={spec.model!r} but the index {spec.index} was embedded with {recorded!r}; "
             f"unset {field}.model or rebuild the index with embedding_model={spec.model}"]
        )
