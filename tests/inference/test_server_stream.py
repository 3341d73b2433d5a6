"""Server streams carry the runtime's events as it yields them (not a replay of the finished answer).

Scripted engines over the real loopback socket, driven by the official ``openai`` client and raw httpx. The
long-form engine can hold the decode of one passage's segment until the test opens its gate, so a test can see
what reached the client before that segment was decoded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import openai
import pytest
from runtime_scripts import KeyedEngine, Segments, passage_key
from server_harness import (
    ARITHMETIC,
    ARITHMETIC_ANSWER,
    CAPITAL,
    CAPITAL_ANSWER,
    LYON,
    MAYOR,
    MODEL,
    NICE,
    PARIS,
    LiveServer,
    ScriptedBackendEngine,
    start_server,
    wait_until,
)

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, LongFormConfig, PruningConfig
from selfrag.inference.engines import Generation, GenerationRequest
from selfrag.trajectory import Passage

QUESTION = "Tell me about French cities."
RELEVANT = (rf.RELEVANT, {rf.RELEVANT: 0.9, rf.IRRELEVANT: 0.1})
FULL = (rf.FULLY_SUPPORTED, {rf.FULLY_SUPPORTED: 0.9, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.05})
NONE = (rf.NO_SUPPORT, {rf.FULLY_SUPPORTED: 0.05, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.9})
AGAIN = (rf.RETRIEVAL, {rf.RETRIEVAL: 0.8, rf.NO_RETRIEVAL: 0.2})
END = ("[Utility:5]", {"[Utility:5]": 0.9, "[Utility:1]": 0.1})
OFF = PruningConfig(enabled=False)
GATE_S = 5.0  # a gated decode fails after this long: a replaying server makes the test fail, not hang

# Long form, one beam, one passage per retrieval: each passage's decode is one segment.
TWO_SEGMENTS = {
    PARIS: [RELEVANT, "Paris is the capital.", FULL, AGAIN],
    LYON: [RELEVANT, "Lyon is second.", FULL, END],
}
THREE_SEGMENTS = {
    PARIS: [RELEVANT, "Paris is the capital.", FULL, AGAIN],
    LYON: [RELEVANT, "Lyon is second.", FULL, AGAIN],
    NICE: [RELEVANT, "Nice is on the coast.", FULL, END],
}
LONG = InferenceConfig(form="long", mode="always", top_k=1, max_rounds=0, long_form=LongFormConfig(width=1),
                       pruning=OFF)


class GatedEngine(KeyedEngine):
    """Answers by the passage that ends the prompt; a decode with ``gated``'s evidence waits for ``gate``."""

    def __init__(self, tokenizer: Any, ids: Any, table: Mapping[Passage, Sequence[Any]],
                 gated: Passage | None = None) -> None:
        segments = Segments(tokenizer, ids)
        super().__init__(tokenizer, ids, {passage_key(tokenizer, ids, p): segments.script(*steps)
                                          for p, steps in table.items()})
        self.gated = None if gated is None else passage_key(tokenizer, ids, gated)
        self.gate = threading.Event()
        if gated is None:
            self.gate.set()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if any(self.uses(request, self.gated) for request in requests) and not self.gate.wait(GATE_S):
            raise TimeoutError("the test never opened the gate: nothing reached it before this decode")
        return super().generate(requests)

    @staticmethod
    def uses(request: GenerationRequest, key: tuple[int, ...] | None) -> bool:
        prompt = request.prompt_ids
        return key is not None and any(prompt[i:i + len(key)] == key for i in range(len(prompt) - len(key) + 1))

    def decoded(self, passage: Passage) -> bool:
        key = passage_key(self.tokenizer, self.token_ids, passage)
        return any(self.uses(request, key) for batch in self.calls for request in batch)


@pytest.fixture
def gated(reflection_tokenizer, token_ids):  # type: ignore[no-untyped-def]
    def make(table: Mapping[Passage, Sequence[Any]], gate: Passage | None = None) -> GatedEngine:
        return GatedEngine(reflection_tokenizer, token_ids, table, gate)

    return make


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[tuple[LiveServer, Any]] = []

    def start(engine: Any, **overrides: Any) -> LiveServer:
        live = start_server(engine, **overrides)
        started.append((live, engine))
        return live

    yield start
    for live, engine in started:
        for gate in (engine.gate, getattr(engine, "branches", engine.gate)):
            gate.set()
        live.stop()


