"""Helpers for the server tests: a scripted engine that answers three kinds of question, and a live server.

The engine is :class:`~selfrag.inference.engines.fake.ScriptedEngine` (hand-set log-probs, no model) with a
gate, so a test can hold an engine call open (queue full, batching, disconnect, shutdown). The server is real
uvicorn on a loopback socket in a thread, so the official ``openai`` client talks to it over TCP.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import uvicorn

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, PruningConfig
from selfrag.inference.engines import Generation, GenerationRequest, Script, ScriptedEngine
from selfrag.inference.retrievers.spec import RetrieverConfig
from selfrag.inference.server.app import create_app
from selfrag.inference.server.backend import Backend
from selfrag.inference.server.config import ServeConfig
from selfrag.prompting import encode_text
from selfrag.reflection import Group, ReflectionIds
from selfrag.retrieval import Hit
from selfrag.trajectory import Passage

MODEL = "selfrag-test"
PARIS = Passage("p-paris", "Paris", "Paris is the capital of France.")
LYON = Passage("p-lyon", "Lyon", "Lyon is a city in France.")
NICE = Passage("p-nice", "Nice", "Nice lies on the coast.")
PASSAGES = (PARIS, LYON, NICE)

CAPITAL = "What is the capital of France?"  # retrieves; Paris fully supports the answer
MAYOR = "Who is the mayor of Lyon?"  # retrieves; no passage supports any answer -> abstain or flag
ARITHMETIC = "What is 2 + 2?"  # the model decides not to retrieve
CAPITAL_ANSWER = "Paris is the capital of France."
MAYOR_ANSWER = "The mayor is Bob."
ARITHMETIC_ANSWER = "Four."


class FixedRetriever:
    """The three passages, in order, for every query."""

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [[Hit(p, 10.0 - i) for i, p in enumerate(PASSAGES[:k])] for _ in queries]


def _logprobs(ids: ReflectionIds, probabilities: Mapping[str, float]) -> dict[int, float]:
    return {ids.id(token): math.log(p) for token, p in probabilities.items() if p > 0}


def _continuation(tokenizer: Any, ids: ReflectionIds, text: str, relevance: float,
                  support: tuple[float, float, float]) -> Script:
    """``[Relevant|Irrelevant] text [support token][Utility:5]`` with the log-probs of each verdict."""
    relevance_token = rf.RELEVANT if relevance >= 0.5 else rf.IRRELEVANT
    support_tokens = rf.tokens_of(Group.SUPPORT)
    support_token = support_tokens[max(range(3), key=lambda i: support[i])]
    body = encode_text(tokenizer, text)
    tokens = [ids.id(relevance_token), *body, ids.id(support_token), ids.id("[Utility:5]")]
    scores = [_logprobs(ids, {rf.RELEVANT: relevance, rf.IRRELEVANT: 1 - relevance}), *({} for _ in body),
              _logprobs(ids, dict(zip(support_tokens, support, strict=True))),
              _logprobs(ids, {"[Utility:4]": 0.1, "[Utility:5]": 0.9})]
    return Script(tuple(tokens), tuple(scores))


def _decision(tokenizer: Any, ids: ReflectionIds, retrieve: float, text: str) -> Script:
    first = rf.RETRIEVAL if retrieve > 0.5 else rf.NO_RETRIEVAL
    tokens = [ids.id(first), *encode_text(tokenizer, text), ids.id("[Utility:4]")]
    return Script(tuple(tokens), (_logprobs(ids, {rf.RETRIEVAL: retrieve, rf.NO_RETRIEVAL: 1 - retrieve}),))


class ScriptedBackendEngine(ScriptedEngine):
    """Answers CAPITAL, MAYOR and ARITHMETIC (any other question: like ARITHMETIC); ``gate`` holds calls open."""

    def __init__(self, tokenizer: Any, ids: ReflectionIds) -> None:
        super().__init__(tokenizer, ids, self._pick)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set when a generate call starts
        self.delay_s = 0.0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.entered.set()
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the engine gate")
        if self.delay_s:
            time.sleep(self.delay_s)
        return super().generate(requests)

    def _pick(self, request: GenerationRequest) -> Script:
        tokenizer, ids = self.tokenizer, self.token_ids
        prompt = tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        if rf.PARAGRAPH_OPEN in prompt:  # a branch, or its rest after a verdict (its own, or one set by a threshold)
            if MAYOR in prompt:
                script = _continuation(tokenizer, ids, MAYOR_ANSWER, 0.6, (0.05, 0.15, 0.8))
            elif f"{rf.PARAGRAPH_OPEN}{PARIS.title}" in prompt:
                script = _continuation(tokenizer, ids, CAPITAL_ANSWER, 0.95, (0.8, 0.15, 0.05))
            else:
                script = _continuation(tokenizer, ids, "A city.", 0.3, (0.3, 0.5, 0.2))
            if request.prompt_ids[-1] in ids.ids(Group.RELEVANCE):
                return Script(script.token_ids[1:], tuple(script.logprobs[1:]))
            return script
        if request.prompt_ids[-1] == ids.id(rf.NO_RETRIEVAL):
            return Script((*encode_text(tokenizer, ARITHMETIC_ANSWER), ids.id("[Utility:4]")))
        if CAPITAL in prompt or MAYOR in prompt:
            return _decision(tokenizer, ids, 0.9, "no")
        return _decision(tokenizer, ids, 0.05, ARITHMETIC_ANSWER)

    def batch_sizes(self) -> list[int]:
        return [len(batch) for batch in self.calls]


def serve_config(**overrides: Any) -> ServeConfig:
    # One round, no pruning: these scripts answer whole continuations (both have their own runtime tests).
    values: dict[str, Any] = {"model": MODEL, "retriever": RetrieverConfig(corpus="unused.jsonl"),
                              "served_model_name": MODEL,
                              "batch_wait_ms": 5.0,
                              "inference": InferenceConfig(max_rounds=0, pruning=PruningConfig(enabled=False))}
    values.update(overrides)
    return ServeConfig(**values)


class LiveServer:
    """uvicorn on 127.0.0.1 (a free port) in a thread; ``stop()`` is a graceful shutdown."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.socket.close()

    @property
    def state(self) -> Any:
        return self.app.state.selfrag


def start_server(engine: ScriptedBackendEngine, api_key: str | None = None, **overrides: Any) -> LiveServer:
    backend = Backend(engine, FixedRetriever(), MODEL)
    return LiveServer(create_app(serve_config(**overrides), backend, api_key=api_key)).start()


@contextlib.contextmanager
def serving(engine: ScriptedBackendEngine, api_key: str | None = None, **overrides: Any) -> Iterator[LiveServer]:
    """:func:`start_server` for the ``with`` block; on the way out the engine's gate opens (a test may have closed
    it: a held call would keep the server from stopping) and the server stops."""
    live = start_server(engine, api_key, **overrides)
    try:
        yield live
    finally:
        engine.gate.set()
        live.stop()


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)
