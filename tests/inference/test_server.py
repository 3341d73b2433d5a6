"""The server over a real loopback socket, driven by the official ``openai`` client and raw httpx.

The engine is scripted (no model), so these run in seconds; test_server_model.py runs the real SmolLM2.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_harness import (
    ARITHMETIC,
    ARITHMETIC_ANSWER,
    CAPITAL,
    CAPITAL_ANSWER,
    MAYOR,
    MAYOR_ANSWER,
    MODEL,
    PARIS,
    LiveServer,
    ScriptedBackendEngine,
    serving,
    start_server,
    wait_until,
)

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig


@pytest.fixture(scope="module")
def shared_engine(reflection_tokenizer, token_ids) -> ScriptedBackendEngine:  # type: ignore[no-untyped-def]
    return ScriptedBackendEngine(reflection_tokenizer, token_ids)


@pytest.fixture(scope="module")
def server(shared_engine: ScriptedBackendEngine) -> Iterator[LiveServer]:
    """One server for the tests that neither gate the engine nor change the server's settings."""
    with serving(shared_engine) as live:
        yield live


def client(live: LiveServer, key: str = "unused") -> openai.OpenAI:
    """One client per server and key (building one loads TLS certificates: slow, and not what is tested)."""
    cache = live.__dict__.setdefault("clients", {})
    if key not in cache:
        cache[key] = openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0, timeout=30)
    return cache[key]


def ask(live: LiveServer, question: str, **extra: Any) -> Any:
    return client(live).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], extra_body=extra or None
    )


def stream(live: LiveServer, question: str, **extra: Any) -> list[Any]:
    chunks = client(live).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], stream=True,
        stream_options={"include_usage": True}, extra_body=extra or None,
    )
    return list(chunks)


def post(live: LiveServer, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30, **kwargs)


# -- answers ---------------------------------------------------------------------------------------------


def test_plain_answer_with_citations_consistent_with_trace(server: LiveServer) -> None:
    completion = ask(server, CAPITAL)
    assert completion.object == "chat.completion" and completion.model == MODEL
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == CAPITAL_ANSWER
    assert choice.finish_reason == "stop"
    extension = completion.model_extra["selfrag"]
    assert extension["retrieved"] is True and extension["abstained"] is False and extension["low_confidence"] is False
    assert extension["citations"] == [{"passage_id": PARIS.id, "title": PARIS.title, "text": PARIS.text,
                                       "relevance": rf.RELEVANT, "sentences": [CAPITAL_ANSWER]}]
    steps = {step["step"]: step for step in extension["trace"]}
    assert steps["decide"]["chosen"] == "retrieve" and steps["decide"]["probabilities"]["p_retrieve"] == \
        pytest.approx(0.9)
    assert steps["retrieve"]["chosen"] == ["p-paris", "p-lyon", "p-nice"]
    assert steps["rank"]["chosen"] == extension["citations"][0]["passage_id"]
    assert steps["support"]["chosen"] == "accept" and steps["support"]["verdict"] == "[Fully supported]"
    assert completion.usage.completion_tokens == extension["generated_tokens"] > 0
    assert completion.usage.prompt_tokens > 0


