"""pgvector HNSW at 100k / 300k / 1M passages: load+build time, client open time and RSS, server RSS, query latency.

    .venv/bin/python benchmarks/pgvector_scale.py                      # 100k; a throwaway server from pgserver
    .venv/bin/python benchmarks/pgvector_scale.py --sizes 100000,300000
    .venv/bin/python benchmarks/pgvector_scale.py --sizes 100000,300000,1000000 --maintenance-work-mem 3GB

The companion of ``retrieval_scale.py`` for ``retriever.kind=pgvector``, on the same synthetic data: the same
seeded passages (40 Zipf words, title ``Topic i % 50000``) and the same random 384-dimensional unit vectors,
loaded with ``pgvector_build.load`` (COPY in batches of 512, then HNSW m=16, ef_construction=64, and the GIN
full-text index; ``maintenance_work_mem`` sized to the graph, or ``--maintenance-work-mem``) into a
:class:`LocalPostgres` on 127.0.0.1 started for the run,
stopped and deleted after. The client is measured in a fresh process, as the other kinds: the time and RSS of
opening :class:`PgVectorRetriever` (mode ``lexical``, which loads no encoder: the vectors are given, as for the
FAISS kinds), then 200 single queries (k=10, ``search_vectors``, ``ef_search`` 100, passages returned by the
server). The server's memory is the summed RSS and PSS of every postgres process right after the queries
(RSS counts shared buffers once per process that touched them; PSS splits them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from retrieval_scale import DIMENSION, QUERIES, WIKIPEDIA, fit_at_wikipedia, measured_in_child, rss, vocabulary

BATCH = 512


def passages(count: int) -> list:  # type: ignore[type-arg]
    """The passages ``retrieval_scale.write_corpus`` writes, as objects (same seed, same draws)."""
    from selfrag.trajectory import Passage

    rng, words, out = np.random.default_rng(0), vocabulary(), []
    for start in range(0, count, 10_000):
        stop = min(count, start + 10_000)
        ranks = np.minimum(rng.zipf(1.2, size=(stop - start, 40)), len(words)) - 1
        for i, row in zip(range(start, stop), words[ranks], strict=True):
            out.append(Passage(f"s{i}", f"Topic {i % 50_000}", " ".join(row)))
    return out


def vectors(count: int) -> np.ndarray:
    """The unit vectors ``retrieval_scale.build_all`` gives the FAISS kinds (same seed, same blocks)."""
    out, rng = np.empty((count, DIMENSION), dtype=np.float32), np.random.default_rng(2)
    for start in range(0, count, 65_536):
        block = rng.standard_normal((min(count, start + 65_536) - start, DIMENSION)).astype(np.float32)
        out[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def rows_of(matrix: np.ndarray) -> Callable[[Sequence[Any]], np.ndarray]:
    """The ``embed`` callable for ``pgvector_build.load``: passage ``s<i>``'s vector is row ``i``."""
    return lambda chunk: matrix[[int(p.id[1:]) for p in chunk]]


def server_memory(postmaster: int) -> dict[str, int]:
    """Summed VmRSS and Pss (bytes) of the postmaster and all its children."""
    pids = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            pids.append(int(stat.parent.name))
    total = {"rss": 0, "pss": 0, "processes": 0}
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        total["rss"] += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) * 1024
        total["pss"] += next(int(line.split()[1]) for line in rollup if line.startswith("Pss:")) * 1024
        total["processes"] += 1
    return total


def measure(url: str, postmaster: int) -> dict[str, Any]:
    """Open the table in this (fresh) process and time it; run 200 single queries; read the server's memory."""
    import psycopg  # noqa: F401 - imported before the baseline RSS: the driver's code is not the index

    from selfrag.inference.retrievers.pgvector import PgVectorRetriever

    before = rss()
    started = time.perf_counter()
    retriever = PgVectorRetriever(url, mode="lexical", ef_search=100)
    open_seconds = time.perf_counter() - started
    opened = rss()
    rng, latencies = np.random.default_rng(3), []
    for _ in range(QUERIES):
        vector = rng.standard_normal((1, DIMENSION)).astype(np.float32)
        started = time.perf_counter()
        hits = retriever.search_vectors(vector / np.linalg.norm(vector), 10)[0]
        latencies.append(time.perf_counter() - started)
        assert len(hits) == 10 and hits[0].passage.text
    after = rss()
    server = server_memory(postmaster)  # while this client's backend is still connected
    table = retriever.target.table
    sizes = retriever._connection.execute(
        "SELECT pg_relation_size(%s), pg_relation_size(%s), pg_relation_size(%s), pg_total_relation_size(%s)",
        (table, f"{table}_hnsw", f"{table}_lexemes", table),
    ).fetchone()
    retriever.close()
    return {
        "open_s": open_seconds,
        "rss_open": opened["VmRSS"] - before["VmRSS"],
        "rss_queries": after["VmRSS"] - before["VmRSS"],
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * sorted(latencies)[int(0.95 * len(latencies))],
        "server_rss": server["rss"],
        "server_pss": server["pss"],
        "server_processes": server["processes"],
        "table_bytes": sizes[0],
        "hnsw_bytes": sizes[1],
        "gin_bytes": sizes[2],
        "total_bytes": sizes[3],
    }


