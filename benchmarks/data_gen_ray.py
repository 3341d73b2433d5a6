"""Teacher labelling in 1 process vs on Ray with 2 workers, against a teacher of fixed latency, in one run.

    .venv/bin/python benchmarks/data_gen_ray.py --questions 48 --latency 0.1 --concurrency 4

Starts an OpenAI-compatible chat server on loopback that answers every call after ``--latency`` seconds (a stand-in
for a remote teacher: the time is the network and the model), then runs ``selfrag generate labeler=llm`` on the same
synthetic questions into fresh output directories, each with its own empty teacher cache: once in this process
(``executor=local``, the baseline), once with ``executor=ray ray.workers=2`` on a local Ray (each worker with the
same ``teacher.engine_options.concurrency``) and once as Ray Data stages (``ray.stages=true``, ``--stage-workers``
tasks a stage, each with the same ``teacher.engine_options.concurrency``). Prints questions per second with the ratio
to the baseline (Ray's start-up included and, separately, the labelling alone), the staged run's ratio to the
per-question workers, per-question teacher calls and tokens (the server counts a token as 4 characters), and whether
all runs wrote the same bytes. Then both again with their journals deleted: every call
answered from the cache (in process vs through the Ray cache keeper), questions and cache lookups per second.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from teacher_concurrency import measure, serve, teacher_parser, write_data

from selfrag.data_gen.ray_stages import STAGE_FUNCTIONS

STAGE_NAMES = tuple(STAGE_FUNCTIONS)


def main() -> None:
    parser = teacher_parser(__doc__, 4, "teacher.engine_options.concurrency of each process/worker")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stage-workers", type=int, default=1, help="ray.stage_workers.* of the staged run")
    args = parser.parse_args()
    import ray

    server = serve(args.latency)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = write_data(folder, args.questions)
        local_seconds, local = measure(url, data, folder / "local", args.concurrency)
        started = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        ray_start = time.perf_counter() - started
        ray_seconds, on_ray = measure(
            url, data, folder / "ray", args.concurrency, "executor=ray", f"ray.workers={args.workers}",
            f"ray.batch_size={max(1, args.questions // (4 * args.workers))}",
        )
        # The same labelling as Ray Data stages (ray.stages=true): one operator per decision type.
        staged_seconds, staged = measure(
            url, data, folder / "staged", args.concurrency, "executor=ray", f"ray.workers={args.workers}",
            "ray.stages=true", *(f"ray.stage_workers.{name}={args.stage_workers}" for name in STAGE_NAMES),
            f"ray.batch_size={max(1, args.questions // (4 * args.workers))}",
        )
        # Reruns answered wholly from the cache (journal deleted): direct SQLite in 1 process vs the Ray workers'
        # lookups through the cache keeper actor on the driver's node.
        rerun_local = rerun(measure, url, data, folder / "local", args.concurrency)
        batches = f"ray.batch_size={max(1, args.questions // (4 * args.workers))}"
        rerun_ray = rerun(measure, url, data, folder / "ray", args.concurrency, "executor=ray",
                          f"ray.workers={args.workers}", batches)
        keeper_rates = cache_rates(folder / "ray.sqlite", in_flight=16)
        ray.shutdown()
        same = all(
            (folder / "local" / name).read_bytes() == (folder / run / name).read_bytes()
            for name in ("records.jsonl", "critic.jsonl", "drops.jsonl")
            for run in ("ray", "staged")
        )
    server.shutdown()
    teacher = local.stats["teacher"]
    per_question = {key: teacher[key] / args.questions for key in ("calls", "prompt_tokens", "completion_tokens")}
    print(
        f"{args.questions} questions, teacher latency {args.latency * 1000:.0f} ms per call, "
        f"teacher.engine_options.concurrency={args.concurrency} per process"
    )
    print("| run | seconds | questions/s | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| 1 process | {local_seconds:.2f} | {args.questions / local_seconds:.2f} | 1.00x |")
    total = ray_seconds + ray_start
    print(f"| Ray, {args.workers} workers (with Ray start) | {total:.2f} | {args.questions / total:.2f} "
          f"| {local_seconds / total:.2f}x |")
    print(f"| Ray, {args.workers} workers (generate alone) | {ray_seconds:.2f} | {args.questions / ray_seconds:.2f} "
          f"| {local_seconds / ray_seconds:.2f}x |")
    print(f"| Ray Data stages, {args.stage_workers} task(s) a stage (generate alone) | {staged_seconds:.2f} "
          f"| {args.questions / staged_seconds:.2f} | {local_seconds / staged_seconds:.2f}x |")
    print(f"staged vs per-question workers: {ray_seconds / staged_seconds:.2f}x the questions/s; calls per stage: "
          + ", ".join(f"{name} {c['made']}" for name, c in staged.stats["run"]["stages"].items()))
    print(
        f"per question: {per_question['calls']:.1f} teacher calls, {per_question['prompt_tokens']:.0f} prompt + "
        f"{per_question['completion_tokens']:.0f} completion tokens; calls made: 1 process "
        f"{local.stats['run']['teacher_calls_made']}, Ray {on_ray.stats['run']['teacher_calls_made']}"
    )
    print(f"identical records, critic rows and drops: {same}")
    print("\nrerun with the journal deleted, every call from the cache:")
    print("| run | seconds | questions/s | cache lookups/s | calls made |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (seconds, result) in (("1 process (SQLite in process)", rerun_local),
                                    (f"Ray, {args.workers} workers (cache keeper actor)", rerun_ray)):
        hits = result.stats["run"]["teacher_calls_from_cache"]
        print(f"| {name} | {seconds:.2f} | {args.questions / seconds:.2f} | {hits / seconds:.0f} "
              f"| {result.stats['run']['teacher_calls_made']} |")


    print(
        f"cache keeper from the driver, 16 in flight: {keeper_rates[0]:.0f} lookups/s, {keeper_rates[1]:.0f} "
        f"stores/s (in-process SQLite: {keeper_rates[2]:.0f} lookups/s)"
    )


def cache_rates(path: Path, in_flight: int, count: int = 2000) -> tuple[float, float, float]:
    """Lookups and stores per second through the Ray cache keeper (as a labelling worker makes them), and lookups
    per second straight from SQLite in this process."""
    import asyncio

    import ray

    from selfrag.data_gen.cache import CachedReply, CallCache, SharedCache, start_keeper

    keeper = start_keeper(path.with_name("keeper-bench.sqlite"))
    ray.get(keeper.where.remote())  # started: its process start-up is not counted
    shared, reply = SharedCache(keeper), CachedReply("x" * 200, 1000, 20)

    async def each(operation: Any) -> float:
        slots = asyncio.Semaphore(in_flight)

        async def one(key: str) -> None:
            async with slots:
                await operation(key)

        start = time.perf_counter()
        await asyncio.gather(*(one(f"key-{n}") for n in range(count)))
        return count / (time.perf_counter() - start)

    stores = asyncio.run(each(lambda key: shared.store(key, "bench", reply)))
    lookups = asyncio.run(each(shared.lookup))
    local = CallCache(path.with_name("keeper-bench.sqlite"))
    start = time.perf_counter()
    for n in range(count):
        local.get(f"key-{n}")
    direct = count / (time.perf_counter() - start)
    local.close()
    return lookups, stores, direct


def rerun(measure: Any, url: str, data: tuple[Path, Path], output: Path, concurrency: int, *extra: str) -> Any:
    (output / "journal.jsonl").unlink()
    return measure(url, data, output, concurrency, *extra)


if __name__ == "__main__":
    main()
