"""vLLM colocated with the trainer (``rollout.engine=vllm``): the policy's LoRA saved and served each step.

    rollouts = VLLMRollouts(policy, folder, config.rollout.vllm_options())
    engine = rollouts.serve(model, step, seed)   # an Engine sampling the policy as it is now
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from selfrag.inference.engines.options import EngineOptions

from .policy import Policy


def rollout_options(policy: Policy, options: EngineOptions) -> EngineOptions:
    """``options``, with ``vllm_args.load_format=dummy`` where the policy's base was built with random weights (a
    ``load_format`` the user set is kept)."""
    if not policy.random_init:
        return options
    return dataclasses.replace(options, vllm_args={"load_format": "dummy", **options.vllm_args})


class VLLMRollouts:
    """vLLM colocated with the trainer (``rollout.engine=vllm``): the starting adapter's base loaded once in vLLM;
    before each step's rollouts the policy's LoRA as it is now is saved to ``folder`` and served under a new
    ``LoRARequest`` id (:meth:`~selfrag.inference.engines.vllm.VLLMEngine.replace_adapter`; the last step's is
    dropped), so every step samples the policy being trained. The tokens vLLM samples are what GRPO trains on; TRL
    computes their log-probs with the policy itself. A policy built with ``random_init`` has no weights to load, so
    vLLM builds its base with ``load_format=dummy`` (random too, but not the policy's: such a run measures speed and
    memory, never what is learned)."""

    def __init__(self, policy: Policy, folder: Path, options: EngineOptions) -> None:
        from selfrag.inference.engines.vllm import VLLMEngine

        self.engine = VLLMEngine(policy.directory, rollout_options(policy, options))
        self.folder = folder
        self.served: Path | None = None

    def serve(self, model: Any, step: int, seed: int) -> Any:
        """The engine, serving ``model``'s current LoRA and sampling from ``seed``."""
        path = self.folder / f"step-{step}"
        shutil.rmtree(path, ignore_errors=True)
        model.save_pretrained(str(path), save_embedding_layers=False)
        self.engine.replace_adapter(path)
        self.engine.reseed(seed)
        if self.served is not None and self.served != path:
            shutil.rmtree(self.served, ignore_errors=True)
        self.served = path
        return self.engine
