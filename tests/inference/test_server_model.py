"""The server with the real SmolLM2 engine (slow): a model trained for one step, served, asked over loopback.

Set SELFRAG_TEST_MODEL to a trained model directory to skip the training step.
"""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest
from server_harness import LiveServer

from selfrag.config import load_config
from selfrag.data_gen import DEMO_CORPUS
from selfrag.inference.server.app import create_app
from selfrag.inference.server.backend import load_backend
from selfrag.inference.server.config import ServeConfig

REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    given = os.environ.get("SELFRAG_TEST_MODEL")
    if given:
        return given
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run as generate
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run as train

    out = tmp_path_factory.mktemp("served")
    generate(load_config(GenerateConfig, REPO / "configs/data_gen/squad-demo.yaml", [f"output={out / 'data'}",
                                                                                      "limit=8"]))
    train(load_config(TrainConfig, REPO / "configs/train/smollm2-135m-cpu.yaml", [
        f"records={out / 'data' / 'records.jsonl'}", f"output_dir={out / 'model'}", "training.max_steps=1",
        "training.save_steps=1", "training.eval_fraction=0",
    ]))
    return str(out / "model")


@pytest.mark.slow
def test_real_smollm2_answers_and_streams_the_same(trained_model: str) -> None:
    config = load_config(ServeConfig, None, [f"model={trained_model}", f"retriever.corpus={DEMO_CORPUS}",
                                             "served_model_name=smol", "inference.max_tokens=16", "inference.top_k=2"])
    live = LiveServer(create_app(config, load_backend(config))).start()
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=600)
        messages = [{"role": "user", "content": "Who ruled the duchy of Normandy?"}]
        plain = client.chat.completions.create(model="smol", messages=messages, extra_body={"mode": "always"})  # type: ignore[arg-type]
        extension = plain.model_extra["selfrag"]  # type: ignore[index]
        assert extension["retrieved"] is True
        assert {step["step"] for step in extension["trace"]} >= {"decide", "retrieve", "rank", "support"}
        assert plain.usage is not None and plain.usage.completion_tokens > 0
        chunks = list(client.chat.completions.create(model="smol", messages=messages, stream=True,  # type: ignore[arg-type]
                                                     extra_body={"mode": "always"}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == plain.choices[0].message.content  # greedy decoding: the same answer
        final = next(c.model_extra["selfrag"] for c in chunks if (c.model_extra or {}).get("selfrag", {}).get("type")
                     == "final")
        assert {k: v for k, v in final.items() if k != "type"}["citations"] == extension["citations"]
    finally:
        live.stop()


@pytest.mark.slow
def test_serve_loads_like_ask_a_prebuilt_index_and_checked_engine_options(trained_model: str, tmp_path: Path) -> None:
    from selfrag.inference.retrievers.index import IndexConfig
    from selfrag.inference.retrievers.index_build import run as build_index

    build_index(IndexConfig(corpus=str(DEMO_CORPUS), output=str(tmp_path / "index")))
    config = load_config(ServeConfig, None, [f"model={trained_model}", f"retriever.index={tmp_path / 'index'}",
                                             "inference.engine=hf", "inference.engine_options.batch_size=2",
                                             "inference.max_tokens=8"])
    backend = load_backend(config)
    assert backend.engine.batch_size == 2  # type: ignore[attr-defined]  # engine_options reached the engine
    hits = backend.retriever.search("Who ruled the duchy of Normandy?", 2)  # type: ignore[union-attr]
    assert len(hits) == 2 and hits[0].passage.id.startswith("normans-")
    live = LiveServer(create_app(config, backend)).start()
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=600)
        reply = client.chat.completions.create(model=Path(trained_model).name, extra_body={"mode": "always"},
                                               messages=[{"role": "user", "content": "Who ruled Normandy?"}])
        assert reply.model_extra["selfrag"]["retrieved"] is True  # type: ignore[index]
    finally:
        live.stop()
