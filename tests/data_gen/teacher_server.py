"""A real HTTP server on loopback that speaks the OpenAI chat API, with scripted replies and injected faults.

The scripted teacher answers from the request's content only (never from call order), so a rerun asks
the same questions and gets the same answers. Faults are injected on the first sight of a request:
429 (with Retry-After), 500, a malformed body, a reply slower than the client's timeout. Markers in a
question script label-level faults: ``#malformed`` (first reply of each label is not JSON), ``#vocab``
(relevance labels outside the vocabulary, always), ``#hopeless`` (the retrieve label is never valid).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from selfrag.data_gen.assembly import answer_usable, question_usable
from selfrag.data_gen.cache import call_key
from selfrag.data_gen.labelers import INSTRUCTIONS, label_usable

WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if len(w) > 3}


def field(user: str, name: str) -> str:
    match = re.search(rf"^{name}: (.*)$", user, re.MULTILINE)
    return match.group(1) if match else ""


def item_of(user: str) -> str:
    """The item a label prompt asks about: the block after the last ``##`` (the paper's demonstrations come before)."""
    return user.rsplit("\n##\n", 1)[-1]


def scripted_label(kind: str, user: str) -> str:
    user = item_of(user)
    question, output = field(user, "Instruction"), field(user, "Output")
    match = re.search(r"^Evidence: (.*?)\n(?:Output|\n)", user, re.MULTILINE | re.DOTALL)
    evidence = match.group(1) if match else ""
    if kind == "retrieve":
        return "[No Retrieval]" if "poem" in question.lower() else "[Retrieval]"
    if kind == "retrieve_sentence":
        return "[Continue to Use Evidence]" if words(output) & words(evidence) else "[No Retrieval]"
    if kind == "relevance":
        return "[Relevant]" if len(words(question) & words(evidence)) >= 2 else "[Irrelevant]"
    if kind == "support":
        share = len(words(output) & words(evidence)) / max(1, len(words(output)))
        return (
            "[Fully supported]"
            if share >= 0.8
            else "[Partially supported]"
            if share >= 0.4
            else "[No support / Contradictory]"
        )
    return "[Utility:5]" if len(output) > 20 else "[Utility:3]"


def scripted_reply(messages: list[dict[str, str]], seed: int) -> str:
    """The teacher's reply text to one chat request (``seed`` = base seed + attempt)."""
    user = next(message["content"] for message in messages if message["role"] == "user")  # the prompt, not a correction
    if user.startswith("Write one question"):
        passage = user.split("Passage: ", 1)[1]
        title = passage.split("\n", 1)[0]
        return json.dumps({"question": f"What does the passage about {title} say?", "answer": passage.split("\n")[-1]})
    if user.startswith("Answer the question"):
        return "It is Paris. The tower was built in 1889."
    kind = next(kind for kind, text in INSTRUCTIONS.items() if user.startswith(text))
    question = field(item_of(user), "Instruction")
    if "#malformed" in question and seed == 0:
        return "I think it is relevant."
    if "#vocab" in question and kind == "relevance":
        return json.dumps({"explanation": "unsure", "label": "[Maybe]"})
    if "#hopeless" in question and kind == "retrieve":
        return "```\n{broken"
    return json.dumps({"explanation": "scripted", "label": scripted_label(kind, user)})


def reply_usable(messages: list[dict[str, str]], text: str) -> bool:
    """Whether the generator can use ``text`` as the reply to ``messages`` (only usable replies are cached)."""
    user = next(message["content"] for message in messages if message["role"] == "user")
    kind = next((kind for kind, prompt in INSTRUCTIONS.items() if user.startswith(prompt)), None)
    if kind is not None:
        return label_usable(kind, text)
    return question_usable(text) if user.startswith("Write one question") else answer_usable(text)


class TeacherServer:
    """``with TeacherServer(faults=True, latency=0.0) as server: server.url`` -> http://127.0.0.1:PORT/v1."""

    def __init__(
        self,
        faults: bool = False,
        latency: float = 0.0,
        timeout_delay: float = 1.0,
        reply: Callable[[list[dict[str, str]], int], str] = scripted_reply,
    ) -> None:
        self.faults = faults
        self.latency = latency
        self.timeout_delay = timeout_delay
        self.reply = reply
        self.lock = threading.Lock()
        self.seen: Counter[str] = Counter()  # request fingerprint -> times received
        self.answered: list[dict[str, Any]] = []  # bodies answered with a valid 200
        self.statuses: Counter[str] = Counter()
        self.authorization: set[str] = set()  # Authorization headers received
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.authorization.add(self.headers.get("Authorization", ""))
                server.handle(self, body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 64

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def handle(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        fingerprint = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self.lock:
            self.seen[fingerprint] += 1
            first = self.seen[fingerprint] == 1
        fault = int(fingerprint[:8], 16) % 10 if self.faults and first else None
        if self.latency:
            time.sleep(self.latency)
        try:
            if fault == 0:
                self._send(handler, 429, {"error": "slow down"}, {"Retry-After": "0"}, "429")
            elif fault == 1:
                self._send(handler, 500, {"error": "boom"}, {}, "500")
            elif fault == 2:
                self._send_raw(handler, 200, b'{"choices": [', "malformed body")
            elif fault == 3:
                time.sleep(self.timeout_delay)
                self._send(handler, 503, {"error": "late"}, {}, "timeout")
            else:
                text = self.reply(body["messages"], int(body.get("seed", 0)))
                reply = {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                    "usage": {
                        "prompt_tokens": len(json.dumps(body["messages"])) // 4,
                        "completion_tokens": len(text) // 4,
                    },
                }
                with self.lock:
                    self.answered.append(body)
                self._send(handler, 200, reply, {}, "200")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _send(self, handler: BaseHTTPRequestHandler, status: int, data: Any, headers: dict[str, str], tag: str) -> None:
        self._send_raw(handler, status, json.dumps(data).encode(), tag, headers)

    def _send_raw(
        self, handler: BaseHTTPRequestHandler, status: int, raw: bytes, tag: str, headers: dict[str, str] | None = None
    ) -> None:
        with self.lock:
            self.statuses[tag] += 1
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(raw)

    def usable_answered(self) -> list[dict[str, Any]]:
        """The answered bodies whose reply the generator could use (the others are asked again on a rerun)."""
        with self.lock:
            bodies = list(self.answered)
        return [body for body in bodies if reply_usable(body["messages"], self.reply(body["messages"], body["seed"]))]

    def answered_keys(self, base_seed: int = 0) -> list[str]:
        """Cache keys (see selfrag.data_gen.cache.call_key) of the calls answered with a valid reply."""
        with self.lock:
            bodies = list(self.answered)
        return [
            call_key(
                body["model"],
                body["messages"],
                {
                    "max_tokens": body["max_tokens"],
                    "temperature": body["temperature"],
                    "seed": base_seed,
                    "attempt": body["seed"] - base_seed,
                },
            )
            for body in bodies
        ]

    def __enter__(self) -> TeacherServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_forever(latency: float = 0.0) -> None:
    """Run a scripted server in this process until it is killed; prints its URL first (for a test to kill it)."""
    server = TeacherServer(latency=latency)
    print(server.url, flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    import sys

    serve_forever(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)
