"""Schemathesis fuzzes the served OpenAPI schema over loopback: valid and invalid requests, zero 5xx.

Bounded for CI (SELFRAG_FUZZ_EXAMPLES per operation and mode, default 25; a few seconds on the scripted engine).
A longer run against any live server: ``st run http://127.0.0.1:8000/openapi.json --checks all``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import load_all_checks
from server_harness import MODEL, ScriptedBackendEngine, start_server

EXAMPLES = int(os.environ.get("SELFRAG_FUZZ_EXAMPLES", "25"))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzzed_requests_never_get_a_server_error(reflection_tokenizer, token_ids, mode: GenerationMode) -> None:  # type: ignore[no-untyped-def]
    load_all_checks()
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_schema_conformance,
        status_code_conformance,
    )

    engine = ScriptedBackendEngine(reflection_tokenizer, token_ids)
    live = start_server(engine, timeout_s=20)
    statuses: list[int] = []
    try:
        schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
        checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
        if mode == GenerationMode.NEGATIVE:
            checks.append(negative_data_rejection)
        for result in schema.get_all_operations():
            operation = result.ok()
            if mode == GenerationMode.NEGATIVE and operation.method.upper() == "GET":
                continue  # the GET routes take no input, so there is no invalid input to generate

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def call(case: Any) -> None:
                if mode == GenerationMode.POSITIVE and isinstance(case.body, dict) and len(statuses) % 2 == 0:
                    case.body["model"] = MODEL  # half the valid bodies name the served model and reach the engine
                response = case.call(timeout=30)
                statuses.append(response.status_code)
                case.validate_response(response, checks=checks)

            call()
    finally:
        live.stop()
    assert statuses and all(status < 500 for status in statuses)
    if mode == GenerationMode.POSITIVE:
        assert 200 in statuses  # some fuzzed requests were answered, not only rejected
