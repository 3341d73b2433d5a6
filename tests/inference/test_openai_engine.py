"""OpenAIEngine against a scripted loopback server backed by the real HF engine: same results, faults survived."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from openai_scripted_server import ScriptedServer  # noqa: E402

from selfrag.inference.engines import GenerationRequest  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.inference.engines.openai import OpenAIEngine, RemoteEngineError  # noqa: E402
from selfrag.prompting import encode_prompt  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(merged_model_dir) -> Path:  # type: ignore[no-untyped-def]
    return merged_model_dir(5)


@pytest.fixture(scope="module")
def offline(model_dir) -> HFEngine:  # type: ignore[no-untyped-def]
    return HFEngine(model_dir)


def _requests(engine: HFEngine) -> list[GenerationRequest]:
    questions = ["What is the capital of France?", "Who wrote it?", "Name a river.", "When?"]
    score_ids = engine.token_ids.all_ids
    stop = engine.token_ids.ids(engine.token_ids.group_of_id(score_ids[0]))  # type: ignore[arg-type]
    return [
        GenerationRequest(tuple(encode_prompt(engine.tokenizer, q)), max_tokens=6, score_token_ids=score_ids,
                          stop_token_ids=stop if i % 2 else ())
        for i, q in enumerate(questions)
    ]


def _same(remote, local) -> None:  # type: ignore[no-untyped-def]
    for mine, theirs in zip(remote, local, strict=True):
        assert mine.token_ids == theirs.token_ids
        assert mine.finish_reason == theirs.finish_reason
        assert mine.text == theirs.text
        for a, b in zip(mine.score_logprobs, theirs.score_logprobs, strict=True):
            assert set(a) == set(b) and a == pytest.approx(b, abs=1e-4)  # batch shape changes float sums


def test_same_results_as_offline(model_dir, offline) -> None:  # type: ignore[no-untyped-def]
    requests = _requests(offline)
    with ScriptedServer(offline) as server:
        remote = OpenAIEngine(model_dir, base_url=server.url, concurrency=3)
        generations = remote.generate(requests)
        assert remote.served_model == "scripted-model"
        assert all(body["logprob_token_ids"] == list(offline.token_ids.all_ids) for body in server.bodies)
        assert all(body["skip_special_tokens"] is False and body["prompt"] for body in server.bodies)
    _same(generations, offline.generate(requests))
    assert all(g.score_bounds == () for g in generations)


def test_constraints_reach_the_server(model_dir, offline) -> None:  # type: ignore[no-untyped-def]
    """banned ids go as a -100 logit bias (OpenAI's ban), min_tokens as vLLM's parameter: same ids as offline."""
    [free] = offline.generate(_requests(offline)[:1])
    request = replace(_requests(offline)[0], banned_token_ids=(free.token_ids[0],), min_tokens=2)
    with ScriptedServer(offline) as server:
        [remote] = OpenAIEngine(model_dir, base_url=server.url).generate([request])
        body = server.bodies[-1]
    assert body["logit_bias"] == {str(free.token_ids[0]): -100.0} and body["min_tokens"] == 2
    _same([remote], offline.generate([request]))
    assert remote.token_ids[0] != free.token_ids[0]


@pytest.mark.parametrize("faults", [["429", "500"], ["malformed", "nochoices"], ["sleep"], ["500", "429", "malformed"]])
def test_faults_are_retried(model_dir, offline, faults) -> None:  # type: ignore[no-untyped-def]
    requests = _requests(offline)[:2]
    with ScriptedServer(offline, sleep=12.0) as server:  # slower than the timeout, even on a loaded machine
        remote = OpenAIEngine(model_dir, base_url=server.url, timeout=6.0, backoff=0.01, max_retries=4, concurrency=1)
        server.faults.extend(faults)
        generations = remote.generate(requests)
    _same(generations, offline.generate(requests))
    assert remote.retries >= len(faults)


def test_gives_up_after_max_retries_with_a_clear_error(model_dir, offline) -> None:  # type: ignore[no-untyped-def]
    with ScriptedServer(offline) as server:
        remote = OpenAIEngine(model_dir, base_url=server.url, backoff=0.0, max_retries=2)
        server.faults.extend(["500"] * 3)
        with pytest.raises(RemoteEngineError, match="failed 3 times.*HTTP 500"):
            remote.generate(_requests(offline)[:1])


def test_unreachable_server_is_a_clear_error(model_dir) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RemoteEngineError, match="failed 2 times"):
        OpenAIEngine(model_dir, base_url="http://127.0.0.1:9/v1", backoff=0.0, max_retries=1, timeout=0.5)


def test_top_logprobs_fallback_records_bounds(model_dir, offline) -> None:  # type: ignore[no-untyped-def]
    requests = _requests(offline)[:2]
    with ScriptedServer(offline, honour_token_ids=False) as server:
        remote = OpenAIEngine(model_dir, base_url=server.url, top_logprobs=3)
        generations = remote.generate(requests)
        assert "logprob_token_ids" not in server.bodies[-1] and server.bodies[-1]["logprobs"] == 3
    local = offline.generate(requests)
    for mine, theirs in zip(generations, local, strict=True):
        assert mine.token_ids == theirs.token_ids
        assert len(mine.score_bounds) == len(mine.token_ids)
        for scores, exact, bound in zip(mine.score_logprobs, theirs.score_logprobs, mine.score_bounds, strict=True):
            for token_id, value in scores.items():  # what came back is exact
                assert value == pytest.approx(exact[token_id], abs=1e-4)
            for token_id in set(exact) - set(scores):  # what is missing lies below the bound
                assert exact[token_id] <= bound + 1e-4


def test_api_key_from_environment(model_dir, offline, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SELFRAG_TEST_KEY", "sekret")
    with ScriptedServer(offline, api_key="sekret") as server:
        remote = OpenAIEngine(model_dir, base_url=server.url, api_key_env="SELFRAG_TEST_KEY")
        assert remote.generate(_requests(offline)[:1])[0].token_ids
        monkeypatch.delenv("SELFRAG_TEST_KEY")
        keyless = OpenAIEngine(model_dir, base_url=server.url, api_key_env="SELFRAG_TEST_KEY", max_retries=0)
        with pytest.raises(RemoteEngineError, match="HTTP 401"):
            keyless.generate(_requests(offline)[:1])


def test_context_limit_comes_from_the_served_model_card(model_dir, offline) -> None:  # type: ignore[no-untyped-def]
    """vLLM lists ``max_model_len`` on /v1/models: the runtime's context check uses it (a `vllm serve
    --max-model-len` below the model's own limit included); without it, the local folder's limit."""
    from selfrag.inference.config import InferenceConfig
    from selfrag.inference.engines.base import context_limit
    from selfrag.inference.runtime import SelfRAG

    with ScriptedServer(offline, max_model_len=48) as server:
        remote = OpenAIEngine(model_dir, base_url=server.url)
        assert context_limit(remote) == 48
        rag = SelfRAG(remote, retriever=None, config=InferenceConfig(mode="never", max_tokens=8))
        with pytest.raises(ValueError, match="exceeds the model's context of 48 tokens"):
            rag.answer("Tell me everything about " + "the history of the river Thames " * 6)
        assert server.bodies == []  # refused before any decoding
    with ScriptedServer(offline) as server:
        assert context_limit(OpenAIEngine(model_dir, base_url=server.url)) == offline.max_context
    with ScriptedServer(offline) as server:  # a served name that is listed without a limit
        named = OpenAIEngine(model_dir, base_url=server.url, served_model="scripted-model")
        assert named.served_model == "scripted-model" and named.max_context == offline.max_context
