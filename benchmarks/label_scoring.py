"""Teacher-forced label scoring (``selfrag eval labels=FILE``): one forward pass per item against one one-token decode
per (item, labelled type), both in one process on the same engine and labels, with their ratio.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/label_scoring.py --model runs/qs/model \\
        --labels runs/qs/splits/test-labels.jsonl
    .venv/bin/python benchmarks/label_scoring.py --model M --labels L --limit 40 --repeats 2 --batch-size 8

``old`` is the hf engine behind the plain :class:`~selfrag.inference.engines.base.Engine` protocol (no
``score_prefixes``): :func:`~selfrag.evaluation.token_agreement.predict` then sends one decode per prefix, as before
the one-forward path. ``new`` is the engine itself. The two run alternately ``--repeats`` times; printed: each side's
seconds (best of the repeats), the ratio, the rows whose predicted token differs and the largest |d score|.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from selfrag.evaluation.data import load_reflection_labels
from selfrag.evaluation.token_agreement import predict
from selfrag.inference.engines import Engine, Generation, GenerationRequest, load_engine


class PerPrefix:
    """``engine`` behind the protocol alone: ``predict`` cannot see its ``score_prefixes``."""

    def __init__(self, engine: Engine) -> None:
        self.inner = engine
        self.tokenizer, self.token_ids = engine.tokenizer, engine.token_ids
        self.prompt_template, self.name = engine.prompt_template, f"per-prefix:{engine.name}"

    @property
    def calibration(self) -> Mapping[str, Any] | None:
        return self.inner.calibration

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return self.inner.generate(requests)


def timed(engine: Engine, items: Sequence[Any]) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    rows = predict(engine, items)
    return time.perf_counter() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder written by selfrag train")
    parser.add_argument("--labels", required=True, help="reflection labels (selfrag eval labels=...)")
    parser.add_argument("--limit", type=int, default=None, help="the first N label rows (default: all)")
    parser.add_argument("--batch-size", type=int, default=16, help="the engine's batch_size (its default: 16)")
    parser.add_argument("--repeats", type=int, default=1, help="old/new runs, alternating; the best of each counts")
    args = parser.parse_args()

    engine = load_engine(args.model, "hf", batch_size=args.batch_size)
    items = load_reflection_labels(args.labels, args.limit)
    rows_count = sum(len(item.labels) for item in items)
    print(f"{len(items)} items, {rows_count} labelled prefixes; batch_size {args.batch_size}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    old_times, new_times = [], []
    for _ in range(args.repeats):
        seconds, old_rows = timed(PerPrefix(engine), items)  # type: ignore[arg-type]
        old_times.append(seconds)
        seconds, new_rows = timed(engine, items)
        new_times.append(seconds)
    differ = sum(a["predicted"] != b["predicted"] for a, b in zip(old_rows, new_rows, strict=True))
    worst = max((abs(a["score"] - b["score"]) for a, b in zip(old_rows, new_rows, strict=True)
                 if a["score"] is not None and b["score"] is not None), default=0.0)
    old, new = min(old_times), min(new_times)
    print(f"old (one decode per prefix): {old:.1f} s   new (one forward per item): {new:.1f} s   "
          f"ratio {old / new:.2f}x")
    print(f"rows whose predicted token differs: {differ} of {len(new_rows)}; largest |d score|: {worst:.2e}")


if __name__ == "__main__":
    main()
