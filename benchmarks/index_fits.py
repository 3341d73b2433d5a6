"""Does a Wikipedia-size index fit? Exact search against the index `selfrag index kind=faiss` picks, on real and
realistic all-MiniLM-L6-v2 vectors: recall@10, p50/p95 ms, anonymous memory, build peak, projected to 21M passages.

    OMP_NUM_THREADS=2 nice .venv/bin/python benchmarks/index_fits.py                 # real + 200k, 400k, 1M
    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/index_fits.py --sizes 200000 --work /tmp/fits

Vectors. Real: all-MiniLM-L6-v2 of every shipped passage and question (the corpus and questions of
benchmarks/retrieval_recall.py; embedded once, cached in ``--work``). Realistic, for the larger sets: the real passage
vectors first, then vectors sampled around them, seeded: x = normalise((1 - w) v_i + w v_j + e), v_i a real passage
picked uniformly, v_j one of its 5 nearest real passages, w ~ U(0, 0.5), e Gaussian with norm about half the median
distance from a real passage to its nearest other one. The queries are the real questions.

Each set is built twice through the real ``selfrag index`` path (passage store, resumable embedding shards, the index)
with an encoder that serves the precomputed vectors: ``kind=dense`` (exact, brute force over the memory-mapped float32
matrix: the baseline) and ``kind=faiss`` with the factory unset (picked by size: IVF<nlist>,PQ48 re-ranked from
``vectors.f16.npy``); on the real set, where the pick is Flat, also ``nlist=64`` to show IVF-PQ there. Each build runs
in a child process: its peak RSS (VmHWM), its anonymous peak (sampled) and that while adding vectors. Each index is
then opened in a fresh process: recall@10 against the exact top 10 on up to 1,000 questions (one batch), 200 single
questions timed, and memory from /proc/self/status after the queries minus before opening: anonymous (RssAnon) and
file-backed pages touched (RssFile). At the largest size the search settings are swept (nprobe x rerank) without
rebuilding. Anonymous memory and build peak are fitted by least squares over the realistic sizes and read at 21M.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from retrieval_scale import WIKIPEDIA, fit_at_wikipedia, measured_in_child, rss

ROOT = Path(__file__).resolve().parents[1]
K = 10
RECALL_QUERIES = 1000
TIMED_QUERIES = 200
SWEEP = [(32, 0), (32, 200), (32, 300), (16, 450), (32, 450), (64, 450), (32, 800)]


# === vectors ===

def real_vectors(work: Path) -> tuple[np.ndarray, np.ndarray]:
    """all-MiniLM-L6-v2 of every shipped passage and question, embedded once and cached."""
    cache = work / "real_vectors.npz"
    if not cache.is_file():
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from retrieval_recall import shipped_corpus, shipped_questions

        from selfrag.corpus import load_corpus
        from selfrag.inference.retrievers.embeddings import SentenceEncoder

        shipped_corpus(work / "shipped.jsonl")
        encoder = SentenceEncoder()
        passages = encoder.encode([p.render() for p in load_corpus(work / "shipped.jsonl")])
        np.savez(cache, passages=passages, questions=encoder.encode(shipped_questions()))
    data = np.load(cache)
    return data["passages"], data["questions"]


def write_realistic(path: Path, real: np.ndarray, count: int, seed: int = 1) -> float:
    """``count`` rows into a float32 ``.npy``: the real rows, then rows sampled around them; returns the noise norm."""
    similarities = real @ real.T
    np.fill_diagonal(similarities, -np.inf)
    neighbours = np.argsort(-similarities, axis=1)[:, :5]
    nearest = float(np.median(np.sqrt(np.maximum(0.0, 2 - 2 * similarities.max(axis=1)))))
    noise = 0.5 * nearest
    matrix = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(count, real.shape[1]))
    matrix[: len(real)] = real
    rng = np.random.default_rng(seed)
    for start in range(len(real), count, 65_536):
        size = min(count, start + 65_536) - start
        first = rng.integers(len(real), size=size)
        second = neighbours[first, rng.integers(5, size=size)]
        weight = rng.uniform(0, 0.5, size=(size, 1)).astype(np.float32)
        scale = np.float32(noise / np.sqrt(real.shape[1]))
        error = rng.standard_normal((size, real.shape[1])).astype(np.float32) * scale
        block = (1 - weight) * real[first] + weight * real[second] + error
        matrix[start : start + size] = block / np.linalg.norm(block, axis=1, keepdims=True)
    matrix.flush()
    return noise


class RowEncoder:
    """Serves precomputed vectors: the passage ``row N`` gets row N of the matrix, read from the file (not mapped: a
    model holds no copy of the corpus's vectors, and a mapped source would add its pages to the build's RSS)."""

    def __init__(self, path: Path) -> None:
        matrix = np.load(path, mmap_mode="r")
        self.path, self.offset, self.dimension = path, matrix.offset, int(matrix.shape[1])
        del matrix

    def encode(self, texts: list[str]) -> np.ndarray:
        rows = [int(text.rsplit(" ", 1)[1]) for text in texts]
        if rows != list(range(rows[0], rows[0] + len(rows))):
            raise ValueError("the build encodes consecutive rows")
        size = self.dimension * 4
        return np.fromfile(self.path, dtype=np.float32, count=len(rows) * self.dimension,
                           offset=self.offset + rows[0] * size).reshape(len(rows), self.dimension)


def write_corpus(path: Path, count: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in range(count):
            handle.write(json.dumps({"id": f"p{row}", "title": "", "text": f"row {row}"}) + "\n")


# === building (in a child process, for its peak memory) ===

def build_index(work: Path, vectors: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """Run ``selfrag index`` in a child; its seconds and peak RSS."""
    command = [sys.executable, __file__, "--build", str(work), str(vectors), name, *overrides]
    started = time.perf_counter()
    out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
    peak, anon, adding = json.loads(out.strip().splitlines()[-1])
    return {"build_s": time.perf_counter() - started, "build_peak": peak, "build_anon": anon, "build_adding": adding}


def child_build(work: Path, vectors: Path, name: str, overrides: list[str]) -> None:
    from selfrag.config import load_config
    from selfrag.inference.retrievers.index import IndexConfig
    from selfrag.inference.retrievers.index_build import build

    arguments = [f"corpus={work / 'corpus.jsonl'}", f"output={work / name}", *overrides]
    trained = work / f".{name}.building" / "trained.faiss"  # present once the quantizer is trained
    peaks = {"train": 0, "add": 0}
    done = threading.Event()

    def sample() -> None:  # the kernel keeps a peak of RSS (VmHWM), not of its anonymous part: sampled
        while not done.is_set():
            phase = "add" if trained.exists() else "train"
            peaks[phase] = max(peaks[phase], rss()["RssAnon"])
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    build(load_config(IndexConfig, None, arguments), encoder=RowEncoder(vectors), show_progress=False)
    done.set()
    sampler.join()
    # VmHWM, not ru_maxrss: the latter carries the parent's peak across fork and exec
    print(json.dumps([rss()["VmHWM"], max(peaks.values()), peaks["add"]]))  # bytes


# === measuring (in a fresh process per index) ===

class QueryVectors:
    def __init__(self, dimension: int) -> None:
        self.dimension = dimension

    def encode(self, texts: Any) -> np.ndarray:
        raise RuntimeError("this benchmark searches vectors")


def measure(folder: Path, queries_path: Path, settings: list[tuple[int, int]], encoder_cost: bool) -> dict[str, Any]:
    import faiss  # noqa: F401 - imported before the baseline, like numpy: their code is not the index

    from selfrag.inference.retrievers.index import load_index

    queries = np.load(queries_path)
    before = rss()
    retriever: Any = load_index(folder, encoder=QueryVectors(queries.shape[1]), check_corpus=False)
    result = run_queries(retriever, queries)
    after = rss()
    result.update(anon=after["RssAnon"] - before["RssAnon"], file=after["RssFile"] - before["RssFile"],
                  anon_total=after["RssAnon"])
    result["index_bytes"] = sum(f.stat().st_size for f in folder.iterdir() if f.name.endswith((".faiss", ".npy")))
    sweep = {}
    for nprobe, rerank in settings:
        tuned = load_index(folder, encoder=QueryVectors(queries.shape[1]), check_corpus=False, nprobe=nprobe,
                           rerank=rerank)
        sweep[f"{nprobe},{rerank}"] = run_queries(tuned, queries, timed=100)
    result["sweep"] = sweep
    if encoder_cost:  # the query model a serving process also holds: a fixed cost, whatever the corpus
        from selfrag.inference.retrievers.embeddings import SentenceEncoder

        loaded = rss()["RssAnon"]
        SentenceEncoder().encode(["who wrote Hamlet?"])
        result["encoder_anon"] = rss()["RssAnon"] - loaded
    return result


def run_queries(retriever: Any, queries: np.ndarray, timed: int = TIMED_QUERIES) -> dict[str, Any]:
    found = retriever.search_vectors(queries[:RECALL_QUERIES], K)
    latencies = []
    for vector in queries[:timed]:
        started = time.perf_counter()
        hits = retriever.search_vectors(vector[None, :], K)[0]
        latencies.append(time.perf_counter() - started)
        assert len(hits) == K and hits[0].passage.text
    return {"ids": [[hit.passage.id for hit in row] for row in found],
            "p50_ms": 1000 * statistics.median(latencies),
            "p95_ms": 1000 * sorted(latencies)[int(0.95 * len(latencies))]}


def measured(folder: Path, queries: Path, settings: list[tuple[int, int]], encoder_cost: bool) -> dict[str, Any]:
    return measured_in_child(__file__, str(folder), str(queries), json.dumps(list(settings)),
                             "1" if encoder_cost else "0")


def recall(found: list[list[str]], truth: list[list[str]]) -> float:
    return float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found, truth, strict=True)]))


# === one size ===

def run_size(work: Path, label: str, vectors: Path, queries: Path, sweep: bool, encoder_cost: bool) -> list[dict]:
    count = len(np.load(vectors, mmap_mode="r"))
    write_corpus(work / "corpus.jsonl", count)
    kinds = {"exact (kind=dense)": ["kind=dense"], "picked (kind=faiss)": ["kind=faiss"]}
    if count <= 100_000:
        kinds["IVF-PQ (kind=faiss nlist=64)"] = ["kind=faiss", "nlist=64"]
    rows, truth = [], None
    for number, (name, overrides) in enumerate(kinds.items()):
        folder = f"index{number}"
        built = build_index(work, vectors, folder, [*overrides, "shard_size=100000", "batch_size=1024"])
        is_last = number == len(kinds) - 1
        result = measured(work / folder, queries, SWEEP if sweep and number == 1 else [], encoder_cost and is_last)
        truth = truth or result["ids"]
        options = json.loads((work / folder / "index.json").read_text())["options"]
        index = options.get("faiss_factory") or "exact"
        if options.get("faiss_factory"):
            index += f" nprobe {options.get('nprobe')} rerank {options.get('rerank')}"
        rows.append({"set": label, "passages": count, "kind": name, "index": index, **built, **result,
                     "recall": recall(result["ids"], truth),
                     "sweep": {key: {**value, "recall": recall(value["ids"], truth)}
                               for key, value in result["sweep"].items()}})
        print(f"{label} {name}: {index}, recall {rows[-1]['recall']:.3f}, p50 {result['p50_ms']:.2f} ms, anon "
              f"{result['anon'] / 2**20:.0f} MiB, built in {built['build_s']:.0f} s", flush=True)
        shutil.rmtree(work / folder)
    return rows


# === report ===

def report(rows: list[dict], cpu: str) -> str:
    mib, gib = 1 << 20, 1 << 30
    lines = [f"CPU: {cpu}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}", "",
             "| set | passages | kind | index | recall@10 | p50 ms | p95 ms | anon MiB | file-backed MiB touched "
             "| index MiB | build s | build peak RSS MiB (anon; anon while adding) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['set']} | {r['passages']:,} | {r['kind']} | {r['index']} | {r['recall']:.3f} | "
                     f"{r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['anon'] / mib:.0f} | {r['file'] / mib:.0f} | "
                     f"{r['index_bytes'] / mib:.0f} | {r['build_s']:.0f} | {r['build_peak'] / mib:.0f} "
                     f"({r['build_anon'] / mib:.0f}; {r['build_adding'] / mib:.0f}) |")
    exact = {r["passages"]: r for r in rows if r["kind"].startswith("exact")}
    lines += ["", "| passages | kind | ms p50 vs exact | recall@10 |", "| --- | --- | --- | --- |"]
    for r in rows:
        if not r["kind"].startswith("exact"):
            lines.append(f"| {r['passages']:,} | {r['kind']} | {r['p50_ms'] / exact[r['passages']]['p50_ms']:.3f} "
                         f"| {r['recall']:.3f} |")
    for r in rows:
        if r["sweep"]:
            lines += ["", f"Search settings at {r['passages']:,} passages ({r['index'].split()[0]}, no rebuild):", "",
                      "| nprobe | rerank | recall@10 | p50 ms | p95 ms |", "| --- | --- | --- | --- | --- |"]
            for key, value in r["sweep"].items():
                nprobe, rerank = key.split(",")
                lines.append(f"| {nprobe} | {rerank} | {value['recall']:.3f} | {value['p50_ms']:.2f} | "
                             f"{value['p95_ms']:.2f} |")
    lines += ["", "| kind | anon bytes/passage (slope) | anon at 21M GiB | build peak RSS bytes/passage (slope) "
              "| build peak RSS at 21M GiB | build anon while adding bytes/passage (slope) | build anon at 21M GiB "
              "| index bytes/passage | index at 21M GiB |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind in ("exact (kind=dense)", "picked (kind=faiss)"):
        points = [r for r in rows if r["kind"] == kind and r["set"] != "real"]
        if len(points) < 2:
            continue
        counts = [p["passages"] for p in points]
        fields = ("anon", "build_peak", "build_adding")
        fits = {field: fit_at_wikipedia(counts, [p[field] for p in points]) for field in fields}
        per = points[-1]["index_bytes"] / counts[-1]
        at = {field: value / gib for field, (_, value) in fits.items()}
        # the build's anonymous peak at 21M: training's (the sample; the same at every size) or adding's, the larger
        at["build_adding"] = max(at["build_adding"], max(p["build_anon"] for p in points) / gib)
        lines.append(f"| {kind} | {fits['anon'][0]:,.1f} | {at['anon']:.2f} | {fits['build_peak'][0]:,.0f} | "
                     f"{at['build_peak']:.1f} | {fits['build_adding'][0]:,.0f} | {at['build_adding']:.1f} | "
                     f"{per:,.0f} | {per * WIKIPEDIA / gib:.1f} |")
    encoder = [r["encoder_anon"] for r in rows if "encoder_anon" in r]
    if encoder:
        lines += ["", f"The query encoder (torch + all-MiniLM-L6-v2) adds {encoder[0] / mib:.0f} MiB of anonymous "
                  "memory to a serving process, whatever the corpus (not in the anon column)."]
    return "\n".join(lines)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="200000,400000,1000000", help="realistic set sizes")
    parser.add_argument("--work", type=Path, default=Path("/tmp/selfrag-fits"))
    parser.add_argument("--out", type=Path, help="also write the tables here")
    parser.add_argument("--build", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        child_build(Path(args.build[0]), Path(args.build[1]), args.build[2], args.build[3:])
        return
    if args.measure:
        folder, queries, settings, cost = args.measure
        print(json.dumps(measure(Path(folder), Path(queries), [tuple(s) for s in json.loads(settings)], cost == "1")))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    passages, questions = real_vectors(args.work)
    order = np.random.default_rng(0).permutation(len(questions))
    np.save(args.work / "queries.npy", questions[order])
    print(f"{len(passages)} real passages, {len(questions)} real questions (all-MiniLM-L6-v2)", flush=True)
    started = time.perf_counter()
    np.save(args.work / "vectors.npy", passages)
    rows = run_size(args.work, "real", args.work / "vectors.npy", args.work / "queries.npy", False, True)
    sizes = [int(size) for size in args.sizes.split(",") if size]
    for count in sizes:
        noise = write_realistic(args.work / "vectors.npy", passages, count)
        print(f"{count:,} realistic vectors (noise norm {noise:.3f})", flush=True)
        rows += run_size(args.work, "realistic", args.work / "vectors.npy", args.work / "queries.npy",
                         count == sizes[-1], False)
    (args.work / "vectors.npy").unlink()
    table = report(rows, cpu_name())
    print(f"\n{table}\n\n{time.perf_counter() - started:.0f} s in all")
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