def test_stream_deltas_equal_the_plain_answer_and_carry_the_extension(server: LiveServer) -> None:
    plain = ask(server, CAPITAL)
    chunks = stream(server, CAPITAL)
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content == CAPITAL_ANSWER
    events = [c.model_extra["selfrag"] for c in chunks if c.model_extra.get("selfrag")]
    kinds = [event["type"] for event in events]
    # The runtime's event order: every decision, the citations, the accepted segment, then the final flags.
    assert kinds == ["trace"] * kinds.count("trace") + ["citation", "segment", "final"]
    expected = plain.model_extra["selfrag"]
    assert [event["step"] for event in events if event["type"] == "trace"] == expected["trace"]
    assert events[kinds.index("citation")]["citation"]["passage_id"] == PARIS.id
    assert events[kinds.index("segment")]["passage_id"] == PARIS.id
    final_chunk = next(c for c in chunks if c.model_extra.get("selfrag", {}).get("type") == "final")
    assert final_chunk.choices[0].finish_reason == "stop"
    final = {key: value for key, value in events[-1].items() if key != "type"}
    assert final == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_abstained_answer(server: LiveServer) -> None:
    completion = ask(server, MAYOR)
    extension = completion.model_extra["selfrag"]
    assert completion.choices[0].message.content == InferenceConfig().abstain_text
    assert extension["abstained"] is True and extension["low_confidence"] is False
    assert extension["citations"] == []
    support = [step for step in extension["trace"] if step["step"] == "support"][-1]  # the final verdict
    assert support["chosen"] == "abstain" and support["verdict"] == "[No support / Contradictory]"
    assert extension["reasons"] == [f"abstained: {support['reason']}"]
    chunks = stream(server, MAYOR)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == InferenceConfig().abstain_text
    assert chunks[-2].model_extra["selfrag"]["abstained"] is True


def test_flagged_answer_when_the_request_asks_to_flag(server: LiveServer) -> None:
    completion = ask(server, MAYOR, on_unsupported="flag")
    extension = completion.model_extra["selfrag"]
    assert completion.choices[0].message.content == MAYOR_ANSWER
    assert extension["low_confidence"] is True and extension["abstained"] is False
    support = [step for step in extension["trace"] if step["step"] == "support"][-1]  # the final verdict
    assert support["chosen"] == "flag" and extension["reasons"] == [f"flagged: {support['reason']}"]
    assert len(extension["citations"]) == 1 and extension["citations"][0]["sentences"] == [MAYOR_ANSWER]
    final = stream(server, MAYOR, on_unsupported="flag")[-2].model_extra["selfrag"]
    assert final["type"] == "final" and final["low_confidence"] is True


def test_answer_without_retrieval(server: LiveServer) -> None:
    extension = ask(server, ARITHMETIC).model_extra["selfrag"]
    assert extension["retrieved"] is False and extension["citations"] == []
    assert extension["trace"][0]["chosen"] == "no_retrieval"


def test_request_fields_map_to_runtime_settings(server: LiveServer, shared_engine: ScriptedBackendEngine) -> None:
    never = ask(server, CAPITAL, mode="never").model_extra["selfrag"]
    assert never["retrieved"] is False and never["trace"][0]["mode"] == "never"
    one = ask(server, CAPITAL, mode="always", top_k=1).model_extra["selfrag"]
    rank = next(step for step in one["trace"] if step["step"] == "rank")
    assert len(rank["candidates"]) == 1 and one["trace"][0]["mode"] == "always"
    high = ask(server, CAPITAL, threshold=0.95).model_extra["selfrag"]
    assert high["retrieved"] is False and high["trace"][0]["threshold"] == 0.95
    strict = ask(server, CAPITAL, mode="always", relevance_threshold=0.99).model_extra["selfrag"]
    assert next(step for step in strict["trace"] if step["step"] == "relevance")["relevance_threshold"] == 0.99
    alone = ask(server, CAPITAL, mode="always", relevance_threshold=1.0, on_all_irrelevant="no_retrieval")
    extension = alone.model_extra["selfrag"]
    assert [s["chosen"] for s in extension["trace"] if s["step"] == "support"] == ["answer_without_retrieval"]
    assert extension["low_confidence"] and extension["citations"] == [] and alone.choices[0].message.content
    ask(server, ARITHMETIC, max_tokens=3)
    assert shared_engine.calls[-1][0].max_tokens == 3
    # Fields this server does not use are ignored, as OpenAI-compatible servers do; sampling settings at the values
    # greedy decoding honours are answered (others are refused: test_server_requests.py).
    response = post(server, {"model": MODEL, "messages": [{"role": "user", "content": CAPITAL}],
                             "presence_penalty": 0, "temperature": 1, "top_p": 1, "user": "u1", "seed": 3,
                             "no_such_field": {"a": 1}})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == CAPITAL_ANSWER


