"""Request fields a new user got wrong (issue 56), each answered with one 400 naming the field and a code.

Scripted engine over the real loopback socket (see server_harness.py); each test failed on the server before:
a 5,000-digit integer was a 500 with two tracebacks, ``max_tokens: "5"`` and ``stream: "yes"`` were accepted,
``top_p: 2`` and ``presence_penalty: 9`` silently ignored, 101-150 levels of nesting accepted, ``param`` named
pydantic's paths (``messages.0.content.str``) with ``code: null``, a 413 had ``param: null`` and a lone surrogate
in ``mode`` was not ``invalid_unicode``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_harness import CAPITAL, CAPITAL_ANSWER, MODEL, LiveServer, ScriptedBackendEngine, start_server


@pytest.fixture(scope="module")
def served(reflection_tokenizer: Any, token_ids: Any) -> Iterator[tuple[LiveServer, ScriptedBackendEngine]]:
    """One server for the module (every test here is refused before the engine, or asks one question)."""
    engine = ScriptedBackendEngine(reflection_tokenizer, token_ids)
    server = start_server(engine, max_request_bytes=200_000)
    yield server, engine
    server.stop()


@pytest.fixture
def live(served: tuple[LiveServer, ScriptedBackendEngine]) -> LiveServer:
    return served[0]


@pytest.fixture
def engine(served: tuple[LiveServer, ScriptedBackendEngine]) -> ScriptedBackendEngine:
    return served[1]


def _refused(live: LiveServer, engine: ScriptedBackendEngine, body: bytes) -> dict[str, Any]:
    """The error a request gets, checking it never reached the engine."""
    calls = len(engine.calls)
    error = _error(_post(live, body))
    assert len(engine.calls) == calls, "the engine was called for a refused request"
    return error


def _post(live: LiveServer, content: bytes | dict[str, Any]) -> httpx.Response:
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    return httpx.post(f"{live.url}/v1/chat/completions", content=data, timeout=30,
                      headers={"content-type": "application/json"})


def _raw(**extra: str) -> bytes:
    """A valid body with ``extra`` fields written as raw JSON text (numbers too long for json.dumps, say)."""
    fields = "".join(f', "{name}": {text}' for name, text in extra.items())
    return f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "{CAPITAL}"}}]{fields}}}'.encode()


def _error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] is not None and error["param"] is not None, error
    return error


# -- a 5,000-digit integer ------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["max_tokens", "top_k", "no_such_field"])
def test_a_5000_digit_integer_is_400_naming_the_field(live: LiveServer, engine: ScriptedBackendEngine,
                                                      field: str, caplog: pytest.LogCaptureFixture) -> None:
    error = _refused(live, engine, _raw(**{field: "9" * 5000}))
    assert error["param"] == field and error["code"] == "integer_above_max_value"
    assert "5,000 digits" in error["message"] and field in error["message"]
    assert len(error["message"]) < 400  # the number is not echoed
    assert "Traceback" not in caplog.text and "unexpected error" not in caplog.text


def test_a_long_integer_nested_in_a_message_names_its_path(live: LiveServer) -> None:
    body = (f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "x"}}, '
            f'{{"role": "user", "content": {"1" * 5000}}}]}}').encode()
    error = _error(_post(live, body))
    assert error["param"] == "messages.1.content"


# -- wrong types ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "text", "expected"), [
    ("max_tokens", '"5"', "an integer"),
    ("max_tokens", "true", "an integer"),
    ("max_tokens", "5.5", "an integer"),
    ("max_completion_tokens", '"5"', "an integer"),
    ("top_k", "false", "an integer"),
    ("stream", '"yes"', "a boolean"),
    ("stream", "1", "a boolean"),
    ("use_calibration", '"yes"', "a boolean"),
    ("logprobs", '"no"', "a boolean"),
    ("seed", '"x"', "an integer"),
    ("threshold", '"0.5"', "a number"),
    ("threshold", "true", "a number"),
    ("temperature", '"0"', "a number"),
])
def test_a_wrong_type_is_400_naming_the_field_and_the_type_expected(live: LiveServer, engine: ScriptedBackendEngine,
                                                                     field: str, text: str, expected: str) -> None:
    error = _refused(live, engine, _raw(**{field: text}))
    assert error["param"] == field and error["code"] == "invalid_type"
    assert error["message"].startswith(f"{field}: expected {expected}"), error["message"]
    assert f"got {text}" in error["message"] or "got the string" in error["message"], error["message"]


def test_the_right_types_are_still_answered(live: LiveServer) -> None:
    response = _post(live, _raw(max_tokens="64", stream="false", use_calibration="true", seed="7", support_bound="0",
                                temperature="0", top_p="1", presence_penalty="0", frequency_penalty="0.0"))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == CAPITAL_ANSWER


# -- sampling parameters: out of OpenAI's range, or not honoured ----------------------------------------------


@pytest.mark.parametrize(("field", "text", "code"), [
    ("top_p", "2", "decimal_above_max_value"),
    ("top_p", "-0.1", "decimal_below_min_value"),
    ("presence_penalty", "9", "decimal_above_max_value"),
    ("frequency_penalty", "-3", "decimal_below_min_value"),
    ("temperature", "2.5", "decimal_above_max_value"),
    ("max_tokens", "0", "integer_below_min_value"),
    ("top_k", "0", "integer_below_min_value"),
])
def test_a_value_out_of_range_is_400_with_its_bound(live: LiveServer, field: str, text: str, code: str) -> None:
    error = _error(_post(live, _raw(**{field: text})))
    assert error["param"] == field and error["code"] == code
    assert f"got {text}" in error["message"], error["message"]


@pytest.mark.parametrize(("field", "text"), [
    ("top_p", "0.9"), ("presence_penalty", "0.5"), ("frequency_penalty", "-1"), ("temperature", "0.7"),
    ("logit_bias", '{"50256": -100}'),
])
def test_a_sampling_value_the_server_does_not_honour_is_400_not_supported(
    live: LiveServer, engine: ScriptedBackendEngine, field: str, text: str
) -> None:
    error = _refused(live, engine, _raw(**{field: text}))
    assert error["param"] == field and error["code"] == "unsupported_value"
    assert "not supported" in error["message"] and "greedily" in error["message"], error["message"]


# -- nesting ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [101, 120, 150, 151, 400])
def test_nesting_deeper_than_100_levels_is_refused(live: LiveServer, depth: int) -> None:
    # the body object is level 1: the extra field holds depth - 1 more levels
    error = _error(_post(live, _raw(extra="[" * (depth - 1) + "]" * (depth - 1))))
    assert error["param"] == "body" and error["code"] == "invalid_json"
    assert "more than 100 levels" in error["message"]


def test_nesting_of_exactly_100_levels_is_answered(live: LiveServer) -> None:
    assert _post(live, _raw(extra="[" * 99 + "]" * 99)).status_code == 200


# -- param paths, codes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("messages", "param", "expected"), [
    ('[{"role": "user", "content": 5}]', "messages.0.content", "expected a string or an array of text parts"),
    ('[{"role": "user", "content": [{"type": "text", "text": 5}]}]', "messages.0.content.0.text",
     "expected a string"),
    ('[{"role": "user", "content": [5]}]', "messages.0.content.0", "expected an object"),
    ('[{"role": "robot", "content": "x"}]', "messages.0.role", "expected one of"),
    ('[{"content": "x"}]', "messages.0.role", "missing"),
    ('[]', "messages", "at least 1"),
    ('"hello"', "messages", "expected an array"),
])
def test_param_is_the_users_path_and_code_is_set(live: LiveServer, messages: str, param: str, expected: str) -> None:
    error = _error(_post(live, f'{{"model": "{MODEL}", "messages": {messages}}}'.encode()))
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}: ") and expected in error["message"], error["message"]
    assert ".str" not in error["message"] and "list[" not in error["message"]


def test_a_missing_field_is_named_with_its_code(live: LiveServer) -> None:
    error = _error(_post(live, {"messages": [{"role": "user", "content": "x"}]}))
    assert error["param"] == "model" and error["code"] == "missing_required_parameter"


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"mode": "sometimes"}, "mode", "invalid_value"),
    ({"max_tokens": 10**9}, "max_tokens", "integer_above_max_value"),
    ({"top_k": 10**6}, "top_k", "integer_above_max_value"),
    ({"n": 2}, "n", "integer_above_max_value"),
    ({"stop": "\n"}, "stop", "unsupported_parameter"),
    ({"logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "messages.1.role",
     "invalid_value"),
    ({"messages": [{"role": "user", "content": " "}]}, "messages.0.content", "invalid_value"),
])
def test_every_field_level_400_has_a_code(live: LiveServer, extra: dict[str, Any], param: str, code: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": CAPITAL}], **extra}
    error = _error(_post(live, body))
    assert error["param"] == param and error["code"] == code, error


def test_413_names_the_body(live: LiveServer) -> None:
    error = _error(_post(live, _raw(padding=json.dumps("x" * 300_000))), status=413)
    assert error["param"] == "body" and error["code"] == "request_too_large"


@pytest.mark.parametrize("field", ["mode", "on_unsupported", "model"])
def test_a_lone_surrogate_in_any_field_is_invalid_unicode(live: LiveServer, engine: ScriptedBackendEngine,
                                                           field: str) -> None:
    error = _refused(live, engine, _raw(**{field: '"always\\ud800"'}) if field != "model" else
                     b'{"model": "m\\udc00", "messages": [{"role": "user", "content": "x"}]}')
    assert error["param"] == field and error["code"] == "invalid_unicode", error
    assert "lone UTF-16 surrogate" in error["message"]


def test_an_unknown_path_and_a_wrong_method_carry_a_code(live: LiveServer) -> None:
    assert httpx.get(f"{live.url}/v1/nothing").json()["error"]["code"] == "not_found"
    assert httpx.get(f"{live.url}/v1/chat/completions").json()["error"]["code"] == "method_not_allowed"
