"""Defects found by trying the server as a new user would (issue 28), each answered with one clear 4xx now.

Scripted engine over the real loopback socket (see server_harness.py); each test failed on the server before.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import httpx
import pytest
from server_harness import (
    ARITHMETIC,
    CAPITAL,
    MODEL,
    PARIS,
    LiveServer,
    ScriptedBackendEngine,
    serving,
    wait_until,
)

from selfrag.prompting import encode_prompt, passage_ids


def _post(live: LiveServer, content: bytes | dict[str, Any], **headers: str) -> httpx.Response:
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    return httpx.post(f"{live.url}/v1/chat/completions", content=data, timeout=30,
                      headers={"content-type": "application/json", **headers})


def _body(question: str = CAPITAL, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], **extra}


def _metric(live: LiveServer, name: str) -> float:
    text = httpx.get(f"{live.url}/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


# -- a lone surrogate ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("messages", "param"), [
    ('[{"role": "user", "content": "What is \\ud800 the capital?"}]', "messages.0.content"),
    ('[{"role": "system", "content": "x\\udc00"}, {"role": "user", "content": "Hi?"}]', "messages.0.content"),
    ('[{"role": "user", "content": [{"type": "text", "text": "Why \\udfff?"}]}]', "messages.0.content.0.text"),
])
def test_a_lone_surrogate_is_400_naming_the_field(live: LiveServer, engine: ScriptedBackendEngine, stream: bool,
                                                   messages: str, param: str) -> None:
    raw = f'{{"model": "{MODEL}", "stream": {json.dumps(stream)}, "messages": {messages}}}'.encode()
    response = _post(live, raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_unicode"
    assert "lone UTF-16 surrogate" in error["message"] and "Traceback" not in response.text
    assert engine.calls == []
    # a proper pair (an emoji written as two escapes) is valid Unicode and answered
    assert _post(live, b'{"model": "%s", "messages": [{"role": "user", "content": "Hi \\ud83d\\ude00?"}]}'
                 % MODEL.encode()).status_code == 200


# -- invalid JSON: the key first, then where the body breaks ---------------------------------------------------


def test_invalid_json_is_401_without_the_key_and_400_pointing_at_the_byte_with_it(engine: ScriptedBackendEngine
                                                                                  ) -> None:
    with serving(engine, api_key="k3y") as live:
        broken = '{"model": "é", "messages": [}'.encode()
        for headers in ({}, {"authorization": "Bearer wrong"}):
            response = _post(live, broken, **headers)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        # also a body that parses but is invalid: no key, nothing about the body
        assert _post(live, {"messages": []}).status_code == 401
        response = _post(live, broken, authorization="Bearer k3y")
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "body" and error["code"] == "invalid_json"
        # "é" is two bytes: the character index (28) and the byte offset (29) differ
        assert broken.index(b"}") == 29
        assert "at byte 29 (line 1, column 29)" in error["message"], error["message"]


def test_invalid_json_on_a_later_line_names_the_line(live: LiveServer) -> None:
    error = _post(live, b'{\n  "model": "m",\n  "messages": nope\n}').json()["error"]
    assert error["param"] == "body" and "(line 3, column 15)" in error["message"], error["message"]


# -- parameters that cannot be honoured are refused by name ---------------------------------------------------


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}}, "response_format"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 3}, "logprobs"),
    ({"n": 2}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": "\n"}, "stop"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_parameters_the_answer_could_not_keep_are_400(live: LiveServer, engine: ScriptedBackendEngine,
                                                      extra: dict[str, Any], param: str, stream: bool) -> None:
    response = _post(live, _body(stream=stream, **extra))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert engine.calls == []


@pytest.mark.parametrize("extra", [
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
    {"tools": [{"type": "function", "function": {"name": "f"}}]},
    {"response_format": {"type": "text"}}, {"logprobs": False}, {"stop": []}, {"stop": None}, {"n": 1},
])
def test_their_harmless_values_are_still_answered(live: LiveServer, extra: dict[str, Any]) -> None:
    assert _post(live, _body(**extra)).status_code == 200


# -- 429, metrics labels, queue wait --------------------------------------------------------------------------


def test_429_says_when_to_retry(engine: ScriptedBackendEngine) -> None:
    with serving(engine, max_queue=1, max_batch=1, batch_wait_ms=0) as live:
        engine.gate.clear()
        threads = [threading.Thread(target=_post, args=(live, _body(question)), daemon=True)
                   for question in (CAPITAL, ARITHMETIC)]
        threads[0].start()
        assert engine.entered.wait(10)
        threads[1].start()
        wait_until(lambda: live.state.worker.depth == 1)
        response = _post(live, _body())
        assert response.status_code == 429
        assert 1 <= int(response.headers["retry-after"]) <= 60
        engine.gate.set()
        for thread in threads:
            thread.join(10)


def test_413_and_the_schema_are_counted_under_their_routes(live: LiveServer) -> None:
    assert _post(live, _body("x" * 70000)).status_code == 413
    assert httpx.get(f"{live.url}/openapi.json").status_code == 200
    assert httpx.get(f"{live.url}/no/such/path").status_code == 404
    text = httpx.get(f"{live.url}/metrics").text
    assert 'selfrag_requests_total{route="/v1/chat/completions",status="413"} 1.0' in text
    assert 'selfrag_requests_total{route="/openapi.json",status="200"} 1.0' in text
    assert 'selfrag_requests_total{route="unmatched",status="404"} 1.0' in text


def test_queue_wait_is_the_wait_not_the_whole_request(live: LiveServer, engine: ScriptedBackendEngine) -> None:
    engine.delay_s = 0.5  # every engine call takes 0.5 s; the request never waits behind another one
    assert _post(live, _body()).status_code == 200
    assert _metric(live, "selfrag_queue_wait_seconds_count") == 1
    assert _metric(live, "selfrag_queue_wait_seconds_sum") < 0.3  # the batch window (5 ms) and scheduling only
    assert _metric(live, 'selfrag_request_seconds_sum{route="/v1/chat/completions"}') > 1.0  # two engine calls


# -- the context check counts the passages --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_question_that_fits_but_not_with_its_passages_is_refused_up_front(
    reflection_tokenizer, token_ids, stream: bool  # type: ignore[no-untyped-def]
) -> None:
    engine = ScriptedBackendEngine(reflection_tokenizer, token_ids)
    question = CAPITAL + " Please" * 20
    prompt = len(encode_prompt(reflection_tokenizer, question, engine.prompt_template))
    passage = len(passage_ids(reflection_tokenizer, token_ids, PARIS))  # the three passages: Paris is the longest
    engine.max_context = prompt + 16 + passage - 1  # type: ignore[attr-defined]  # one token short
    with serving(engine) as live:
        response = _post(live, _body(question, max_tokens=16, stream=stream))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
        assert error["message"] == (
            f"the last user message is {prompt} tokens as a prompt, its longest retrieved passage needs {passage} more "
            f"and max_tokens=16: {prompt + passage + 16} exceeds the model's context of {prompt + passage + 15} "
            f"tokens; shorten the question (at most {prompt - 1} prompt tokens), lower max_tokens, or send mode=never"
        )
        assert engine.calls == []  # refused before any decode
        assert _post(live, _body(question, max_tokens=15)).status_code == 200  # one token less fits
        assert _post(live, _body(question, max_tokens=16, mode="never")).status_code == 200  # no passage


# -- bodies that are not one JSON object, non-finite numbers, a text part without text (issue 44) -------------


JSON = "application/json"


@pytest.mark.parametrize(("content", "content_type", "words"), [
    (b"", JSON, "the request body is empty"),
    (b'{"model": "m\xff", "messages": []}', JSON, "byte 0xff at byte 12 (line 1, column 13) is not UTF-8"),
    (b"[" * 20000 + b"]" * 20000, JSON, "more than 100 levels deep (at line 1, column 101)"),
    (json.dumps(_body()).encode(), "text/plain", "must be JSON, got Content-Type 'text/plain'"),
    (b"[1, 2]", JSON, "must be one JSON object {...}, got an array"),
])
def test_a_body_that_is_not_one_json_object_is_400_invalid_json(live: LiveServer, engine: ScriptedBackendEngine,
                                                                 content: bytes, content_type: str, words: str) -> None:
    response = httpx.post(f"{live.url}/v1/chat/completions", content=content, timeout=30,
                          headers={"content-type": content_type})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and error["param"] == "body", error
    assert words in error["message"] and "Content-Type: application/json" in error["message"], error["message"]
    assert engine.calls == []


def test_a_body_fastapi_cannot_parse_is_401_without_the_key(engine: ScriptedBackendEngine) -> None:
    with serving(engine, api_key="k3y") as live:
        for content in (b"\xff\xfe{", b"[" * 20000):
            response = _post(live, content)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        assert _post(live, b"\xff", authorization="Bearer k3y").json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize(("field", "value"), [("threshold", "NaN"), ("support_bound", "Infinity"),
                                              ("temperature", "-Infinity")])
def test_a_non_finite_number_is_named_as_such(live: LiveServer, field: str, value: str) -> None:
    raw = json.dumps(_body())[:-1] + f', "{field}": {value}}}'
    error = _post(live, raw.encode()).json()["error"]
    assert error["param"] == field
    assert error["message"] == f"{field}: {value} is not a finite number; send a JSON number", error["message"]


def test_a_text_part_without_text_says_the_text_field_is_missing(live: LiveServer) -> None:
    response = _post(live, {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages.0.content.0.text"
    assert "the 'text' field is missing" in error["message"] and "got type" not in error["message"]