def test_text_parts_and_history(server: LiveServer) -> None:
    response = post(server, {"model": MODEL, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": CAPITAL}]},
    ]})
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == CAPITAL_ANSWER


# -- bad requests ----------------------------------------------------------------------------------------


def _user(question: str = CAPITAL) -> list[dict[str, Any]]:
    return [{"role": "user", "content": question}]


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": MODEL, "messages": _user(), "mode": "sometimes"}, 400, "mode"),
    ({"model": MODEL, "messages": _user(), "top_k": 0}, 400, "top_k"),
    ({"model": MODEL, "messages": _user(), "top_k": 1000}, 400, "top_k"),
    ({"model": MODEL, "messages": _user(), "threshold": 1.5}, 400, "threshold"),
    ({"model": MODEL, "messages": _user(), "relevance_threshold": -0.5}, 400, "relevance_threshold"),
    ({"model": MODEL, "messages": _user(), "on_all_irrelevant": "answer"}, 400, "on_all_irrelevant"),
    ({"model": MODEL, "messages": _user(), "on_unsupported": "ignore"}, 400, "on_unsupported"),
    ({"model": MODEL, "messages": _user(), "max_tokens": 100000}, 400, "max_tokens"),
    ({"model": MODEL, "messages": _user(), "n": 2}, 400, "n"),
    ({"model": MODEL, "messages": []}, 400, "messages"),
    ({"model": MODEL, "messages": [{"role": "assistant", "content": "hi"}]}, 400, "messages.0.role"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ({"model": MODEL, "messages": _user("   ")}, 400, "messages.0.content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages.0.content.0"),
    ({"model": MODEL, "messages": _user() * 65}, 400, "messages"),
    ({"model": MODEL, "messages": _user("x" * 4001)}, 400, "messages.0.content"),
    ({"messages": _user()}, 400, "model"),
    ({"model": "gpt-4o", "messages": _user()}, 404, "model"),
    ([1, 2, 3], 400, "body"),
])
def test_bad_requests_get_openai_errors_naming_the_field(server: LiveServer, body: Any, status: int,
                                                          param: str | None) -> None:
    response = post(server, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    assert "Traceback" not in response.text


def test_malformed_json_and_oversized_bodies(server: LiveServer) -> None:
    response = httpx.post(f"{server.url}/v1/chat/completions", content=b'{"model": ', timeout=10,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()
    huge = {"model": MODEL, "messages": _user("x" * 70000)}
    response = post(server, huge)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    chunked = httpx.post(f"{server.url}/v1/chat/completions", content=iter([b"x" * 40000, b"y" * 40000]),
                         timeout=10, headers={"content-type": "application/json"})
    assert chunked.status_code == 413
    missing = httpx.get(f"{server.url}/v1/nothing", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    wrong_method = httpx.get(f"{server.url}/v1/chat/completions", timeout=10)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_openai_client_raises_on_errors(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(server, CAPITAL, top_k=0)
    assert caught.value.body["param"] == "top_k"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client(server).chat.completions.create(model="nope", messages=[{"role": "user", "content": "q"}])


# -- auth, queue, batching, timeouts, disconnects, shutdown ----------------------------------------------


def test_api_key_required_when_set(engine: ScriptedBackendEngine) -> None:
    with serving(engine, api_key="s3cret-key") as live:
        with pytest.raises(openai.AuthenticationError):
            client(live, key="wrong").chat.completions.create(model=MODEL, messages=_user())  # type: ignore[arg-type]
        response = httpx.post(f"{live.url}/v1/chat/completions", json={"model": MODEL, "messages": _user()})
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{live.url}/v1/models").status_code == 401
        good = client(live, key="s3cret-key").chat.completions.create(model=MODEL, messages=_user())  # type: ignore[arg-type]
        assert good.choices[0].message.content == CAPITAL_ANSWER
        assert httpx.get(f"{live.url}/health").status_code == 200  # probes need no key
        assert "s3cret-key" not in httpx.get(f"{live.url}/metrics").text
        schema = httpx.get(f"{live.url}/openapi.json").json()
        assert "HTTPBearer" in schema["components"]["securitySchemes"]
        assert schema["paths"]["/v1/chat/completions"]["post"]["security"] == [{"HTTPBearer": []}]


def _in_thread(function: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    results: list[Any] = []

    def target() -> None:
        try:
            results.append(function(*args))
        except Exception as error:  # noqa: BLE001 - handed to the test
            results.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, results


def test_429_when_the_queue_is_full(engine: ScriptedBackendEngine) -> None:
    with serving(engine, max_queue=1, max_batch=1, batch_wait_ms=0) as live:
        engine.gate.clear()
        first, first_result = _in_thread(ask, live, CAPITAL)
        assert engine.entered.wait(10)  # the first request is in the engine
        second, second_result = _in_thread(ask, live, ARITHMETIC)
        wait_until(lambda: live.state.worker.depth == 1)  # the second one waits in the queue
        with pytest.raises(openai.RateLimitError) as caught:
            ask(live, MAYOR)
        assert caught.value.status_code == 429
        engine.gate.set()
        first.join(10), second.join(10)
        assert first_result[0].choices[0].message.content == CAPITAL_ANSWER
        assert second_result[0].choices[0].message.content == ARITHMETIC_ANSWER
        assert 'selfrag_rejected_total{reason="queue_full"} 1.0' in httpx.get(f"{live.url}/metrics").text


def test_concurrent_requests_share_engine_calls(engine: ScriptedBackendEngine) -> None:
    with serving(engine, max_batch=8, batch_wait_ms=50) as live:
        engine.gate.clear()
        blocker, _ = _in_thread(ask, live, ARITHMETIC)
        assert engine.entered.wait(10)
        questions = [ARITHMETIC, "What is 3 + 3?", "What is 4 + 4?", "What is 5 + 5?"]
        threads = [_in_thread(ask, live, question) for question in questions]
        wait_until(lambda: live.state.worker.depth == 4)
        engine.gate.set()
        for thread, _ in threads:
            thread.join(10)
        blocker.join(10)
        assert all(result[0].choices[0].message.content == ARITHMETIC_ANSWER for _, result in threads)
        # One engine call for the blocker, then ONE call deciding all four queued questions together.
        assert engine.batch_sizes() == [1, 4]
        assert "selfrag_batch_size_count 2.0" in httpx.get(f"{live.url}/metrics").text


def test_timeout_gives_504(engine: ScriptedBackendEngine) -> None:
    with serving(engine, timeout_s=0.3) as live:
        engine.gate.clear()
        response = post(live, {"model": MODEL, "messages": _user()})
        assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
        streamed = post(live, {"model": MODEL, "messages": _user(), "stream": True})
        assert streamed.status_code == 200
        data = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert json.loads(data[-2])["error"]["code"] == "timeout" and data[-1] == "[DONE]"


def test_client_that_disconnects_mid_stream_frees_its_slot(engine: ScriptedBackendEngine) -> None:
    with serving(engine, max_queue=1, max_batch=1, batch_wait_ms=0) as live:
        engine.gate.clear()
        first, first_result = _in_thread(ask, live, CAPITAL)
        assert engine.entered.wait(10)
        with httpx.Client(timeout=10) as http, http.stream(
            "POST", f"{live.url}/v1/chat/completions",
            json={"model": MODEL, "messages": _user(MAYOR), "stream": True},
        ) as response:
            assert response.status_code == 200
            next(response.iter_lines())  # the role chunk: the stream is open and the job waits in the queue
        # The client is gone: its queue slot is free again before the engine ever saw its question.
        wait_until(lambda: live.state.worker.depth == 0)
        third, third_result = _in_thread(ask, live, ARITHMETIC)
        wait_until(lambda: live.state.worker.depth == 1)
        engine.gate.set()
        first.join(10), third.join(10)
        assert third_result[0].choices[0].message.content == ARITHMETIC_ANSWER
        decoded = [engine.tokenizer.decode(list(r.prompt_ids)) for batch in engine.calls for r in batch]
        assert not any(MAYOR in prompt for prompt in decoded)
        assert 'selfrag_rejected_total{reason="disconnected"} 1.0' in httpx.get(f"{live.url}/metrics").text


def test_graceful_shutdown_finishes_in_flight_requests(engine: ScriptedBackendEngine) -> None:
    live = start_server(engine)
    engine.gate.clear()
    thread, result = _in_thread(ask, live, CAPITAL)
    assert engine.entered.wait(10)
    live.server.should_exit = True  # what SIGTERM does
    threading.Timer(0.5, engine.gate.set).start()
    thread.join(15)
    live.thread.join(15)
    assert result[0].choices[0].message.content == CAPITAL_ANSWER
    assert not live.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{live.url}/health", timeout=2)
    live.socket.close()


# -- health, models, metrics, schema ---------------------------------------------------------------------


def test_health_is_ready_only_after_loading(engine: ScriptedBackendEngine) -> None:
    from server_harness import FixedRetriever, serve_config

    from selfrag.inference.server.app import create_app
    from selfrag.inference.server.backend import Backend

    loaded = threading.Event()

    def load() -> Backend:
        loaded.wait(10)
        return Backend(engine, FixedRetriever(), MODEL)

    live = LiveServer(create_app(serve_config(), load)).start()
    try:
        health = httpx.get(f"{live.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        busy = post(live, {"model": MODEL, "messages": _user()})
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "model_not_ready"
        loaded.set()
        wait_until(lambda: httpx.get(f"{live.url}/health").status_code == 200)
        assert httpx.get(f"{live.url}/health").json() == {"status": "ready", "model": MODEL, "queue_depth": 0,
                                                          "detail": None}
    finally:
        loaded.set()
        live.stop()


def test_failed_load_reports_failed(engine: ScriptedBackendEngine) -> None:
    from server_harness import serve_config

    from selfrag.inference.server.app import create_app

    failures: list[BaseException] = []

    def load() -> Any:
        raise ValueError("no selfrag.json in /models/x")

    live = LiveServer(create_app(serve_config(), load, on_load_failure=failures.append)).start()
    try:
        wait_until(lambda: httpx.get(f"{live.url}/health").json()["status"] == "failed")
        assert "no selfrag.json" in httpx.get(f"{live.url}/health").json()["detail"]
        assert isinstance(failures[0], ValueError)
    finally:
        live.stop()


def test_models_and_metrics(engine: ScriptedBackendEngine) -> None:
    with serving(engine) as server:
        _check_models_and_metrics(server)


def _check_models_and_metrics(server: LiveServer) -> None:
    assert [model.id for model in client(server).models.list()] == [MODEL]
    ask(server, CAPITAL)
    ask(server, MAYOR)
    ask(server, MAYOR, on_unsupported="flag")
    ask(server, ARITHMETIC)
    stream(server, CAPITAL)
    text = httpx.get(f"{server.url}/metrics").text
    for line in (
        'selfrag_requests_total{route="/v1/chat/completions",status="200"} 5.0',
        "selfrag_answers_total 5.0",
        "selfrag_retrievals_total 4.0",
        "selfrag_re_retrievals_total 0.0",
        "selfrag_abstained_total 1.0",
        "selfrag_low_confidence_total 1.0",
        "selfrag_queue_depth 0.0",
        'selfrag_request_seconds_count{route="/v1/chat/completions"} 5.0',
    ):
        assert line in text, line
    httpx.get(f"{server.url}/no/such/path/{'x' * 20}")
    assert 'route="unmatched",status="404"' in httpx.get(f"{server.url}/metrics").text


def test_openapi_schema_is_served(server: LiveServer) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(schema["paths"])
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert {"200", "400", "401", "404", "413", "429", "503", "504"} <= set(chat["responses"])
    components = schema["components"]["schemas"]
    request_fields = set(components["ChatCompletionRequest"]["properties"])
    assert {"model", "messages", "stream", "max_tokens", "mode", "top_k", "threshold", "relevance_threshold",
            "on_unsupported"} <= request_fields
    extension = set(components["SelfragExtension"]["properties"])
    assert {"citations", "retrieved", "abstained", "low_confidence", "reasons", "trace"} <= extension
    assert "securitySchemes" not in schema["components"]  # no key configured: the schema claims none


# -- the command ------------------------------------------------------------------------------------------


def test_serve_command_reports_user_mistakes_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    from selfrag.app.cli import main
    from selfrag.data_gen import DEMO_CORPUS

    assert main(["serve", f"model={tmp_path}", f"retriever.corpus={tmp_path / 'none.jsonl'}"]) == 2
    assert "corpus" in capsys.readouterr().err
    assert main(["serve", "model=no-such-model", f"retriever.corpus={DEMO_CORPUS}"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'no-such-model'" in err and "Traceback" not in err
    assert main(["serve", "model=m", f"retriever.corpus={DEMO_CORPUS}", "max_queue=0", "prot=1"]) == 2
    err = capsys.readouterr().err
    assert "max_queue must be at least 1" in err and "did you mean 'port'" in err


def test_calibration_fills_only_unset_settings_and_a_request_may_ask_for_the_built_in_values(
    server: LiveServer, shared_engine: ScriptedBackendEngine
) -> None:
    """The model's calibration (carried by the engine) applies where neither the request nor the server sets a
    value; an explicit threshold equal to the built-in 0.2 is kept (it was replaced by the calibrated one)."""
    shared_engine.calibration = {"threshold": 0.999, "relevance_threshold": 0.5, "support_bound": 0.0}
    try:
        calibrated = ask(server, CAPITAL).model_extra["selfrag"]
        assert calibrated["retrieved"] is False and calibrated["trace"][0]["threshold"] == 0.999
        explicit = ask(server, CAPITAL, threshold=0.2).model_extra["selfrag"]
        assert explicit["retrieved"] is True and explicit["trace"][0]["threshold"] == 0.2
        built_in = ask(server, CAPITAL, use_calibration=False).model_extra["selfrag"]
        assert built_in["retrieved"] is True and built_in["trace"][0]["threshold"] == 0.2
    finally:
        shared_engine.calibration = None
    response = post(server, {"model": MODEL, "messages": [{"role": "user", "content": CAPITAL}],
                             "use_calibration": "sometimes"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "use_calibration"


def test_the_folder_name_and_a_configured_served_name_are_both_served(engine: ScriptedBackendEngine) -> None:
    """The model directory's name is always served (the README's model="model" is the quickstart's folder), a
    configured served_model_name too; a 404 names every served id."""
    with serving(engine, served_model_name="smol") as live:  # the harness's backend is the folder MODEL
        listed = [card.id for card in client(live).models.list().data]
        assert listed == ["smol", MODEL]
        for name in ("smol", MODEL):
            reply = post(live, {"model": name, "messages": _user(CAPITAL)})
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == "smol"
        missing = post(live, {"model": "model", "messages": _user()})
        message = missing.json()["error"]["message"]
        assert missing.status_code == 404 and f"'smol' or '{MODEL}'" in message and "served_model_name" in message
