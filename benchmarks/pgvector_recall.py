"""pgvector HNSW against exact search: recall@10 and queries/s on real text (every shipped corpus, all embedded).

    .venv/bin/python benchmarks/pgvector_recall.py                         # a throwaway server from pgserver
    .venv/bin/python benchmarks/pgvector_recall.py --url 'postgresql://u@db/rag' --queries 1000

Every passage of the shipped corpora (data_gen/demo and data_gen/slices/*) is embedded once with the default
encoder (all-MiniLM-L6-v2); the same vectors go into a pgvector table (HNSW, m=16, ef_construction=64) and
into a numpy matrix for exact search. Queries are the shipped questions, embedded once, so only the search is
timed: the baseline is exact search in the same process (numpy brute force, and PostgreSQL with the index
disabled); each HNSW row gives recall@10 against the numpy top 10 and its queries/s as a ratio to the
exact rows. A kind of its own, not one of FAISS's: it needs the server (``--url``, or pgserver's binaries).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
K = 10


def shipped() -> tuple[list, list[str]]:  # type: ignore[type-arg]
    from selfrag.corpus import load_corpus
    from selfrag.trajectory import Passage

    passages, questions = [], []
    for folder in [REPO / "data_gen" / "demo", *sorted((REPO / "data_gen" / "slices").iterdir())]:
        if not (folder / "corpus.jsonl").is_file():
            continue
        for passage in load_corpus(folder / "corpus.jsonl"):
            passages.append(Passage(f"{folder.name}/{passage.id}", passage.title, passage.text))
        for line in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines():
            questions.append(json.loads(line)["question"])
    return passages, questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="postgresql://... of a server with pgvector (default: start one from pgserver)")
    parser.add_argument("--queries", type=int, default=500, help="questions searched (the first N, all corpora)")
    parser.add_argument("--cache", type=Path, help="a folder to keep the embeddings in between runs")
    parser.add_argument("--batch", type=int, default=32, help="queries per search_many round trip")
    args = parser.parse_args()

    from selfrag.inference.retrievers.embeddings import SentenceEncoder
    from selfrag.inference.retrievers.localpg import LocalPostgres

    passages, questions = shipped()
    questions = questions[: args.queries]
    encoder = SentenceEncoder("all-minilm-l6-v2", device="cpu")  # what the table records; the queries' encoder too
    started = time.monotonic()
    cache = args.cache / f"embeddings-{len(passages)}-{len(questions)}.npz" if args.cache else None
    if cache is not None and cache.is_file():
        stored = np.load(cache)
        matrix, queries = stored["passages"], stored["queries"]
    else:
        texts = [f"{p.title}\n{p.text}" if p.title else p.text for p in passages]
        matrix = np.asarray(encoder.encode(texts), dtype=np.float32)
        queries = np.asarray(encoder.encode(questions), dtype=np.float32)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cache, passages=matrix, queries=queries)
    print(f"embedded {len(passages)} passages and {len(questions)} questions in {time.monotonic() - started:.0f} s")

    server = None
    if args.url is None:
        server = LocalPostgres(Path(tempfile.mkdtemp(prefix="selfrag-pgbench-"))).start()
    try:
        url = args.url or server.url()  # type: ignore[union-attr]
        rows = measure(url + ("&" if "?" in url else "?") + "table=recall_bench", passages, matrix, queries, args.batch)
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.directory, ignore_errors=True)
    print(f"\n{len(passages)} passages (all shipped corpora), {len(questions)} queries, k={K}, batch {args.batch}\n")
    print("| search | recall@10 | queries/s | vs numpy exact |")
    print("|---|---|---|---|")
    base = rows[0][2]
    for name, recall, rate in rows:
        print(f"| {name} | {recall:.3f} | {rate:,.0f} | {rate / base:.2f}x |")


def measure(url: str, passages: list, matrix: np.ndarray, queries: np.ndarray, batch: int) -> list:  # type: ignore[type-arg]
    from selfrag.inference.retrievers.pgvector import PgVectorRetriever
    from selfrag.inference.retrievers.pgvector_build import PgBuild, load

    offsets = {p.id: i for i, p in enumerate(passages)}
    started = time.monotonic()
    load(PgBuild(url, "all-minilm-l6-v2", batch_size=512), passages,
         lambda chunk: matrix[[offsets[p.id] for p in chunk]], matrix.shape[1])
    print(f"loaded and indexed in {time.monotonic() - started:.1f} s")

    started = time.monotonic()
    scores = queries @ matrix.T  # (queries, passages)
    exact = np.argsort(-scores, axis=1, kind="stable")[:, :K]
    rows = [("numpy exact (brute force)", 1.0, len(queries) / (time.monotonic() - started))]
    truth = [{passages[i].id for i in row} for row in exact]

    def run(retriever: PgVectorRetriever) -> tuple[float, float]:
        retriever.search_vectors(queries[:batch], K)  # warm the cache
        started = time.monotonic()
        found = []
        for first in range(0, len(queries), batch):
            found += retriever.search_vectors(queries[first : first + batch], K)
        rate = len(queries) / (time.monotonic() - started)
        recall = float(np.mean([len({h.passage.id for h in hits} & want) / K for hits, want in zip(found, truth,
                                                                                                    strict=True)]))
        return recall, rate

    exact_pg = PgVectorRetriever(url, mode="lexical")  # lexical: opens no encoder; vectors are given
    exact_pg._connection.execute("SET enable_indexscan = off")
    rows.append(("pgvector exact (index off)", *run(exact_pg)))
    for ef_search in (10, 20, 40, 100, 200):
        retriever = PgVectorRetriever(url, mode="lexical", ef_search=ef_search)
        plan = retriever._connection.execute(
            "EXPLAIN SELECT id FROM recall_bench ORDER BY embedding <#> %s::vector LIMIT 10",
            (str(queries[0].tolist()),),
        ).fetchall()
        assert any("recall_bench_hnsw" in line[0] for line in plan), plan  # the HNSW index serves the query
        rows.append((f"pgvector HNSW ef_search={ef_search}", *run(retriever)))
        retriever.close()
    return rows


if __name__ == "__main__":
    main()
