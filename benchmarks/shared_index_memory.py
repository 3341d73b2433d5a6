"""Peak memory of two `selfrag generate` workers: each building BM25 (before) vs sharing one prebuilt index.

    .venv/bin/python benchmarks/shared_index_memory.py --passages 200000 --work /tmp/shared-index

The corpus is the demo corpus plus N synthetic passages (80 words each, drawn with a fixed seed from a Zipf
distribution over 50,000 made-up words, so BM25's vocabulary and postings grow as real text's do). Two shards
(``shard=0/2`` and ``1/2``, 300 demo questions each, labeler=gold) run at the same time, three ways:

* before: ``passages=FILE`` -- each worker builds BM25 over the whole corpus;
* after, index: ``retriever.index=DIR`` -- built once by ``selfrag index``, opened (memory-mapped) by each;
* after, pgvector: ``retriever.url=postgresql://...`` mode=lexical -- one table in a PostgreSQL server (the
  throwaway one from pgserver), searched by both; its vectors are synthetic (lexical mode does not read them).

Peak RSS of each worker comes from /usr/bin/time; the before and index runs must write identical records.
labeler=gold still loads the corpus in each worker (gold passages by id); labeler=llm with queries needs none.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SELFRAG = [sys.executable, "-m", "selfrag.app.cli"]


def write_corpus(path: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    vocabulary = np.array([f"w{index:05d}x" for index in range(50_000)])
    with path.open("w", encoding="utf-8") as handle:
        handle.write((REPO / "data_gen" / "demo" / "corpus.jsonl").read_text(encoding="utf-8"))
        for start in range(0, count, 10_000):
            size = min(10_000, count - start)
            words = vocabulary[np.minimum(rng.zipf(1.2, size=(size, 80)) - 1, len(vocabulary) - 1)]
            for offset, row in enumerate(words):
                number = start + offset
                handle.write(json.dumps({"id": f"synth-{number}", "title": f"Synthetic {number // 50}",
                                         "text": " ".join(row)}) + "\n")


def workers(label: str, work: Path, corpus: Path, extra: list[str]) -> list[tuple[float, float]]:
    """Two shards at once; (peak RSS MiB, seconds) of each."""
    processes = []
    for shard in range(2):
        output = work / f"{label}-{shard}"
        shutil.rmtree(output, ignore_errors=True)
        command = [
            "/usr/bin/time", "-f", "%M %e", "-o", str(work / f"{label}-{shard}.time"), *SELFRAG, "generate",
            f"passages={corpus}", f"queries={REPO / 'data_gen' / 'demo' / 'queries.jsonl'}", f"output={output}",
            f"shard={shard}/2", "split=train", "limit=300", "distractors=1", *extra,
        ]
        processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for process in processes:
        _, error = process.communicate()
        if process.returncode:
            raise SystemExit(f"{label}: generate failed: {error[-2000:]}")
    results = []
    for shard in range(2):
        kib, seconds = (work / f"{label}-{shard}.time").read_text().split()[-2:]
        results.append((int(kib) / 1024, float(seconds)))
    return results


def load_pgvector(url: str, corpus: Path) -> float:
    from selfrag.corpus import load_corpus
    from selfrag.inference.retrievers.pgvector_build import PgBuild, load

    passages = load_corpus(corpus)
    rng = np.random.default_rng(1)

    def vectors(batch: list) -> np.ndarray:  # type: ignore[type-arg]
        rows = rng.standard_normal((len(batch), 384)).astype(np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    started = time.monotonic()
    load(PgBuild(url, "all-minilm-l6-v2", batch_size=2000, hnsw_m=8, hnsw_ef_construction=32), passages, vectors,
         384)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=200_000, help="synthetic passages beside the demo corpus")
    parser.add_argument("--work", type=Path, default=Path("/tmp/selfrag-shared-index"))
    parser.add_argument("--no-pgvector", action="store_true", help="skip the pgvector run")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.work / "corpus.jsonl"
    write_corpus(corpus, args.passages)
    size = corpus.stat().st_size / 2**20
    rows = [("before: passages= (BM25 built in each worker)", workers("before", args.work, corpus, []))]

    started = time.monotonic()
    subprocess.run([*SELFRAG, "index", f"corpus={corpus}", f"output={args.work / 'index'}"], check=True,
                   stdout=subprocess.DEVNULL)
    built = time.monotonic() - started
    rows.append(("after: retriever.index=DIR (BM25 built once)",
                 workers("index", args.work, corpus, [f"retriever.index={args.work / 'index'}"])))
    for shard in range(2):
        same = (args.work / f"before-{shard}" / "records.jsonl").read_bytes() == \
            (args.work / f"index-{shard}" / "records.jsonl").read_bytes()
        assert same, f"shard {shard}: the prebuilt index wrote other records"

    loaded = None
    if not args.no_pgvector:
        from selfrag.inference.retrievers.localpg import LocalPostgres

        with LocalPostgres(args.work / "postgres") as server:
            url = server.url(table="shared")
            loaded = load_pgvector(url, corpus)
            rows.append(("after: retriever.url=postgresql://... (pgvector, lexical)",
                         workers("pgvector", args.work, corpus, [f"retriever.url={url}", "retriever.mode=lexical"])))
    passages = sum(1 for _ in corpus.open(encoding="utf-8"))
    print(f"\n{passages:,} passages ({size:.0f} MiB of JSONL); 2 workers, 300 questions each; "
          f"index built once in {built:.0f} s" + (f", pgvector loaded in {loaded:.0f} s" if loaded else ""))
    print("\n| workers | peak RSS worker 0 | peak RSS worker 1 | sum | wall (max) |")
    print("|---|---|---|---|---|")
    for name, measured in rows:
        peak = [mib for mib, _ in measured]
        print(f"| {name} | {peak[0]:,.0f} MiB | {peak[1]:,.0f} MiB | {sum(peak):,.0f} MiB | "
              f"{max(s for _, s in measured):.0f} s |")


if __name__ == "__main__":
    main()