def client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=GATE_S * 2)


@contextlib.contextmanager
def _streamed(live: LiveServer) -> Iterator[httpx.Response]:
    """A raw streamed chat completion of QUESTION, read line by line by the test (the client may leave early)."""
    body = {"model": MODEL, "messages": _messages(QUESTION), "stream": True}
    with httpx.Client(timeout=GATE_S * 2) as http, http.stream(
        "POST", f"{live.url}/v1/chat/completions", json=body
    ) as response:
        yield response


def _messages(question: str) -> Any:
    return [{"role": "user", "content": question}]


def ask(live: LiveServer, question: str, **extra: Any) -> Any:
    return client(live).chat.completions.create(model=MODEL, messages=_messages(question), extra_body=extra or None)


def stream(live: LiveServer, question: str, **extra: Any) -> Any:
    return client(live).chat.completions.create(model=MODEL, messages=_messages(question), stream=True,
                                                stream_options={"include_usage": True}, extra_body=extra or None)


def deltas(chunks: Sequence[Any]) -> list[str]:
    return [chunk.choices[0].delta.content for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]


def selfrag_events(chunks: Sequence[Any], kind: str) -> list[dict[str, Any]]:
    return [c.model_extra["selfrag"] for c in chunks if (c.model_extra.get("selfrag") or {}).get("type") == kind]


# -- segments go out as they become final ---------------------------------------------------------------------


def test_first_segment_reaches_the_client_before_the_second_is_decoded(gated, serve) -> None:  # type: ignore[no-untyped-def]
    engine = gated(TWO_SEGMENTS, gate=LYON)
    live = serve(engine, inference=LONG)
    received: list[str] = []
    try:
        for chunk in stream(live, QUESTION):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
                if len(received) == 1:
                    assert not engine.decoded(LYON), "the second segment was decoded before the first was sent"
                    engine.gate.set()  # only now may the engine decode the second segment
    except openai.APIError as error:
        pytest.fail(f"the stream failed with {received} received: the first segment did not reach the client "
                    f"while the engine held the second segment's decode ({error})")
    assert received == ["Paris is the capital.", " Lyon is second."]
    assert engine.decoded(LYON)


def test_trace_events_arrive_while_the_answer_is_still_being_decoded(gated, serve) -> None:  # type: ignore[no-untyped-def]
    engine = gated(TWO_SEGMENTS, gate=LYON)
    live = serve(engine, inference=LONG)
    with _streamed(live) as response:
        lines = response.iter_lines()
        first: list[dict[str, Any]] = []
        for line in lines:
            if line.startswith("data: {"):
                first.append(json.loads(line[6:]))
                if first[-1].get("choices") and first[-1]["choices"][0]["delta"].get("content"):
                    break
        steps = [chunk["selfrag"]["step"]["step"] for chunk in first if chunk.get("selfrag", {}).get("type") == "trace"]
        # the first retrieval, its relevance verdict, the decision to retrieve again and the beam step: all before
        # LYON is decoded
        assert steps == ["retrieve", "relevance", "decide", "beam"] and not engine.decoded(LYON)
        engine.gate.set()
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"


@pytest.mark.parametrize(("question", "extra"), [
    (CAPITAL, {}), (MAYOR, {}), (MAYOR, {"on_unsupported": "flag"}), (ARITHMETIC, {}),
])
def test_short_form_stream_equals_the_plain_answer(reflection_tokenizer, token_ids, serve, question,  # type: ignore[no-untyped-def]
                                                   extra) -> None:
    live = serve(ScriptedBackendEngine(reflection_tokenizer, token_ids))
    _check_stream_equals_plain(live, question, **extra)


@pytest.mark.parametrize("table", [TWO_SEGMENTS, THREE_SEGMENTS], ids=["two", "three"])
def test_long_form_stream_equals_the_plain_answer(gated, serve, table) -> None:  # type: ignore[no-untyped-def]
    live = serve(gated(table), inference=LONG)
    chunks = _check_stream_equals_plain(live, QUESTION)
    assert len(deltas(chunks)) == len(table)  # a delta per segment
    assert [e["citation"]["passage_id"] for e in selfrag_events(chunks, "citation")] == [p.id for p in table]


