"""Teacher-labelled data generation against an HTTP teacher of fixed latency: concurrency 1 vs 16, one run.

    .venv/bin/python benchmarks/teacher_concurrency.py --questions 48 --latency 0.1

Starts an OpenAI-compatible chat server on loopback that answers every call after ``--latency`` seconds
(a stand-in for a remote teacher: the time is the network and the model, not this machine), then runs
``selfrag generate labeler=llm`` on the same synthetic questions twice into fresh output directories (no
cache hits): with ``teacher.engine_options.concurrency=1`` (the baseline) and with ``--concurrency`` (default 16).
Prints questions per second, teacher calls per second and the ratio to the baseline; both runs must
write identical records.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from selfrag.config import load_config
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.run import run

TOPICS = ["river", "castle", "comet", "violin", "glacier", "harbor", "desert", "orchid", "engine", "library"]


def reply_for(user: str) -> str:
    """A valid label for whichever labeler prompt this is (content-only, so both runs agree)."""
    if "[Utility:1]" in user:
        label = "[Utility:4]"
    elif "[Fully supported]" in user:
        label = "[Fully supported]"
    elif "[Relevant]" in user:
        label = "[Relevant]" if "Evidence: " in user and user.count("topic") > 1 else "[Irrelevant]"
    elif "[Continue to Use Evidence]" in user:
        label = "[Continue to Use Evidence]"
    else:
        label = "[Retrieval]"
    return json.dumps({"explanation": "benchmark", "label": label})


def serve(latency: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency)
            prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
            text = reply_for(prompt)
            # a token counted as 4 characters (data_gen_ray.py reports tokens per question)
            usage = {"prompt_tokens": len(json.dumps(body["messages"])) // 4, "completion_tokens": len(text) // 4}
            raw = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}], "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw.encode())

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128  # the listen backlog; the default 5 drops bursts of new connections

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def write_data(folder: Path, questions: int) -> tuple[Path, Path]:
    corpus, queries = folder / "corpus.jsonl", folder / "queries.jsonl"
    with corpus.open("w") as handle:
        for number, topic in enumerate(TOPICS * 3):
            text = f"The {topic} topic, part {number}: facts about the {topic} and its history."
            handle.write(json.dumps({"id": f"p{number}", "title": topic.title(), "text": text}) + "\n")
    with queries.open("w") as handle:
        for number in range(questions):
            topic = TOPICS[number % len(TOPICS)]
            answer = f"The {topic} is old. The {topic} is famous."
            handle.write(
                json.dumps(
                    {"id": f"q{number:04d}", "question": f"What about the {topic} topic {number}?", "output": answer}
                )
                + "\n"
            )
    return corpus, queries


def measure(url: str, data: tuple[Path, Path], output: Path, concurrency: int, *extra: str) -> tuple[float, Any]:
    """Seconds of one ``generate labeler=llm`` run into ``output`` (``extra``: more overrides), and its result."""
    config = load_config(
        GenerateConfig,
        None,
        [
            "labeler=llm",
            "teacher.model=bench",
            f"teacher.engine_options.base_url={url}",
            f"teacher.engine_options.concurrency={concurrency}",
            f"teacher.cache={output}.sqlite",  # its own, empty: the per-teacher default would answer the 2nd run
            "split=all",
            f"passages={data[0]}",
            f"queries={data[1]}",
            f"output={output}",
            *extra,
        ],
    )
    start = time.perf_counter()
    result = run(config)
    return time.perf_counter() - start, result


def teacher_parser(description: str | None, concurrency: int, concurrency_help: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark against the loopback teacher: questions, the teacher's latency, concurrency."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds the teacher takes per call")
    parser.add_argument("--concurrency", type=int, default=concurrency, help=concurrency_help)
    return parser


def main() -> None:
    parser = teacher_parser(__doc__, 16, "teacher.engine_options.concurrency of the second run (the first: 1)")
    args = parser.parse_args()
    server = serve(args.latency)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = write_data(folder, args.questions)
        rows = []
        for concurrency in (1, args.concurrency):
            seconds, result = measure(url, data, folder / f"c{concurrency}", concurrency)
            rows.append((concurrency, seconds, result.stats["run"]["teacher_calls_made"]))
        same = (folder / "c1" / "records.jsonl").read_bytes() == (
            folder / f"c{args.concurrency}" / "records.jsonl"
        ).read_bytes()
    server.shutdown()
    base = rows[0][1]
    print(f"{args.questions} questions, teacher latency {args.latency * 1000:.0f} ms per call")
    print("| concurrency | seconds | questions/s | calls/s | speed-up |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for concurrency, seconds, calls in rows:
        print(
            f"| {concurrency} | {seconds:.2f} | {args.questions / seconds:.2f} | {calls / seconds:.1f} "
            f"| {base / seconds:.1f}x |"
        )
    print(f"identical records: {same}")


if __name__ == "__main__":
    main()
