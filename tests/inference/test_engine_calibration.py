"""The model's calibration travels through the Engine protocol: every backend reads it from the model's
selfrag.json, so the runtime decides alike on hf, openai and vllm (issue 28, items 1-2).

It was an attribute only the hf engine set: with engine=openai or vllm the runtime silently used the built-in
0.2 / 0.5 / 0.0, and a passage at p=0.517 flipped from [Irrelevant] to [Relevant] between engines. The vllm half
is in test_vllm_parity.py (CI's vLLM venv).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from openai_scripted_server import ScriptedServer  # noqa: E402

from selfrag.artifacts import ModelMeta, load_meta, save_meta, write_calibration  # noqa: E402
from selfrag.inference.config import InferenceConfig  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.inference.engines.openai import OpenAIEngine  # noqa: E402
from selfrag.inference.runtime import SelfRAG  # noqa: E402
from selfrag.inference.trace import Decide  # noqa: E402
from selfrag.retrieval import BM25Retriever  # noqa: E402
from selfrag.trajectory import Passage  # noqa: E402

CALIBRATION = {"threshold": 0.01, "relevance_threshold": 0.517, "support_bound": 0.25}
PASSAGES = [Passage("a", "Paris", "Paris is the capital of France."), Passage("b", "Rhine", "The Rhine is a river."),
            Passage("c", "Alps", "The Alps are mountains.")]


@pytest.fixture(scope="module")
def calibrated(merged_model_dir) -> Path:  # type: ignore[no-untyped-def]
    path = merged_model_dir(7)
    write_calibration(path, dict(CALIBRATION))
    return path


def _settings(runtime: SelfRAG) -> tuple[float | None, float | None, float | None]:
    return runtime.config.threshold, runtime.config.relevance_threshold, runtime.config.support_bound


def test_hf_and_openai_engines_carry_the_models_calibration_and_answer_alike(calibrated: Path) -> None:
    local = HFEngine(calibrated)
    retriever = BM25Retriever(PASSAGES)
    config = InferenceConfig(mode="adaptive", top_k=2, max_tokens=6, max_rounds=0)
    expected = SelfRAG(local, retriever, config)
    assert _settings(expected) == (0.01, 0.517, 0.25)
    with ScriptedServer(local) as server:
        remote = OpenAIEngine(calibrated, base_url=server.url)
        assert remote.calibration == load_meta(calibrated).calibration  # type: ignore[union-attr]
        runtime = SelfRAG(remote, retriever, config)
        assert _settings(runtime) == _settings(expected)
        question = "What is the capital of France?"
        answer, reference = runtime.answer(question), expected.answer(question)
    decision = next(entry for entry in answer.trace if isinstance(entry, Decide))
    assert decision.threshold == 0.01 and decision.chosen == "retrieve"
    assert [entry.step for entry in answer.trace] == [entry.step for entry in reference.trace]
    assert (answer.answer, answer.abstained, answer.chosen) == (reference.answer, reference.abstained, reference.chosen)


def test_an_uncalibrated_model_gets_the_built_in_values_on_every_engine(calibrated: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(calibrated, plain)
    meta = load_meta(plain)
    assert meta is not None
    save_meta(plain, ModelMeta(meta.token_ids, meta.strategy, meta.prompt_template, meta.base_model, meta.kind))
    with ScriptedServer(HFEngine(plain)) as server:
        remote = OpenAIEngine(plain, base_url=server.url)
        assert remote.calibration is None
        assert _settings(SelfRAG(remote, None, InferenceConfig(mode="never"))) == (0.2, 0.5, 0.0)