def report(results: dict[int, dict[str, Any]]) -> str:
    mib = 1 << 20
    lines = ["| kind | passages | load+build s | open s | client RSS after open / 200 queries MiB | server RSS MiB "
             "(PSS) | p50 ms | p95 ms | HNSW MiB (+ table, GIN MiB) |", "| --- " * 9 + "|"]
    for count, m in sorted(results.items()):
        lines.append(f"| pgvector-hnsw16 | {count:,} | {m['build_s']:.0f} | {m['open_s']:.3f} | "
                     f"{m['rss_open'] / mib:.0f} / {m['rss_queries'] / mib:.0f} | {m['server_rss'] / mib:.0f} "
                     f"({m['server_pss'] / mib:.0f}) | {m['p50_ms']:.2f} | {m['p95_ms']:.2f} | "
                     f"{m['hnsw_bytes'] / mib:.0f} (+ {m['table_bytes'] / mib:.0f}, {m['gin_bytes'] / mib:.0f}) |")
    counts = sorted(results)
    if len(counts) >= 2:  # the server's own memory is capped by shared_buffers; the HNSW pages live in the page cache
        lines += ["", "| kind | server PSS bytes/passage (slope) | HNSW bytes/passage | HNSW at 21M GiB (page cache a "
                  "fast search needs) | on disk at 21M GiB | load+build s at 21M (linear fit; a lower bound) |",
                  "| --- " * 6 + "|"]
        pss_slope, _ = fit_at_wikipedia(counts, [results[c]["server_pss"] for c in counts])
        _, build_at = fit_at_wikipedia(counts, [results[c]["build_s"] for c in counts])
        last = results[counts[-1]]
        lines.append(f"| pgvector-hnsw16 | {pss_slope:,.0f} | {last['hnsw_bytes'] / counts[-1]:,.0f} | "
                     f"{last['hnsw_bytes'] / counts[-1] * WIKIPEDIA / (1 << 30):.1f} | "
                     f"{last['total_bytes'] / counts[-1] * WIKIPEDIA / (1 << 30):.1f} | {build_at:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000")
    parser.add_argument("--maintenance-work-mem", default=None,
                        help="PostgreSQL's maintenance_work_mem for the HNSW build (e.g. 3GB); unset: sized to the "
                             "graph (pgvector_build.graph_memory)")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], int(args.measure[1]))))
        return

    from selfrag.inference.retrievers.localpg import LocalPostgres
    from selfrag.inference.retrievers.pgvector_build import PgBuild, load

    results: dict[int, dict[str, Any]] = {}
    for count in (int(size) for size in args.sizes.split(",")):
        server = LocalPostgres(Path(tempfile.mkdtemp(prefix="selfrag-pgscale-"))).start()
        try:
            rows, matrix = passages(count), vectors(count)
            url = server.url(table=f"scale{count}")
            started = time.perf_counter()
            spec = PgBuild(url, "synthetic", batch_size=BATCH, maintenance_work_mem=args.maintenance_work_mem)
            load(spec, rows, rows_of(matrix), DIMENSION)
            build_seconds = time.perf_counter() - started
            print(f"{count:,} passages: loaded and indexed in {build_seconds:.0f} s", flush=True)
            del rows, matrix
            postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
            results[count] = {**measured_in_child(__file__, url, str(postmaster)), "build_s": build_seconds}
            print(results[count], flush=True)
        finally:
            server.stop()
            shutil.rmtree(server.directory, ignore_errors=True)
    print(report(results))


if __name__ == "__main__":
    main()
