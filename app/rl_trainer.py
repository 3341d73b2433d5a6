"""TRL's ``GRPOTrainer`` with two changes for ``selfrag rl``: the question order is a function of the epoch, and the
log-probs come from the model's own head where PEFT adapts it.

    trainer = SelfRAGGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), rollout_func=...)

TRL 1.16 scores tokens with a fused head that multiplies the backbone's output by ``lm_head.weight`` itself. Where PEFT
adapts the head (strategy ``add``: the trainable reflection rows, ``TrainableTokensWrapper``; strategy ``reserved``:
LoRA on ``lm_head``), that weight misses the adapter, and the wrapper has no ``bias`` (the fused head fails on it, as
it does in SFT: DESIGN.md). There the log-probs are read from the model's own logits instead
(:func:`use_model_head`): correct, at the memory of one batch's full logits.

TRL 1.16's ``RepeatSampler`` draws every epoch's shuffle from one generator seeded once, so a run resumed from a
checkpoint starts that generator again and meets the questions in the first epoch's order, not the order the killed
run would have met them in. Here each epoch's order is drawn from ``seed + epoch`` (the Trainer calls ``set_epoch``
before each epoch, a resumed one included), so a resumed run trains on what the killed one would have
(``tests/app/test_rl_train.py``). Everything else (rollouts through ``rollout_func``, the ``env_mask`` on the loss)
is TRL's own.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import FusedCausalLMOutput, RepeatSampler

from selfrag.training.sft_trainer import save_checkpoint


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


class SelfRAGGRPOTrainer(GRPOTrainer):
    """GRPO with an epoch-seeded question order and, where PEFT adapts the head, its log-probs read from the model's
    own logits (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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
