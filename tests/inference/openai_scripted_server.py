"""A scripted OpenAI-compatible completions server on loopback, backed by a real engine, with injected faults.

It answers ``POST /v1/completions`` the way vLLM's server does (prompt as token ids, ``token_id:N`` tokens,
``logprob_token_ids`` or top-k ``logprobs``) by running the given engine, and plays a queue of faults first:
``429``, ``500``, ``malformed`` (invalid JSON), ``sleep`` (slower than the client's timeout), ``nochoices``.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from selfrag.inference.engines import GenerationRequest


class _QuietServer(ThreadingHTTPServer):
    """A client that gave up (the ``sleep`` fault) makes the late reply a broken pipe; socketserver would print its
    traceback to stderr from the handler thread, into whichever test runs next in this process. Such a pipe is the
    point of the fault, so it stays quiet, and ``server_close`` joins the handler threads so none outlives its test."""

    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class ScriptedServer:
    def __init__(self, engine: Any, honour_token_ids: bool = True, sleep: float = 1.0, api_key: str | None = None,
                 max_model_len: int | None = None):
        self.engine = engine
        self.max_model_len = max_model_len  # listed on /v1/models as vLLM does, where set
        self.honour_token_ids = honour_token_ids
        self.sleep = sleep
        self.api_key = api_key
        self.faults: deque[str] = deque()
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.closing = threading.Event()  # ends a ``sleep`` fault's wait early, so closing joins no sleeper

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        scored = body.get("logprob_token_ids") if self.honour_token_ids else None
        score_ids = tuple(scored or ())
        top_k = int(body.get("logprobs") or 0) if not scored else 0
        every = tuple(range(len(self.engine.tokenizer)))
        request = GenerationRequest(
            tuple(body["prompt"]),
            max_tokens=body["max_tokens"],
            stop_token_ids=tuple(body.get("stop_token_ids") or ()),
            temperature=body.get("temperature", 0.0),
            score_token_ids=score_ids or (every if top_k else ()),
            # as vLLM's server: a -100 logit bias bans the id; min_tokens holds back stop ids and eos
            banned_token_ids=tuple(int(i) for i, bias in (body.get("logit_bias") or {}).items() if bias <= -100),
            min_tokens=int(body.get("min_tokens") or 0),
        )
        with self.lock:  # the engine is not thread-safe
            [generation] = self.engine.generate([request])
        tops = []
        for position, token_id in enumerate(generation.token_ids):
            values = generation.score_logprobs[position]
            if top_k:
                values = dict(sorted(values.items(), key=lambda item: -item[1])[:top_k])
            values = {**values, token_id: generation.score_logprobs[position].get(token_id, 0.0)}
            tops.append({f"token_id:{t}": v for t, v in values.items()})
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "text": generation.text,
                    "finish_reason": "stop" if generation.finish_reason != "length" else "length",
                    "logprobs": {"tokens": [f"token_id:{t}" for t in generation.token_ids], "top_logprobs": tops},
                }
            ],
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:  # noqa: N802
                card: dict[str, Any] = {"id": "scripted-model", "object": "model"}
                if owner.max_model_len is not None:
                    card["max_model_len"] = owner.max_model_len
                self._send(200, json.dumps({"object": "list", "data": [card]}).encode())

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if owner.api_key and self.headers.get("Authorization") != f"Bearer {owner.api_key}":
                    self._send(401, b'{"error": "bad key"}')
                    return
                with owner.lock:
                    owner.bodies.append(body)
                    fault = owner.faults.popleft() if owner.faults else None
                if fault == "429":
                    self._send(429, b'{"error": "busy"}', {"Retry-After": "0"})
                elif fault == "500":
                    self._send(500, b'{"error": "boom"}')
                elif fault == "malformed":
                    self._send(200, b'{"choices": [ {"text": "trunc')
                elif fault == "nochoices":
                    self._send(200, b'{"object": "error"}')
                elif fault == "sleep":
                    if owner.closing.wait(owner.sleep):
                        return  # the server is closing; the client gave up long ago
                    self._send(200, json.dumps(owner.complete(body)).encode())
                else:
                    self._send(200, json.dumps(owner.complete(body)).encode())

        return Handler
