"""``selfrag index``: corpus -> passage store -> (bm25 | embeddings -> dense | faiss) in a resumable build folder.

    selfrag index corpus=data/corpus.jsonl output=runs/faiss kind=faiss          # Flat, or IVF-PQ re-ranked at scale

The build streams: the corpus is read line by line into the SQLite passage store, the embeddings and BM25's
tokens are computed from the store a shard at a time, so resident memory does not grow with a list of passages.

The build runs in ``.<output>.building`` beside the output. ``build.json`` there holds the fingerprint of everything
the embeddings depend on (the corpus's SHA-256, the format, the embedding model, pooling, normalisation, batch size,
shard size, device). Run again after a kill, the same fingerprint resumes: the passage store is kept, finished
embedding shards are not recomputed, a FAISS index trained by the killed run is read back (``trained.faiss``, keyed
by factory, sample size and seed), and the vectors are added again from the embeddings (with the float16 copy that
re-ranking reads). A different fingerprint discards the folder, with a warning naming what changed, so old and new
results never mix. At the end the folder is renamed onto the output.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from selfrag.config import to_dict, write_resolved
from selfrag.corpus import iter_corpus
from selfrag.corpus_stream import duplicate_error, scan_corpus
from selfrag.errors import InputError
from selfrag.fsutil import (
    OWNER_FILE,
    check_output_path,
    claim_output,
    file_blocks,
    hold_output,
    stream_digest,
    write_owner,
)
from selfrag.passages import PassageStore, write_store
from selfrag.retrieval import BM25Retriever
from selfrag.trajectory import Passage

from .embeddings import SentenceEncoder, TextEncoder, embed_store
from .index import INDEX_FILE, INDEX_VERSION, STORE_FILE, IndexConfig, corpus_stamp

logger = logging.getLogger(__name__)

BUILD_FILE = "build.json"
EMBEDDINGS_FILE = "embeddings.npy"
_EMBEDDING_SETTINGS = ("embedding_model", "pooling", "normalize", "batch_size", "shard_size", "device")


@dataclass(frozen=True)
class IndexResult:
    path: Path
    kind: str
    passages: int
    seconds: float

    def summary(self) -> str:
        return f"{self.kind} index of {self.passages} passages written to {self.path} in {self.seconds:.1f} s"


def run(config: IndexConfig) -> IndexResult:
    """Build the index of ``config.corpus`` into ``config.output`` (:func:`build`; pgvector: a database table)."""
    if config.kind == "pgvector":
        return _run_pgvector(config)
    return build(config)


def _run_pgvector(config: IndexConfig) -> IndexResult:
    from .pgvector import parse_url
    from .pgvector_build import PgBuild
    from .pgvector_build import build as build_table

    started = time.monotonic()
    corpus = Path(config.corpus)
    passages = scan_corpus(corpus, config.chunk_words, config.chunk_overlap)  # checked and counted, not held
    fingerprint = {"path": str(corpus.resolve()), "sha256": corpus_digest(corpus),
                   "chunk_words": config.chunk_words, "chunk_overlap": config.chunk_overlap}
    spec = PgBuild(
        config.output, config.embedding_model, config.batch_size, config.device, config.hnsw_m,
        config.hnsw_ef_construction, fingerprint, config.maintenance_work_mem,
    )
    build_table(spec, passages)
    target = parse_url(config.output, field="output")
    return IndexResult(Path(f"{target.where}?table={target.table}"), config.kind, len(passages),
                       time.monotonic() - started)


def build(config: IndexConfig, encoder: TextEncoder | None = None, show_progress: bool = True) -> IndexResult:
    """Build (or resume building) the index of ``config.corpus`` into ``config.output``."""
    started = time.monotonic()
    corpus, output = Path(config.corpus), Path(config.output)
    if not corpus.exists():
        raise InputError(f"corpus {str(corpus)!r} does not exist; give a JSONL file or a folder of .txt/.md files")
    # The build replaces ``output`` whole: refuse, before any work, one that holds the corpus or anything but an
    # index this command wrote (a user's folder with the corpus in it was deleted here once).
    check_output_path(output, key="output", inputs=[corpus])
    with hold_output(output, "index", key="output"):  # a second build of the same output is refused
        claim_output(output, "index", replaces=True, mark=False)
        work = output.parent / f".{output.name}.building"
        work.mkdir(parents=True, exist_ok=True)
        fingerprint = _fingerprint(config, corpus)
        _prepare(work, fingerprint)
        store = _passage_store(work, corpus, config, show_progress)
        config = _build_kind(config, work, store, encoder, show_progress)
        meta = {
            "version": INDEX_VERSION,
            "kind": config.kind,
            "passages": len(store),
            "corpus": {"path": str(corpus.resolve()), "sha256": fingerprint["corpus_sha256"],
                       "stamp": corpus_stamp(corpus)},
            "options": {k: v for k, v in to_dict(config).items() if k not in ("corpus", "output")},
        }
        (work / INDEX_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        write_resolved(config, work)
        kept = [entry.name for entry in work.iterdir() if entry.name not in (OWNER_FILE, *_leftovers(config))]
        write_owner(work, "index", kept)
        if output.exists():
            shutil.rmtree(output)
        os.replace(work, output)
        for leftover in _leftovers(config):  # after the rename: a kill before it must still find the embeddings
            (output / leftover).unlink(missing_ok=True)
    return IndexResult(output, config.kind, len(store), time.monotonic() - started)


def _leftovers(config: IndexConfig) -> list[str]:
    """What the build keeps only until the index is in place (removed after the rename)."""
    faiss = [EMBEDDINGS_FILE, "trained.faiss", "trained.json"] if config.kind == "faiss" else []
    return [BUILD_FILE, EMBEDDINGS_FILE + ".done", *faiss]


def _build_kind(
    config: IndexConfig, work: Path, store: PassageStore, encoder: TextEncoder | None, show_progress: bool
) -> IndexConfig:
    """Build the kind's files; returns ``config`` with what was picked for it (the FAISS factory and settings)."""
    if config.kind == "bm25":  # tokenized from the store in batches (see selfrag.retrieval.tokenize_corpus)
        BM25Retriever(store, stemmer_language=config.stemmer_language or None).save(work)
        return config
    if encoder is None:
        owned = SentenceEncoder(config.embedding_model, device=config.device, batch_size=config.batch_size,
                                pooling=config.pooling, normalize=config.normalize)
        try:
            return _build_vectors(config, work, store, owned, show_progress)
        finally:
            owned.close()
    return _build_vectors(config, work, store, encoder, show_progress)


