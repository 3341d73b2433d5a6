"""The GRPO trainer of ``selfrag rl``: TRL's ``GRPOTrainer`` with two changes: the question order is a function of the
epoch, and the log-probs come from the model's own head where PEFT adapts it.

    trainer = grpo_trainer(config, policy, questions, retriever, reward, output_dir / "checkpoints")

TRL 1.16 scores tokens with a fused head that multiplies the backbone's output by ``lm_head.weight`` itself. Where PEFT
adapts the head (strategy ``add``: the trainable reflection rows, ``TrainableTokensWrapper``; strategy ``reserved``:
LoRA on ``lm_head``), that weight misses the adapter, and the wrapper has no ``bias`` (the fused head fails on it, as
it does in SFT: training/sft_trainer.py). There the log-probs are read from the model's own logits instead
(:func:`use_model_head`): correct, at the memory of one batch's full logits.

TRL 1.16's ``RepeatSampler`` draws every epoch's shuffle from one generator seeded once, so a run resumed from a
checkpoint starts that generator again and meets the questions in the first epoch's order, not the order the killed
run would have met them in. Here each epoch's order is drawn from ``seed + epoch`` (the Trainer calls ``set_epoch``
before each epoch, a resumed one included), so a resumed run trains on what the killed one would have
(``tests/rl/test_rl_train.py``). Everything else (rollouts through ``rollout_func``, the ``env_mask`` on the loss)
is TRL's own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import FusedCausalLMOutput, RepeatSampler

from selfrag.corpus import Query
from selfrag.retrieval import Retriever
from selfrag.training.sft_trainer import save_checkpoint

from .config import RLConfig
from .history import TIMINGS
from .policy import Policy
from .reward import Reward
from .rollout_function import RolloutFunction


class EpochSampler(RepeatSampler):
    """``RepeatSampler`` whose shuffle is reseeded with ``seed + epoch`` at each epoch."""

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle:
            self.generator = torch.Generator()
            self.generator.manual_seed((self.seed or 0) + int(epoch))


def head_is_adapted(model: Any) -> bool:
    """Whether PEFT wraps the output head (its weight alone is not what the model computes with)."""
    return type(model.get_output_embeddings()) is not torch.nn.Linear


def use_model_head(model: Any, temperature: float) -> None:
    """Answer TRL's ``fused_lm_head=True`` calls from the model's own logits (the head as PEFT adapts it): the same
    ``log_probs`` and ``entropy`` per next-token label, zero where the label is -100."""
    fused = model.forward  # TRL's patched forward; without fused_lm_head it is the model's own

    def forward(*args: Any, fused_lm_head: bool = False, labels: Any = None, **kwargs: Any) -> Any:
        if not fused_lm_head:
            return fused(*args, labels=labels, **kwargs)
        kwargs["use_cache"] = False
        logits = fused(*args, **kwargs).logits[:, :-1].float() / temperature  # (batch, length - 1, vocabulary)
        targets = labels[:, 1:].to(logits.device)
        keep = targets != -100
        logp = torch.log_softmax(logits, dim=-1)
        log_probs = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill(~keep, 0.0)
        entropy = -(logp.exp() * logp).sum(-1).masked_fill(~keep, 0.0)
        loss = -log_probs.sum() / keep.sum().clamp(min=1)
        return FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy)

    model.forward = forward


@contextmanager
def lora_head_allowed(model: Any) -> Iterator[None]:
    """Let TRL's ``GRPOTrainer`` take a PEFT model whose output head carries LoRA (strategy reserved on an untied
    model, as the 8B recipe trains: TRL 1.16 refuses it because its fused head would skip the adapter). Here the
    log-probs of such a head come from the model's own logits (:func:`use_model_head`), so the LoRA on the head is
    trained: while TRL's ``__init__`` runs, the model shows TRL the head's base layer."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    head = model.get_output_embeddings() if model is not None and hasattr(model, "get_base_model") else None
    if not isinstance(head, BaseTunerLayer):
        yield
        return
    model.get_output_embeddings = head.get_base_layer  # an instance attribute: shadows the method
    try:
        yield
    finally:
        del model.get_output_embeddings


#: what each step adds to TRL's metrics (averaged over the steps since the last log, as TRL's own are)
STEP_SECONDS, PEAK_MEMORY = TIMINGS["step_seconds"], TIMINGS["peak_allocated_gb"]


class StepClock(TrainerCallback):  # type: ignore[misc]
    """Wall seconds of each optimizer step (its rollouts, scoring, forward, backward and update) and, on CUDA, the
    allocator's peak so far, into the trainer's metrics: rewards.json's ``step_seconds`` and ``peak_allocated_gb``."""

    def __init__(self, metrics: Any) -> None:
        self.metrics, self.started = metrics, 0.0

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.metrics[STEP_SECONDS].append(time.perf_counter() - self.started)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.metrics[PEAK_MEMORY].append(torch.cuda.max_memory_allocated() / 2**30)


class SelfRAGGRPOTrainer(GRPOTrainer):
    """GRPO with an epoch-seeded question order and, where PEFT adapts the head, its log-probs read from the model's
    own logits (see the module docstring); each logged step also says its wall seconds and the rollouts' share."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with lora_head_allowed(kwargs.get("model")):
            super().__init__(*args, **kwargs)
        self.add_callback(StepClock(self._metrics["train"]))
        model: Any = self.model  # a PeftModel or a plain transformers model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if head_is_adapted(base):
            use_model_head(base, self.temperature)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        # an adapter's checkpoint without the grown embedding matrix (226 of SmolLM2's 236 MB), as SFT's
        save_checkpoint(self, super()._save, output_dir, state_dict)

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        sampler: Any = super()._get_train_sampler(dataset)  # a RepeatSampler (typed as Sampler by TRL)
        return EpochSampler(
            data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size, repeat_count=sampler.repeat_count, shuffle=sampler.shuffle,
            seed=sampler.seed,
        )


def grpo_trainer(config: RLConfig, policy: Policy, questions: Sequence[Query], retriever: Retriever, reward: Reward,
                 checkpoints: Path, engine: str = "hf") -> Any:
    """TRL's GRPOTrainer (:class:`SelfRAGGRPOTrainer`) with the runtime's rollouts, one reward function per term and
    its weight."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.x: pinned by tests
    training = config.training
    options: dict[str, Any] = {"bf16": False, "gradient_checkpointing": False, "report_to": "none",
                               "save_strategy": "steps", "logging_first_step": True,
                               "dataloader_pin_memory": False, **config.trl}
    arguments = GRPOConfig(
        output_dir=str(checkpoints), learning_rate=training.learning_rate, max_steps=training.max_steps,
        per_device_train_batch_size=training.questions_per_step * training.generations,
        num_generations=training.generations, beta=training.beta, seed=training.seed,
        logging_steps=training.logging_steps, save_steps=training.save_steps, reward_weights=reward.weights,
        temperature=config.rollout.temperature, **options,
    )
    data = Dataset.from_list([{"prompt": q.question, "answers": list(q.answers), "answerable": q.answerable}
                              for q in questions])
    return SelfRAGGRPOTrainer(
        model=policy.model, reward_funcs=reward.functions(), args=arguments, train_dataset=data,
        processing_class=policy.tokenizer,
        rollout_func=RolloutFunction(policy, retriever, config.rollout, training.seed, engine),
    )
