"""Recall@10 of approximate indexes against exact search, on every passage and question the repository ships.

    nice .venv/bin/python benchmarks/retrieval_recall.py                         # all kinds, writes a markdown table
    nice .venv/bin/python benchmarks/retrieval_recall.py --kinds faiss-hnsw32 --work /tmp/recall

The corpus is every shipped passage (data_gen/demo, data_gen/slices/*, tests/assets), ids prefixed by their
source; the queries are every shipped question. Passages and questions are embedded once with all-MiniLM-L6-v2
(``selfrag index kind=dense``, which is also the exact baseline: brute-force inner product). Each kind of
``kinds()`` is then built through ``selfrag index`` from those same vectors and searched with the precomputed
question vectors, so the rows compare the indexes and not the encoder; queries/s is search only (passages read
from the store included), one batch of all questions and one question at a time. A kind is one entry of
``kinds()``: a name and its ``selfrag index`` overrides, so another backend (pgvector) adds a line; the loop
needs of a kind only a retriever with ``search_vectors(vectors, k)``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from selfrag.config import load_config
from selfrag.corpus import load_corpus, load_queries
from selfrag.inference.retrievers.embeddings import SentenceEncoder
from selfrag.inference.retrievers.index import IndexConfig, load_index
from selfrag.inference.retrievers.index_build import build

ROOT = Path(__file__).resolve().parents[1]
K = 10


def kinds(passages: int) -> dict[str, list[str]]:
    """Index kinds: name -> ``selfrag index`` overrides. IVF lists sized to the corpus (about 39+ vectors a list)."""
    lists = max(4, min(4096, passages // 39))
    return {
        "faiss-flat": ["kind=faiss", "faiss_factory=Flat"],
        "faiss-hnsw32-ef16": ["kind=faiss", "faiss_factory=HNSW32"],
        "faiss-hnsw32-ef64": ["kind=faiss", "faiss_factory=HNSW32", "ef_search=64"],
        # rerank=0: the codes alone (a PQ index re-ranks its candidates by default since issue 46)
        f"faiss-ivf{lists}-pq32-nprobe4": ["kind=faiss", f"faiss_factory=IVF{lists},PQ32", "nprobe=4", "rerank=0"],
        f"faiss-ivf{lists}-pq32-nprobe16": ["kind=faiss", f"faiss_factory=IVF{lists},PQ32", "nprobe=16", "rerank=0"],
        f"faiss-ivf{lists}-pq32-nprobe16-rerank200": ["kind=faiss", f"faiss_factory=IVF{lists},PQ32", "nprobe=16",
                                                      "rerank=200"],
        f"faiss-ivf{lists}-flat-nprobe8": ["kind=faiss", f"faiss_factory=IVF{lists},Flat", "nprobe=8"],
    }


def shipped_corpus(path: Path) -> int:
    """Every shipped passage, in one JSONL file, ids prefixed by their source; returns how many."""
    sources = sorted((ROOT / "data_gen").glob("**/corpus.jsonl")) + [ROOT / "tests" / "assets"]
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for source in sources:
            for passage in load_corpus(source):
                row = {**passage.to_json(), "id": f"{source.parent.name}/{source.name}:{passage.id}"}
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
    return count


def shipped_questions() -> list[str]:
    questions = []
    for source in sorted((ROOT / "data_gen").glob("**/queries.jsonl")):
        questions.extend(query.question for query in load_queries(source))
    return list(dict.fromkeys(questions))


class Lookup:
    """The vectors of the exact index, served by text, so every kind indexes the same embeddings."""

    def __init__(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.dimension = vectors.shape[1]
        self._rows = {text: row for row, text in enumerate(texts)}
        self._vectors = vectors

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._vectors[[self._rows[t] for t in texts]], dtype=np.float32)


def timed_search(retriever: Any, queries: np.ndarray) -> tuple[list[list[str]], float, float]:
    started = time.perf_counter()
    hits = retriever.search_vectors(queries, K)
    batch_qps = len(queries) / (time.perf_counter() - started)
    sample = queries[: min(300, len(queries))]
    started = time.perf_counter()
    for vector in sample:
        retriever.search_vectors(vector[None, :], K)
    single_qps = len(sample) / (time.perf_counter() - started)
    return [[hit.passage.id for hit in row] for row in hits], batch_qps, single_qps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/selfrag-recall"))
    parser.add_argument("--kinds", help="comma-separated names of kinds (default: all)")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.work / "corpus.jsonl"
    passages = shipped_corpus(corpus)
    questions = shipped_questions()
    print(f"{passages} passages, {len(questions)} questions; embedding with all-MiniLM-L6-v2")

    # === the exact baseline, and the vectors every kind indexes ===
    encoder = SentenceEncoder()
    started = time.perf_counter()
    base = ["corpus=" + str(corpus), "kind=dense"]
    build(load_config(IndexConfig, None, [*base, f"output={args.work / 'dense'}"]), encoder=encoder)
    embed_seconds = time.perf_counter() - started
    exact = load_index(args.work / "dense", encoder=encoder)
    store_texts = [p.render() for p in exact.passages.by_rows(range(len(exact.passages)))]  # type: ignore[attr-defined]
    lookup = Lookup(store_texts, np.asarray(exact.embeddings))  # type: ignore[attr-defined]
    query_vectors = encoder.encode(questions)
    truth, exact_batch, exact_single = timed_search(exact, query_vectors)

    rows = [("exact (kind=dense, brute force)", 1.0, exact_batch, exact_single, 0.0)]
    chosen = kinds(passages)
    if args.kinds:
        chosen = {name: chosen[name] for name in args.kinds.split(",")}
    for name, overrides in chosen.items():
        started = time.perf_counter()
        output = args.work / name
        build(load_config(IndexConfig, None, [*base, *overrides, f"output={output}"]), encoder=lookup,
             show_progress=False)
        build_seconds = time.perf_counter() - started
        found, batch_qps, single_qps = timed_search(load_index(output, encoder=lookup), query_vectors)
        recall = np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)])
        rows.append((name, float(recall), batch_qps, single_qps, build_seconds))

    lines = [
        f"{passages} passages, {len(questions)} questions, all-MiniLM-L6-v2 (384 dimensions; embedding the corpus "
        f"took {embed_seconds:.0f} s, {passages / embed_seconds:.0f} passages/s)",
        "",
        f"| index | recall@{K} vs exact | queries/s (one batch) | queries/s (one at a time) | build s |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {n} | {r:.3f} | {b:,.0f} | {s:,.0f} | {t:.1f} |" for n, r, b, s, t in rows]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
