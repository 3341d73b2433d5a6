"""TRL's ``rollout_func`` for ``selfrag rl``: a batch of prompts -> the current policy's rollouts, their masks.

    rollout_func = RolloutFunction(policy, retriever, config.rollout, seed=0, engine="hf")
    rollout_func(prompts, trainer)   # {"prompt_ids", "completion_ids", "env_mask", "rollout", ...}
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from selfrag.retrieval import Retriever

from .config import RolloutConfig
from .history import TIMINGS
from .merge import MergedLora
from .policy import Policy
from .rollout import Rollouts, policy_engine
from .vllm_rollouts import VLLMRollouts

#: where rollout.engine=vllm writes the adapter it serves (the current step's only), inside output_dir
ROLLOUT_ADAPTER = "rollout-adapter"


class RolloutFunction:
    """TRL's ``rollout_func``: the prompts (each repeated ``generations`` times by GRPO's sampler) -> rollouts of the
    current policy. Sampling is seeded by the step, so a resumed run samples what the killed one would have.
    ``engine``: ``hf`` decodes with the policy itself (its LoRA merged while it decodes, ``rollout.merge_lora``);
    ``vllm`` in vLLM (:class:`VLLMRollouts`, the adapters it serves in the output folder's ``rollout-adapter``)."""

    def __init__(self, policy: Policy, retriever: Retriever, config: RolloutConfig, seed: int,
                 engine: str = "hf") -> None:
        self.policy, self.retriever, self.config, self.seed = policy, retriever, config, seed
        self.engine = engine
        self.merged = MergedLora()
        self.vllm: VLLMRollouts | None = None

    def close(self) -> None:
        """Stop the rollouts' vLLM engine (nothing to do for hf)."""
        if self.vllm is not None:
            self.vllm.engine.close()
            self.vllm = None

    def __call__(self, prompts: Sequence[str], trainer: Any) -> dict[str, Any]:
        started = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        seed = self.seed + 1009 * trainer.state.global_step + trainer.accelerator.process_index
        if self.engine == "vllm":
            if self.vllm is None:
                # output_dir (the args' is its checkpoints); a folder per process: one writer each
                process = trainer.accelerator.process_index
                scratch = Path(trainer.args.output_dir).parent / ROLLOUT_ADAPTER / f"rank{process}"
                self.vllm = VLLMRollouts(self.policy, scratch, self.config.vllm_options())
            engine = self.vllm.serve(model, trainer.state.global_step, seed)
            rollouts = Rollouts(engine, self.retriever, self.config).run(list(prompts))
        else:
            engine = policy_engine(model, self.policy.tokenizer, self.policy.token_ids,
                                  self.policy.meta.prompt_template, seed=seed)
            merge = self.config.merge_lora and MergedLora.applies(model)
            if merge:
                self.merged.merge(model)
            try:
                rollouts = Rollouts(engine, self.retriever, self.config).run(list(prompts))
            finally:
                if merge:
                    self.merged.unmerge(model)
        completions, masks = [], []
        for rollout in rollouts:
            ids, mask = list(rollout.completion_ids), list(rollout.env_mask)
            if rollout.finish == "eos":  # the model sampled the end of sequence: TRL reads it as a finished answer
                ids, mask = ids + [engine.eos_ids[0]], mask + [1]
            completions.append(ids)
            masks.append(mask)
        trainer._metrics["train"][TIMINGS["rollout_seconds"]].append(time.perf_counter() - started)
        return {"prompt_ids": [list(r.prompt_ids) for r in rollouts], "completion_ids": completions,
                "logprobs": None, "env_mask": masks, "rollout": rollouts}
