"""Gradient checkpointing and the micro-batch chosen from the memory estimate (``training.memory_plan``).

    plan = plan_batch(SHAPES["meta-llama/Llama-3.1-8B-Instruct"], Setup(batch_size=4, max_length=1857), 141.0, 16)
    print(plan.line())   # memory plan: micro-batch 16 x 1 accumulation, gradient checkpointing off ...

Checkpointing recomputes every layer's forward in the backward pass (about a third more compute); it is only worth
it where the card cannot hold the activations otherwise. The plan keeps the examples of an optimizer step
(``batch_size x gradient_accumulation_steps``) and picks, among the micro-batches that divide them:

* checkpointing **off** with the largest micro-batch that fits without it, where that micro-batch is at least the
  configured one or as large as any that fits with checkpointing;
* else checkpointing **on** with the largest micro-batch that fits with it;
* else a :class:`ConfigError` (not even one example fits).

"Fits" is :meth:`MemoryEstimate.fits` (5% of the card left to the driver); the estimate takes every example of a
micro-batch at the longest record's length, an upper bound for padded and packed batches alike.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from selfrag.errors import ConfigError
from selfrag.training.memory import GB, ModelShape, Setup, estimate_memory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPlan:
    """What the plan chose, and the estimate and card it was chosen from."""

    micro_batch: int
    accumulation: int
    checkpointing: bool
    estimate_gb: float
    card_gb: float

    def line(self) -> str:
        return (f"memory plan: micro-batch {self.micro_batch} x {self.accumulation} accumulation, gradient "
                f"checkpointing {'on' if self.checkpointing else 'off'} (estimate {self.estimate_gb:.1f} GB of a "
                f"{self.card_gb:.1f} GB card)")


def largest_fitting(shape: ModelShape, setup: Setup, card_gb: float, sizes: Sequence[int],
                    checkpointing: bool) -> tuple[int, float]:
    """The largest of ``sizes`` whose estimate fits the card, and that estimate; ``(0, 0.0)`` when none does."""
    for size in sorted(sizes, reverse=True):
        estimate = estimate_memory(shape, replace(setup, batch_size=size, gradient_checkpointing=checkpointing))
        if estimate.fits(card_gb):
            return size, estimate.total_gb
    return 0, 0.0


def plan_batch(shape: ModelShape, setup: Setup, card_gb: float, examples_per_step: int,
               keep_micro_batch: bool = False) -> BatchPlan:
    """The plan of the module docstring; ``setup.batch_size`` is the configured micro-batch (kept as it is with
    ``keep_micro_batch``, where only checkpointing is chosen)."""
    configured = setup.batch_size
    sizes = [configured] if keep_micro_batch else \
        [size for size in range(1, examples_per_step + 1) if examples_per_step % size == 0]
    without, without_gb = largest_fitting(shape, setup, card_gb, sizes, checkpointing=False)
    with_, with_gb = largest_fitting(shape, setup, card_gb, sizes, checkpointing=True)
    if without and (without >= configured or without >= with_):
        return BatchPlan(without, examples_per_step // without, False, without_gb, card_gb)
    if with_:
        return BatchPlan(with_, examples_per_step // with_, True, with_gb, card_gb)
    smallest = estimate_memory(shape, replace(setup, batch_size=min(sizes), gradient_checkpointing=True))
    raise ConfigError([
        f"training.memory_plan: micro-batch {min(sizes)} of {setup.max_length} tokens needs about "
        f"{smallest.total_gb:.1f} GB even with gradient checkpointing, more than this {card_gb:.1f} GB card holds; "
        "lower training.max_length, use a QLoRA recipe, or shard with FSDP"
    ])


def labelled_share(examples: Sequence[dict[str, Any]]) -> float:
    """The share of positions that carry a label (the loss projects only those onto the vocabulary)."""
    total = sum(len(example["labels"]) for example in examples)
    labelled = sum(sum(1 for label in example["labels"] if label != -100) for example in examples)
    return labelled / total if total else 0.5


def plan_run(config: Any, model: Any, examples: Sequence[dict[str, Any]], strategy: str) -> BatchPlan | None:
    """``training.memory_plan`` for this run on the CUDA device, or None (off, no GPU, or method full)."""
    import torch

    if not config.training.memory_plan:
        return None
    if not torch.cuda.is_available() or config.method == "full":
        logger.warning("training.memory_plan applies to LoRA runs on a CUDA GPU; keeping the configured batch")
        return None
    training = config.training
    quantized = bool(config.quantization)
    setup = Setup(
        batch_size=training.batch_size, max_length=max(len(example["input_ids"]) for example in examples),
        rank=config.lora.r, quantization="nf4" if quantized else "bf16",
        optimizer_state_bytes=2.0 if "8bit" in str(config.trl.get("optim", "")) else 8.0,
        lora_on_embeddings=strategy == "reserved", labelled_share=labelled_share(examples),
    )
    card_gb = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GB
    shape = ModelShape.from_config(model.config.to_dict())
    return plan_batch(shape, setup, card_gb, training.batch_size * training.gradient_accumulation_steps,
                      keep_micro_batch=training.order == "question_batch")