def _check_stream_equals_plain(live: LiveServer, question: str, **extra: Any) -> list[Any]:
    plain = ask(live, question, **extra)
    chunks = list(stream(live, question, **extra))
    assert "".join(deltas(chunks)) == plain.choices[0].message.content
    [final] = selfrag_events(chunks, "final")
    assert {key: value for key, value in final.items() if key != "type"} == plain.model_extra["selfrag"]
    final_chunk = next(c for c in chunks if (c.model_extra.get("selfrag") or {}).get("type") == "final")
    assert final_chunk.choices[0].finish_reason == plain.choices[0].finish_reason
    assert chunks[-1].usage.model_dump() == plain.usage.model_dump()
    return chunks


# -- concurrent streams share engine calls --------------------------------------------------------------------


class BranchGatedEngine(ScriptedBackendEngine):
    """The server harness's engine; decodes after a passage (``<paragraph>`` in the prompt) wait for ``branches``."""

    def __init__(self, tokenizer: Any, ids: Any) -> None:
        super().__init__(tokenizer, ids)
        self.branches = threading.Event()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        prompts = [self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False) for request in requests]
        if any(rf.PARAGRAPH_OPEN in prompt for prompt in prompts) and not self.branches.wait(GATE_S):
            raise TimeoutError("the test never opened the branch gate")
        return super().generate(requests)


def _collect(live: LiveServer, question: str, **extra: Any) -> tuple[threading.Thread, list[Any]]:
    results: list[Any] = []

    def target() -> None:
        try:
            results.append(list(stream(live, question, **extra)))
        except Exception as error:  # noqa: BLE001 - handed to the test
            results.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, results


def test_concurrent_streams_share_engine_calls(reflection_tokenizer, token_ids, serve) -> None:  # type: ignore[no-untyped-def]
    engine = ScriptedBackendEngine(reflection_tokenizer, token_ids)
    live = serve(engine, max_batch=8, batch_wait_ms=50)
    engine.gate.clear()
    blocker = _collect(live, ARITHMETIC)
    assert engine.entered.wait(10)
    streams = [_collect(live, question) for question in (ARITHMETIC, "What is 3 + 3?", "What is 4 + 4?")]
    plain_thread = threading.Thread(target=ask, args=(live, "What is 5 + 5?"), daemon=True)
    plain_thread.start()
    wait_until(lambda: live.state.worker.depth == 4)
    engine.gate.set()
    for thread, _ in (blocker, *streams):
        thread.join(10)
    plain_thread.join(10)
    assert all(deltas(result[0]) == [ARITHMETIC_ANSWER] for _, result in streams)
    assert engine.batch_sizes() == [1, 4]  # the three streams and the plain request decided in ONE call


def test_in_a_batch_each_stream_gets_its_text_once_its_own_verdict_is_in(reflection_tokenizer, token_ids,  # type: ignore[no-untyped-def]
                                                                         serve) -> None:
    engine = BranchGatedEngine(reflection_tokenizer, token_ids)
    live = serve(engine, max_batch=2, batch_wait_ms=2000)  # the batch closes when both have arrived
    retrieving, retrieving_result = _collect(live, CAPITAL)
    direct, direct_result = _collect(live, ARITHMETIC)
    direct.join(GATE_S)  # done while CAPITAL's passage branches are still held
    assert not direct.is_alive() and deltas(direct_result[0]) == [ARITHMETIC_ANSWER], direct_result
    assert retrieving.is_alive() and engine.batch_sizes() == [2]  # one decision call for both
    engine.branches.set()
    retrieving.join(10)
    assert deltas(retrieving_result[0]) == [CAPITAL_ANSWER]


# -- text that is later withdrawn is never sent ---------------------------------------------------------------


