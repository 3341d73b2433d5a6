"""The HTTP teacher's retries (Retry-After, back-off, permanent errors), batching of local engines, the cache."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from teacher_server import TeacherServer

from selfrag import models
from selfrag.config import from_dict, load_config
from selfrag.data_gen.cache import CachedReply, CallCache, call_key
from selfrag.data_gen.config import GenerateConfig, TeacherConfig
from selfrag.data_gen.labelers import LabelItem, LLMLabeler, parse_label, prompt_hash
from selfrag.data_gen.teachers import (
    BatchingTeacher,
    CachedTeacher,
    ChatReply,
    ChatRequest,
    HTTPTeacher,
    TeacherError,
    vllm_teacher,
)
from selfrag.inference.engines import options as options_module
from selfrag.retries import retry_after
from selfrag.trajectory import Passage

REQUEST = ChatRequest((("user", "hello"),), max_tokens=8)


def teacher_config(url: str, **options: object) -> TeacherConfig:
    """A teacher at ``url`` with ``options`` laid over these engine options (teacher.engine_options.*)."""
    engine_options = {"base_url": url, "backoff": 0.5, "timeout": 0.3, **options}
    return from_dict(TeacherConfig, {"model": "m", "engine_options": engine_options})


class Script:
    """Replies by call number: a list of (status, body, headers) and then plain success."""

    def __init__(self, server: TeacherServer, plan: list[tuple[int, object, dict[str, str]]]) -> None:
        self.plan = plan
        self.calls = 0
        server.handle = self.handle  # type: ignore[method-assign]
        self.server = server

    def handle(self, handler, body) -> None:  # type: ignore[no-untyped-def]
        index, self.calls = self.calls, self.calls + 1
        if index < len(self.plan):
            status, data, headers = self.plan[index]
            if status == -1:
                time.sleep(0.5)
                status = 503
        else:
            status, headers = 200, {}
            data = {"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        self.server._send_raw(handler, status, raw, str(status), headers)


def run_chat(config: TeacherConfig, sleeps: list[float]) -> ChatReply:
    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def go() -> ChatReply:
        teacher = HTTPTeacher(config, sleep=fake_sleep)
        try:
            return await teacher.chat(REQUEST)
        finally:
            await teacher.aclose()

    return asyncio.run(go())


def test_retry_after_is_honoured_and_backoff_is_bounded() -> None:
    sleeps: list[float] = []
    with TeacherServer() as server:
        script = Script(server, [(429, {}, {"Retry-After": "7"}), (500, {}, {}), (503, {}, {}), (200, b"{oops", {})])
        reply = run_chat(teacher_config(server.url, max_retries=5), sleeps)
    assert reply.text == "ok" and (reply.prompt_tokens, reply.completion_tokens) == (3, 1)
    assert script.calls == 5
    assert sleeps[0] == 7.0  # Retry-After, not the back-off
    assert 0 <= sleeps[1] <= 1.0 and 0 <= sleeps[2] <= 2.0 and 0 <= sleeps[3] <= 4.0  # full jitter, doubling


def test_retries_run_out_and_permanent_errors_stop_at_once() -> None:
    with TeacherServer() as server:
        Script(server, [(500, {}, {})] * 10)
        with pytest.raises(TeacherError, match="failed after 3 attempts: HTTP 500") as error:
            run_chat(teacher_config(server.url, max_retries=2), [])
        assert error.value.retryable
    with TeacherServer() as server:
        script = Script(server, [(401, {"error": "bad key"}, {})])
        with pytest.raises(TeacherError, match="HTTP 401") as error:
            run_chat(teacher_config(server.url), [])
        assert not error.value.retryable and script.calls == 1


def test_timeouts_are_retried() -> None:
    sleeps: list[float] = []
    with TeacherServer() as server:
        script = Script(server, [(-1, {}, {})])  # status -1: answer only after the client's timeout
        reply = run_chat(teacher_config(server.url, max_retries=3, timeout=0.2), sleeps)
    assert reply.text == "ok" and script.calls == 2 and len(sleeps) == 1


def engine_config(*overrides: str) -> TeacherConfig:
    """The teacher section as ``selfrag generate`` reads it from ``overrides`` (teacher.engine, .engine_options)."""
    required = ["labeler=llm", "teacher.model=m", "passages=p.jsonl", "output=runs/data"]
    return load_config(GenerateConfig, None, [*required, *overrides]).teacher


def test_the_http_teacher_is_built_from_its_engine_options() -> None:
    """teacher.engine_options.* (the runtime's engine options) reach the HTTP teacher as its old keys did."""
    config = engine_config("teacher.engine_options.base_url=http://127.0.0.1:9/v1/",
                           "teacher.engine_options.concurrency=3", "teacher.engine_options.timeout=7",
                           "teacher.engine_options.api_key_env=")
    teacher = HTTPTeacher(config)
    try:
        assert teacher._url == "http://127.0.0.1:9/v1/chat/completions"
        assert teacher._semaphore._value == 3 and teacher._client.timeout.read == 7.0
        assert teacher._headers() == {"Content-Type": "application/json"}  # an empty api_key_env sends no key
    finally:
        asyncio.run(teacher.aclose())
    defaults = engine_config().engine_options  # the teacher's own defaults, as before they were engine options
    assert (defaults.concurrency, defaults.timeout, defaults.max_retries, defaults.backoff) == (16, 60.0, 5, 1.0)
    assert (defaults.api_key_env, defaults.batch_size, defaults.seed) == ("", 16, 0)


def test_the_vllm_teacher_gets_the_runtimes_vllm_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """engine_options.tensor_parallel_size, max_model_len, dtype, seed ... reach vllm.LLM as the runtime's vLLM
    engine passes them (one llm_arguments), vllm_args over them; batch_size sizes the batches."""
    built: list[dict[str, object]] = []

    class LLM:
        def __init__(self, **arguments: object) -> None:
            built.append(arguments)

        def chat(self, messages: list[object], **_: object) -> list[object]:
            output = SimpleNamespace(text="ok", token_ids=[1])
            return [SimpleNamespace(outputs=[output], prompt_token_ids=[1, 2]) for _ in messages]

    stub = SimpleNamespace(LLM=LLM, SamplingParams=lambda **kw: kw, __version__="stub")
    monkeypatch.setattr(options_module, "import_vllm", lambda setting: stub)
    monkeypatch.setitem(sys.modules, "vllm", None)  # vllm.platforms cannot be imported: a GPU build
    monkeypatch.setattr(models, "resolve_model", lambda name: "/models/teacher")
    config = engine_config("teacher.engine=vllm", "teacher.engine_options.tensor_parallel_size=2",
                           "teacher.engine_options.max_model_len=4096", "teacher.engine_options.dtype=bfloat16",
                           "teacher.engine_options.seed=7", "teacher.engine_options.batch_size=4",
                           "teacher.engine_options.vllm_args={kv_cache_dtype: fp8, max_model_len: 2048}")
    teacher = vllm_teacher(config)
    assert teacher.batch_size == 4 and not built  # vLLM starts at the first call
    assert [reply.text for reply in teacher.generate_batch([REQUEST, REQUEST])] == ["ok", "ok"]
    [arguments] = built
    assert arguments["model"] == arguments["tokenizer"] == "/models/teacher"
    assert (arguments["tensor_parallel_size"], arguments["dtype"], arguments["seed"]) == (2, "bfloat16", 7)
    assert (arguments["kv_cache_dtype"], arguments["max_model_len"]) == ("fp8", 2048)  # vllm_args win


def test_batching_teacher_gathers_concurrent_calls() -> None:
    sizes: list[int] = []

    def generate_batch(requests: Sequence[ChatRequest]) -> list[ChatReply]:
        sizes.append(len(requests))
        return [ChatReply(request.messages[-1][1].upper()) for request in requests]

    async def go() -> list[ChatReply]:
        teacher = BatchingTeacher("local", generate_batch, batch_size=4)
        replies = await asyncio.gather(*(teacher.chat(ChatRequest((("user", f"q{i}"),))) for i in range(10)))
        await teacher.aclose()
        return list(replies)

    replies = asyncio.run(go())
    assert [reply.text for reply in replies] == [f"Q{i}" for i in range(10)]
    assert sizes == [4, 4, 2]


def test_cache_survives_reopen_and_keys_ignore_nothing_that_matters(tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "c.sqlite")
    key = call_key("m", [{"role": "user", "content": "x"}], {"temperature": 0.0})
    cache.put(key, "m", CachedReply("y", 1, 2))
    cache.close()
    again = CallCache(tmp_path / "c.sqlite")
    assert again.get(key) == CachedReply("y", 1, 2) and len(again) == 1
    assert call_key("m2", [{"role": "user", "content": "x"}], {"temperature": 0.0}) != key
    assert call_key("m", [{"role": "user", "content": "x"}], {"temperature": 0.5}) != key


def test_labeler_reasks_then_drops_with_reason(tmp_path: Path) -> None:
    replies = iter(["not json", '{"label": "[Relevant]"}', '```json\n{"label": "[Maybe]"}\n```'] * 3)

    class Fake:
        model = "fake"

        async def chat(self, request: ChatRequest) -> ChatReply:
            return ChatReply(next(replies), 2, 1)

        async def aclose(self) -> None:
            pass

    cached = CachedTeacher(Fake(), CallCache(tmp_path / "c.sqlite"))
    labeler = LLMLabeler(cached, retries=1)
    item = LabelItem("relevance", "Q?", Passage("p", "T", "text"))
    first = asyncio.run(labeler.label(item))
    assert first.label is not None and first.label.value == "[Relevant]" and first.calls == 2
    assert first.label.prompt_hash == prompt_hash("relevance") and first.label.model == "fake"
    second = asyncio.run(LLMLabeler(cached, retries=0).label(LabelItem("support", "Q?", Passage("p", "T", "x"), "o")))
    assert second.label is None and second.drop == "support: label outside the vocabulary (1 try)"


def test_parse_label_strictness() -> None:
    assert parse_label('{"explanation": "e", "label": "[Utility:4]"}', "utility") == ("[Utility:4]", None)
    assert parse_label('```json\n{"label": " [Irrelevant] "}\n```', "relevance") == ("[Irrelevant]", None)
    assert parse_label('{"label": "[Continue to Use Evidence]"}', "retrieve") == (None, "label outside the vocabulary")
    assert parse_label('{"label": 5}', "utility") == (None, "reply has no string 'label'")
    assert parse_label("I think it is relevant.", "relevance") == (None, "reply is not JSON")
    # exactly one label of the vocabulary, without JSON, is that label
    assert parse_label("[Relevant]", "relevance") == ("[Relevant]", None)
    assert parse_label(" `Irrelevant`.\n", "relevance") == ("[Irrelevant]", None)
    assert parse_label("**[Utility:4]**", "utility") == ("[Utility:4]", None)
    assert parse_label("[Relevant] [Irrelevant]", "relevance") == (None, "reply is not JSON")
    # a label of another kind is said to be one, not "not JSON" (issue 56)
    wrong = "wrong label kind: expected a support label, got [Relevant], a relevance label"
    assert parse_label("[Relevant]", "support") == (None, wrong)
    assert parse_label('{"explanation": "e", "label": "[Relevant]"}', "support") == (None, wrong)
    assert parse_label("Utility:5", "relevance") == (
        None, "wrong label kind: expected a relevance label, got [Utility:5], a utility label")


def test_retry_after_header_forms() -> None:
    assert (
        retry_after("3") == 3.0 and retry_after(None) is None and retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    )
