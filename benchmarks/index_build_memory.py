"""Peak resident memory of `selfrag index` (kind=faiss, kind=bm25) building from a DPR-style TSV, before and after the
streamed build, at 100k and 300k passages.

    nice .venv/bin/python benchmarks/index_build_memory.py                                  # 100k, 300k vs 7d12181
    nice .venv/bin/python benchmarks/index_build_memory.py --sizes 100000 --kinds bm25 --work /tmp/build-memory
    nice .venv/bin/python benchmarks/index_build_memory.py --bm25-parts 100000     # where BM25's build memory goes

Data (seeded): a ``psgs_w100.tsv`` (header ``id text title``) whose passage ``i`` is 100 words (DPR's length) drawn
Zipf (a=1.2) from 30,000 made-up words, title ``Topic i % 50000``.

"before" is the code of ``--baseline`` (default 7d12181, the build that loaded the corpus into a list): ``git
archive`` of that commit, laid out as the installed package and put first on ``PYTHONPATH``; "after" is this
checkout. Both run in this invocation on the same files. Each build is the real CLI (``selfrag.app.cli.main(["index",
...])``) in a fresh process; its peak RSS is that process's ``ru_maxrss`` (``os.wait4``).

Embedding: all-MiniLM-L6-v2 encodes a few hundred passages/s on 2 shared cores (300k: tens of minutes per build,
four builds), so the child swaps ``SentenceEncoder`` for a hash encoder (a seeded random unit vector of 384
dimensions per text: all-MiniLM-L6-v2's size, no model). The model's own memory (~250 MB of torch and weights,
constant in the corpus size) is therefore not in these figures; what is, is what grows with the corpus. FAISS
factory ``Flat`` (built in seconds; its 1,536 bytes a passage are the index's own, in both columns alike).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORDS = 30_000
DIMENSION = 384

CHILD = r"""
import sys, zlib
import numpy as np

class HashEncoder:
    '''A seeded random unit vector per text (the text's CRC-32 the seed): deterministic, no model.'''

    def __init__(self, *args, **kwargs):
        self.dimension = %(dimension)d

    def encode(self, texts):
        rows = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dimension, dtype=np.float32)
                for t in texts]
        matrix = np.stack(rows) if rows else np.zeros((0, self.dimension), np.float32)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)

    def close(self):
        pass

import selfrag
from selfrag.inference.retrievers import embeddings, index_build
embeddings.SentenceEncoder = index_build.SentenceEncoder = HashEncoder
from selfrag.app.cli import main
print("selfrag from", selfrag.__file__, file=sys.stderr)
sys.exit(main(sys.argv[1:]))
"""


def write_tsv(path: Path, count: int) -> None:
    rng = np.random.default_rng(1)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(["".join(rng.choice(letters, size=rng.integers(3, 10))) for _ in range(WORDS)])
    rng = np.random.default_rng(0)
    with path.open("w", encoding="utf-8") as handle:
        handle.write("id\ttext\ttitle\n")
        for start in range(0, count, 10_000):
            stop = min(count, start + 10_000)
            ranks = np.minimum(rng.zipf(1.2, size=(stop - start, 100)), WORDS) - 1
            for i, row in zip(range(start, stop), words[ranks], strict=True):
                handle.write(f"{i + 1}\t{' '.join(row)}\tTopic {i % 50_000}\n")


def baseline_package(commit: str, work: Path) -> Path:
    """The code of ``commit`` laid out as the installed ``selfrag`` package (pyproject's package-dir mapping)."""
    source, package = work / f"src-{commit}", work / f"pkg-{commit}"
    if package.is_dir():
        return package
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    roots = sorted({folder.split("/")[0] for folder in mapping.values()})
    source.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, *roots], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    for name, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        if name.count(".") <= 1:  # selfrag, selfrag.app, ... (deeper packages sit inside their parent's folder)
            shutil.copytree(source / folder, package / name.replace(".", "/"), dirs_exist_ok=True)
    shutil.rmtree(source)
    return package


def measure(corpus: Path, output: Path, kind: str, package: Path | None) -> dict[str, Any]:
    """One `selfrag index` build in a fresh process: its peak RSS (MiB), seconds and the index's own bytes."""
    arguments = ["index", f"corpus={corpus}", f"output={output}", f"kind={kind}"]
    if kind == "faiss":
        arguments += ["faiss_factory=Flat", "batch_size=256"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    if package is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(package), environment.get("PYTHONPATH", "")])
    log_path = output.with_name(output.name + ".log")
    started = time.perf_counter()
    # stderr to a file, not a pipe (a full pipe would stall the child); cwd away from the checkout, whose selfrag/
    # folder would otherwise shadow the baseline on sys.path
    with log_path.open("w") as log_file:
        child = subprocess.Popen([sys.executable, "-c", CHILD % {"dimension": DIMENSION}, *arguments],
                                 env=environment, stdout=subprocess.DEVNULL, stderr=log_file, cwd=output.parent)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    log = log_path.read_text(errors="replace")
    log_path.unlink()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the build failed ({package or 'this checkout'}):\n{log[-3000:]}")
    origin = next((line for line in log.splitlines() if line.startswith("selfrag from")), "?")
    own = sum(f.stat().st_size for f in output.iterdir() if f.name not in ("passages.sqlite", "passages.jsonl"))
    store = (output / "passages.sqlite").stat().st_size if (output / "passages.sqlite").is_file() else 0
    shutil.rmtree(output)
    return {"peak_mib": usage.ru_maxrss / 1024, "seconds": seconds, "index_mib": own / 2**20,
            "store_mib": store / 2**20, "origin": origin}