def _build_vectors(
    config: IndexConfig, work: Path, store: PassageStore, encoder: TextEncoder, show_progress: bool
) -> IndexConfig:
    if config.kind == "faiss":
        from .faiss_index import check_trainable, make_index, set_search_parameters
        from .faiss_plan import plan_faiss

        # the factory is picked by corpus size unless given; a bad factory string or search setting fails before
        # hours of embedding
        plan = plan_faiss(config.faiss_factory, len(store), encoder.dimension, config.nlist, config.pq_bytes,
                          config.nprobe, config.rerank)
        config = replace(config, faiss_factory=plan.factory, nlist=None, pq_bytes=None, nprobe=plan.nprobe,
                         rerank=plan.rerank)
        where = f"faiss_factory={plan.factory}"
        empty = make_index(plan.factory, encoder.dimension)
        set_search_parameters(empty, plan.nprobe, config.ef_search, where)
        if not empty.is_trained:
            check_trainable(empty, plan.factory, min(len(store), config.train_size))
        logger.info("faiss index %s (nprobe %s, rerank %d) for %d passages", plan.factory, plan.nprobe, plan.rerank,
                    len(store))
    embeddings = embed_store(store, work / EMBEDDINGS_FILE, encoder, config.shard_size, show_progress)
    if config.kind == "faiss":
        from .faiss_index import FAISS_FILE, TRAINED_FILE, VECTORS_FILE, build_faiss, import_faiss

        (work / VECTORS_FILE).unlink(missing_ok=True)  # of an earlier try with other settings: rewritten or dropped
        index = build_faiss(embeddings, plan.factory, config.train_size, config.seed, show_progress,
                            vectors_path=work / VECTORS_FILE if plan.rerank else None,
                            trained_path=work / TRAINED_FILE)
        set_search_parameters(index, plan.nprobe, config.ef_search, where)
        import_faiss().write_index(index, str(work / FAISS_FILE))
    return config


def _passage_store(work: Path, corpus: Path, config: IndexConfig, show_progress: bool) -> PassageStore:
    """The corpus streamed into ``passages.sqlite`` (never a list of passages: memory does not grow with it).

    Each line is checked as it is read; a second passage of an id is refused by the store's key and reported with
    both corpus lines. Written atomically: present means complete, and a resumed build keeps it.
    """
    from tqdm import tqdm

    path = work / STORE_FILE
    if not path.is_file():
        chunking = (config.chunk_words, config.chunk_overlap)
        records = iter_corpus(corpus, *chunking)
        with tqdm(unit="passage", desc="passages", disable=not show_progress) as bar:
            write_store(path, _counted(records, bar),
                        duplicate=lambda passage_id: duplicate_error(corpus, passage_id, *chunking))
    return PassageStore(path)


def _counted(records: Iterable[tuple[str, Passage]], bar: Any) -> Iterator[Passage]:
    for _, passage in records:
        bar.update()
        yield passage


def _prepare(work: Path, fingerprint: dict[str, Any]) -> None:
    """Keep ``work`` when it was started with this fingerprint; else empty it, saying what changed."""
    record = work / BUILD_FILE
    if record.is_file():
        try:
            previous = json.loads(record.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            previous = {}
        if previous == fingerprint:
            logger.info("resuming the build in %s", work)
            return
        changed = sorted(k for k in set(previous) | set(fingerprint) if previous.get(k) != fingerprint.get(k))
        logger.warning("discarding the unfinished build in %s: %s changed since it started", work, ", ".join(changed))
    for child in work.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    record.write_text(json.dumps(fingerprint, indent=2) + "\n", encoding="utf-8")


def _fingerprint(config: IndexConfig, corpus: Path) -> dict[str, Any]:
    settings = to_dict(config)
    fingerprint = {"version": INDEX_VERSION, "kind": config.kind, "corpus_sha256": corpus_digest(corpus),
                   "chunk_words": config.chunk_words, "chunk_overlap": config.chunk_overlap}
    if config.kind in ("dense", "faiss"):
        fingerprint.update({name: settings[name] for name in _EMBEDDING_SETTINGS})
    return fingerprint


def corpus_digest(corpus: Path) -> str:
    """SHA-256 of a corpus file, or of a folder's file names and contents (read once per build, never on open), as
    bare hex: the value ``build.json``, ``index.json`` and pgvector's build row have always held, so an index or an
    unfinished build made before stays comparable (a changed value discards an unfinished build, never reuses it)."""
    files = sorted(p for p in corpus.rglob("*") if p.is_file()) if corpus.is_dir() else [corpus]

    def pieces() -> Iterator[bytes]:
        for file in files:
            if corpus.is_dir():
                yield f"{file.relative_to(corpus)}\0".encode()
            yield from file_blocks(file)

    return stream_digest(pieces()).removeprefix("sha256:")
