"""How long the engine stays busy after every client of a batch has left: the server's batching worker over the hf
engine, with and without the per-step abandon check (the baseline, run beside it in the same process).

    .venv/bin/python benchmarks/cancellation.py --model runs/smollm2-5steps --clients 16 --max-tokens 256

``--clients`` jobs go to one :class:`~selfrag.inference.server.batcher.BatchWorker` (one batch, the server's code
path without HTTP); when the first job's first event arrives every job is cancelled, as the server does when a
client disconnects. Reported per setting: seconds from the cancel to the engine thread being free, decode steps
(forward passes) after the cancel, and a full answer's time for reference. ``mode=never``: one answer decode per
question, so the measure is the decode itself (with ``always``, passage branches come after the first event).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from selfrag.corpus import load_queries
from selfrag.data_gen import DEMO_QUERIES
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines.hf import HFEngine
from selfrag.inference.server.backend import Backend
from selfrag.inference.server.batcher import BatchWorker


async def measure(backend: Backend, questions: list[str], settings: InferenceConfig, check: bool,
                  steps: list[int]) -> dict[str, Any]:
    worker = BatchWorker(backend.stream_many, max_queue=len(questions), max_batch=len(questions), batch_wait_s=0.05,
                         abandon_check=backend.abandon_check if check else None)
    await worker.start()
    jobs = [worker.submit(question, settings, stream=True) for question in questions]
    assert jobs[0].events is not None
    await jobs[0].events.get()  # the first event: the batch is in the engine
    while not steps:
        await asyncio.sleep(0.01)
    steps_at_cancel = len(steps)
    cancelled = time.monotonic()
    for job in jobs:
        worker.cancel(job)
    while worker.in_flight:
        await asyncio.sleep(0.005)
    busy = time.monotonic() - cancelled
    await worker.stop()
    return {"abandon_check": check, "engine_busy_after_cancel_s": round(busy, 3),
            "decode_steps_after_cancel": len(steps) - steps_at_cancel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model directory trained by selfrag")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    engine = HFEngine(args.model, batch_size=args.clients)
    steps: list[int] = []
    engine.model.register_forward_pre_hook(lambda _m, _a, kw: steps.append(int(kw["input_ids"].shape[0])),
                                           with_kwargs=True)
    backend = Backend(engine, None, "bench")
    questions = [query.question for query in load_queries(DEMO_QUERIES)][: args.clients]
    settings = InferenceConfig(mode="never", max_tokens=args.max_tokens)
    started = time.monotonic()
    list(backend.stream_many(settings, questions))  # warm-up and reference: the whole batch, nobody leaves
    full = {"full_answer_s": round(time.monotonic() - started, 3), "decode_steps": len(steps)}
    print(json.dumps(full), flush=True)
    results = []
    for check in (False, True):
        steps.clear()
        results.append(asyncio.run(measure(backend, questions, settings, check, steps)))
        print(json.dumps(results[-1]), flush=True)
    print("\n| abandon check | engine busy after every client left | decode steps after |\n|---|---|---|")
    for result in results:
        print(f"| {'on' if result['abandon_check'] else 'off (before)'} | {result['engine_busy_after_cancel_s']} s "
              f"| {result['decode_steps_after_cancel']} |")
    if results[1]["engine_busy_after_cancel_s"] > 0:
        ratio = results[0]["engine_busy_after_cancel_s"] / results[1]["engine_busy_after_cancel_s"]
        print(f"\nbusy time, off / on: {ratio:.0f}x  ({args.clients} clients, max_tokens={args.max_tokens}, "
              f"whole batch {full['full_answer_s']} s)")


if __name__ == "__main__":
    main()
