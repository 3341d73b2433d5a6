"""Index open time, resident memory and query latency at 100k / 300k / 1M passages, per kind, with a projection.

    nice .venv/bin/python benchmarks/retrieval_scale.py                                   # 100k, 300k, 1M
    nice .venv/bin/python benchmarks/retrieval_scale.py --sizes 100000 --work /tmp/scale  # one point

Synthetic data, seeded: passage ``i`` is 40 words drawn (Zipf, a=1.2) from a vocabulary of 30,000 made-up
words, under the title ``Topic i % 50000``; the dense vectors are random unit vectors of 384 dimensions
(all-MiniLM-L6-v2's size; no model runs). Kinds:

* ``v1-bm25`` - today's format 1 (the baseline): ``passages.jsonl`` read into Python objects on every open, BM25
  beside it;
* ``bm25`` - format 2: bm25s matrices memory-mapped, passages in ``passages.sqlite`` read for the hits only;
* ``faiss-flat`` / ``faiss-ivf256-pq32`` (nprobe 16, trained on 20k vectors) / ``faiss-hnsw32`` (only with
  ``--hnsw-max N``: its build is slow on 2 cores) - format 2 with the same store, the FAISS file memory-mapped
  where FAISS can.

Each index is opened in a fresh process (``--measure``): open time, RSS before/after opening and after 200
single queries (k=10; BM25 three vocabulary words, FAISS a random unit vector, passages fetched from the store),
latency p50/p95. The table gives the slope of resident memory per passage and its projection to 21M passages.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

DIMENSION = 384
QUERIES = 200
WORDS = 30_000
#: passages in the 2018 English Wikipedia cut into 100-word passages (Self-RAG's retrieval corpus): where the scale
#: benchmarks read their straight-line fits
WIKIPEDIA = 21_000_000


def vocabulary() -> np.ndarray:
    rng = np.random.default_rng(1)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return np.array(["".join(rng.choice(letters, size=rng.integers(3, 10))) for _ in range(WORDS)])


def write_corpus(path: Path, count: int) -> None:
    rng, words = np.random.default_rng(0), vocabulary()
    with path.open("w", encoding="utf-8") as handle:
        for start in range(0, count, 10_000):
            stop = min(count, start + 10_000)
            ranks = np.minimum(rng.zipf(1.2, size=(stop - start, 40)), WORDS) - 1
            for i, row in zip(range(start, stop), words[ranks], strict=True):
                handle.write(json.dumps({"id": f"s{i}", "title": f"Topic {i % 50_000}", "text": " ".join(row)}) + "\n")


def build_all(work: Path, count: int, hnsw_max: int) -> list[str]:
    from selfrag.config import load_config
    from selfrag.inference.retrievers.faiss_index import FAISS_FILE, build_faiss, import_faiss
    from selfrag.inference.retrievers.index import IndexConfig
    from selfrag.inference.retrievers.index_build import build

    corpus = work / "corpus.jsonl"
    write_corpus(corpus, count)
    build(load_config(IndexConfig, None, [f"corpus={corpus}", f"output={work / 'bm25'}"]), show_progress=False)
    old = work / "v1-bm25"  # format 1: the same BM25 files, the passages as JSONL, version 1
    shutil.copytree(work / "bm25", old)
    (old / "passages.sqlite").unlink()
    shutil.copy(corpus, old / "passages.jsonl")
    meta = json.loads((old / "index.json").read_text())
    (old / "index.json").write_text(json.dumps({**meta, "version": 1, "corpus": {}}))

    vectors = np.lib.format.open_memmap(work / "vectors.npy", mode="w+", dtype=np.float32, shape=(count, DIMENSION))
    rng = np.random.default_rng(2)
    for start in range(0, count, 65_536):
        block = rng.standard_normal((min(count, start + 65_536) - start, DIMENSION)).astype(np.float32)
        vectors[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    kinds = {"faiss-flat": ("Flat", None), "faiss-ivf256-pq32": ("IVF256,PQ32", 16)}
    if count <= hnsw_max:
        kinds["faiss-hnsw32"] = ("HNSW32", None)
    for name, (factory, nprobe) in kinds.items():
        folder = work / name
        folder.mkdir()
        os.link(work / "bm25" / "passages.sqlite", folder / "passages.sqlite")
        started = time.perf_counter()
        index = build_faiss(vectors, factory, train_size=20_000, seed=0, show_progress=False)
        print(f"{count:,} passages: {name} built in {time.perf_counter() - started:.0f} s", flush=True)
        import_faiss().write_index(index, str(folder / FAISS_FILE))
        options = {"faiss_factory": factory, "nprobe": nprobe, "embedding_model": "synthetic"}
        meta = {"version": 2, "kind": "faiss", "passages": count, "corpus": {}, "options": options}
        (folder / "index.json").write_text(json.dumps(meta))
    (work / "vectors.npy").unlink()
    return ["v1-bm25", "bm25", *kinds]


def rss() -> dict[str, int]:
    """This process's memory in bytes from /proc/self/status: VmRSS, VmHWM (its peak), RssAnon, RssFile (Linux)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def measured_in_child(script: str, *arguments: str) -> dict[str, Any]:
    """``script --measure ARGUMENTS`` in a fresh Python process (the memory it reads there holds what it measures,
    not what this process built), and the JSON of its last line of output."""
    out = subprocess.run([sys.executable, script, "--measure", *arguments], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def fit_at_wikipedia(counts: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """The least-squares line through ``(count, value)``: its slope (per passage) and its value at :data:`WIKIPEDIA`
    passages."""
    slope, base = np.polyfit(counts, values, 1)
    return float(slope), float(base + slope * WIKIPEDIA)


class RandomQueries:
    dimension = DIMENSION

    def encode(self, texts: Any) -> np.ndarray:
        raise RuntimeError("the scale benchmark searches vectors")


def measure(folder: Path) -> dict[str, Any]:
    """Open ``folder`` in this (fresh) process and time it; run 200 queries."""
    import bm25s  # noqa: F401 - imported before the baseline RSS, like faiss: their code is not the index
    import faiss  # noqa: F401

    from selfrag.inference.retrievers.index import load_index

    meta = json.loads((folder / "index.json").read_text())
    before = rss()
    started = time.perf_counter()
    retriever: Any = load_index(folder, encoder=RandomQueries())
    open_seconds = time.perf_counter() - started
    opened = rss()
    rng, words = np.random.default_rng(3), vocabulary()
    latencies = []
    for _ in range(QUERIES):
        started = time.perf_counter()
        if meta["kind"] == "faiss":
            vector = rng.standard_normal((1, DIMENSION)).astype(np.float32)
            hits = retriever.search_vectors(vector / np.linalg.norm(vector), 10)[0]
        else:
            hits = retriever.search(" ".join(words[rng.integers(0, 300, size=3)]), 10)
        latencies.append(time.perf_counter() - started)
        assert len(hits) == 10 and hits[0].passage.text
    after = rss()
    own = sum(f.stat().st_size for f in folder.iterdir() if f.name not in ("passages.sqlite", "passages.jsonl"))
    return {
        "open_s": open_seconds,
        "rss_open": opened["VmRSS"] - before["VmRSS"],
        "rss_queries": after["VmRSS"] - before["VmRSS"],
        "anon_queries": after["RssAnon"] - before["RssAnon"],
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * sorted(latencies)[int(0.95 * len(latencies))],
        "index_bytes": own,
        "store_bytes": sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith("passages.")),
    }


def report(results: dict[str, dict[int, dict[str, Any]]]) -> str:
    mib = 1 << 20
    lines = ["| kind | passages | open s | RSS after open MiB | RSS after 200 queries MiB | p50 ms | p95 ms "
             "| index MiB (+ passages MiB) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, points in results.items():
        for count, m in sorted(points.items()):
            lines.append(f"| {kind} | {count:,} | {m['open_s']:.3f} | {m['rss_open'] / mib:.0f} | "
                         f"{m['rss_queries'] / mib:.0f} | {m['p50_ms']:.2f} | {m['p95_ms']:.2f} | "
                         f"{m['index_bytes'] / mib:.0f} (+ {m['store_bytes'] / mib:.0f}) |")
    lines += ["", "| kind | RSS bytes/passage (slope) | index bytes/passage | RSS / index bytes | open s at 21M "
              "| RSS at 21M GiB (projected) |", "| --- | --- | --- | --- | --- | --- |"]
    for kind, points in results.items():
        counts = sorted(points)
        if len(counts) < 2:
            continue
        rss_slope, rss_at = fit_at_wikipedia(counts, [points[c]["rss_queries"] for c in counts])
        _, open_at = fit_at_wikipedia(counts, [points[c]["open_s"] for c in counts])
        index_per = points[counts[-1]]["index_bytes"] / counts[-1]
        lines.append(f"| {kind} | {rss_slope:,.0f} | {index_per:,.0f} | {rss_slope / index_per:.2f} | "
                     f"{max(0.0, open_at):.1f} | {max(0.0, rss_at) / (1 << 30):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--work", type=Path, default=Path("/tmp/selfrag-scale"))
    parser.add_argument("--hnsw-max", type=int, default=0, help="build HNSW32 up to this many passages")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep the built indexes")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for count in (int(size) for size in args.sizes.split(",")):
        work = args.work / str(count)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        started = time.perf_counter()
        kinds = build_all(work, count, args.hnsw_max)
        print(f"{count:,} passages: built {', '.join(kinds)} in {time.perf_counter() - started:.0f} s", flush=True)
        for kind in kinds:
            results.setdefault(kind, {})[count] = measured_in_child(__file__, str(work / kind))
            print(kind, results[kind][count], flush=True)
        if not args.keep:
            shutil.rmtree(work)
    print(report(results))


if __name__ == "__main__":
    main()