def report(results: dict[tuple[str, str, int], dict[str, Any]], sizes: list[int], kinds: list[str]) -> str:
    lines = ["| kind | passages | before: peak RSS MiB | after: peak RSS MiB | after / before | before s | after s "
             "| index MiB (+ store MiB) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind in kinds:
        for count in sizes:
            before, after = results[("before", kind, count)], results[("after", kind, count)]
            lines.append(f"| {kind} | {count:,} | {before['peak_mib']:.0f} | {after['peak_mib']:.0f} | "
                         f"{after['peak_mib'] / before['peak_mib']:.2f} | {before['seconds']:.0f} | "
                         f"{after['seconds']:.0f} | {after['index_mib']:.0f} (+ {after['store_mib']:.0f}) |")
    if len(sizes) >= 2:
        lines += ["", "| kind | before: bytes/passage (slope) | after: bytes/passage (slope) | after / before "
                  "| index bytes/passage | before at 21M GiB | after at 21M GiB |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        small, large = sizes[0], sizes[-1]
        for kind in kinds:
            slope, at_21m = {}, {}
            for side in ("before", "after"):
                low, high = results[(side, kind, small)]["peak_mib"], results[(side, kind, large)]["peak_mib"]
                slope[side] = (high - low) * 2**20 / (large - small)
                at_21m[side] = (low * 2**20 + slope[side] * (21_000_000 - small)) / 2**30
            index = (results[("after", kind, large)]["index_mib"] - results[("after", kind, small)]["index_mib"]) \
                * 2**20 / (large - small)
            lines.append(f"| {kind} | {slope['before']:,.0f} | {slope['after']:,.0f} | "
                         f"{slope['after'] / slope['before']:.2f} | {index:,.0f} | {at_21m['before']:.1f} | "
                         f"{at_21m['after']:.1f} |")
    return "\n".join(lines)


def bm25_parts(count: int, work: Path) -> str:
    """Where a BM25 build's memory goes, per passage (tracemalloc, which numpy reports to): the packed token ids and
    vocabulary of the streamed tokenization, then the peak of bm25s's ``BM25.index`` above them."""
    import bm25s

    from selfrag.corpus import load_corpus
    from selfrag.passages import PassageList
    from selfrag.retrieval import make_stemmer, tokenize_corpus

    corpus = work / f"parts_{count}.tsv"
    write_tsv(corpus, count)
    passages = PassageList(load_corpus(corpus))  # in memory, outside the traced part
    corpus.unlink()
    tracemalloc.start()
    tokens = tokenize_corpus(passages, make_stemmer("english"))
    held, tokenizing_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    index = bm25s.BM25()
    index.index(tokens, show_progress=False)
    kept, indexing_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    nonzeros = len(index.scores["data"])
    return (f"BM25 build, {count:,} passages ({len(tokens.ids.flat) / count:.0f} tokens, {nonzeros / count:.0f} "
            f"distinct a passage): token ids + vocabulary {held / count:,.0f} B/passage (peak while tokenizing "
            f"{tokenizing_peak / count:,.0f}); bm25s BM25.index peak above them {(indexing_peak - held) / count:,.0f}"
            f" B/passage ({(indexing_peak - held) / nonzeros:.0f} B a non-zero), of which the matrices kept "
            f"{(kept - held) / count:,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000")
    parser.add_argument("--kinds", default="faiss,bm25")
    parser.add_argument("--baseline", default="7d12181", help="the commit measured as 'before'")
    parser.add_argument("--work", default="/tmp/selfrag-build-memory")
    parser.add_argument("--bm25-parts", type=int, metavar="N", help="only: where BM25's build memory goes at N")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.bm25_parts:
        try:
            print(bm25_parts(args.bm25_parts, work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    sizes, kinds = [int(size) for size in args.sizes.split(",")], args.kinds.split(",")
    package = baseline_package(args.baseline, work)
    results: dict[tuple[str, str, int], dict[str, Any]] = {}
    try:
        for count in sizes:
            corpus = work / f"psgs_{count}.tsv"
            write_tsv(corpus, count)
            for kind in kinds:
                for side, code in (("before", package), ("after", None)):
                    result = measure(corpus, work / f"{side}-{kind}-{count}", kind, code)
                    results[(side, kind, count)] = result
                    print(json.dumps({"side": side, "kind": kind, "passages": count, **result}), flush=True)
            corpus.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(results, sizes, kinds))


if __name__ == "__main__":
    main()