@pytest.mark.parametrize("form", ["short", "long"])
def test_a_rejected_segment_is_never_sent(gated, serve, form) -> None:  # type: ignore[no-untyped-def]
    if form == "long":  # Lyon's segment is unsupported: the beam re-retrieves and Nice's replaces it
        table = {PARIS: TWO_SEGMENTS[PARIS], LYON: [RELEVANT, "Lyon is in Italy.", NONE, END],
                 NICE: [RELEVANT, "Nice is on the coast.", FULL, END]}
        expected, cited = ["Paris is the capital.", " Nice is on the coast."], [PARIS.id, NICE.id]
    else:  # the first round's answer is unsupported: round two's replaces it
        table = {PARIS: [RELEVANT, "Lyon is in Italy.", NONE, END], LYON: [RELEVANT, "Paris.", FULL, END]}
        expected, cited = ["Paris."], [LYON.id]
    settings = LONG if form == "long" else InferenceConfig(mode="always", top_k=1, pruning=OFF)
    live = serve(gated(table), inference=dataclasses.replace(settings, max_rounds=1))
    chunks = list(stream(live, QUESTION))
    assert deltas(chunks) == expected and not any("Italy" in text for text in deltas(chunks))
    assert [e["citation"]["passage_id"] for e in selfrag_events(chunks, "citation")] == cited
    support = [e["step"] for e in selfrag_events(chunks, "trace") if e["step"]["step"] == "support"]
    assert support[0]["chosen"] == "re-retrieve"  # the rejection is in the trace, its text is not in the answer
    [final] = selfrag_events(chunks, "final")
    assert not final["abstained"] and not final["low_confidence"]


# -- limits: timeouts and disconnects while a stream is in the engine -----------------------------------------


def test_timeout_mid_stream_ends_it_with_an_error_after_the_segments_already_sent(gated, serve) -> None:  # type: ignore[no-untyped-def]
    engine = gated(TWO_SEGMENTS, gate=LYON)
    live = serve(engine, inference=LONG, timeout_s=2.0)
    response = httpx.post(f"{live.url}/v1/chat/completions", timeout=GATE_S * 2,
                          json={"model": MODEL, "messages": _messages(QUESTION), "stream": True})
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(item) for item in data[:-1]]
    content = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
    assert "Paris is the capital." in content  # sent before the engine stalled
    assert chunks[-1]["error"]["code"] == "timeout" and data[-1] == "[DONE]"
    assert 'selfrag_rejected_total{reason="timeout"} 1.0' in httpx.get(f"{live.url}/metrics").text


def test_an_engine_failure_mid_stream_ends_it_with_an_error_and_the_server_goes_on(gated, serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(gated({PARIS: TWO_SEGMENTS[PARIS]}), inference=LONG)  # no script for Lyon: the second decode fails
    response = httpx.post(f"{live.url}/v1/chat/completions", timeout=GATE_S * 2,
                          json={"model": MODEL, "messages": _messages(QUESTION), "stream": True})
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(item) for item in data[:-1]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks if c.get("choices")][1:] == ["Paris is the capital."]
    assert chunks[-1]["error"]["type"] == "server_error" and "KeyError" in chunks[-1]["error"]["message"]
    assert data[-1] == "[DONE]" and "Traceback" not in response.text
    assert httpx.get(f"{live.url}/health").json()["status"] == "ready"


def test_a_client_that_leaves_mid_stream_stops_the_engine_at_the_next_event(gated, serve) -> None:  # type: ignore[no-untyped-def]
    engine = gated(THREE_SEGMENTS, gate=LYON)
    live = serve(engine, inference=LONG)
    with _streamed(live) as response:
        for line in response.iter_lines():
            if '"content": "Paris is the capital."' in line:
                break  # the first segment arrived; the client leaves while the engine holds the second
    wait_until(lambda: 'selfrag_rejected_total{reason="disconnected"} 1.0' in httpx.get(f"{live.url}/metrics").text)
    engine.gate.set()  # the second segment's decode (already in the engine) completes ...
    wait_until(lambda: engine.decoded(LYON) and live.state.worker.in_flight == 0)
    assert not engine.decoded(NICE)  # ... and the stream stops there: the third is never decoded
    assert ask(live, QUESTION).choices[0].message.content == \
        "Paris is the capital. Lyon is second. Nice is on the coast."
