"""The trainer of every ``selfrag train`` run: TRL's ``SFTTrainer`` with the project's loss, batches, optimizer
groups and adapter checkpoints.

    trainer = SelfRAGSFTTrainer(model=model, args=SFTConfig(**sft_options(config, checkpoints)),
                                train_dataset=dataset, processing_class=tokenizer, loss_weights=table, batches=None)

Why a subclass: TRL 1.16 always patches a fused LM head (``loss_type="nll"`` *is* the fused loss; ``chunked_nll`` is
an alias) that reads ``lm_head.weight``/``.bias`` directly. Around PEFT's trainable-token wrapper of a tied head that
fails (``'TrainableTokensWrapper' object has no attribute 'bias'``), and even where it ran it would read the base
weight without the trained reflection rows. The loss here is the model's own forward over the prebuilt labels
(:func:`~selfrag.training.loss.masked_loss`), which goes through the wrapper.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Any

import torch
from trl import SFTTrainer

from selfrag.training.loss import AnswerStart, RelevanceRank, masked_loss
from selfrag.training.shortcuts import StepShortcuts
from selfrag.training.trainer import LoraInputCast


class SelfRAGSFTTrainer(SFTTrainer):
    """``SFTTrainer`` plus, each optional:

    ``loss_weights``: a per-id weight vector (:func:`~selfrag.training.loss.loss_weight_table`) for a weighted mean
    loss, or None; ``start``/``rank``: the answer-start weighting and the relevance ranking term of the loss;
    ``batches``: the training batches as lists of example indices (``training.order=question_batch``), or None for
    the trainer's own sampler; ``row_lr_multiplier``: the reflection rows (PEFT ``trainable_tokens_delta``) get this
    multiple of the learning rate, in their own optimizer parameter group; ``lora_input_cast``: PEFT's input casts
    skipped in each training step (``training.lora_input_cast``), or None; ``shortcuts``: the trained rows and LoRA
    dropout's masks of each training step (:mod:`selfrag.training.shortcuts`), or None.
    """

    # compute_loss returns each micro-batch's mean: the trainer divides it by the accumulation steps.
    loss_is_scaled_for_ga = False  # type: ignore[assignment]  # TRL declares it None; transformers bool | None

    def __init__(
        self,
        *args: Any,
        loss_weights: torch.Tensor | None = None,
        row_lr_multiplier: float = 1.0,
        start: AnswerStart | None = None,
        batches: list[list[int]] | None = None,
        rank: RelevanceRank | None = None,
        lora_input_cast: LoraInputCast | None = None,
        shortcuts: StepShortcuts | None = None,
        **kwargs: Any,
    ) -> None:
        self.lora_input_cast = lora_input_cast
        self.shortcuts = shortcuts
        self.loss_weights = loss_weights
        self.row_lr_multiplier = row_lr_multiplier
        self.answer_start = start
        self.question_batches = batches
        self.relevance_rank = rank
        super().__init__(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        loss, outputs = masked_loss(model, inputs, self.loss_weights, self.answer_start, self.relevance_rank)
        return (loss, outputs) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        # forward and backward (a checkpointed recompute too) see the same LoRA input dtype: training.lora_input_cast,
        # and the same layers: the step shortcuts
        with ExitStack() as stack:
            if self.lora_input_cast is not None:
                stack.enter_context(self.lora_input_cast.skipped())
            if self.shortcuts is not None:
                stack.enter_context(self.shortcuts.on())
            return super().training_step(model, inputs, num_items_in_batch)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        save_checkpoint(self, super()._save, output_dir, state_dict)

    def _get_train_sampler(self, train_dataset=None):  # type: ignore[no-untyped-def]
        from transformers.trainer_pt_utils import LengthGroupedSampler

        sampler = super()._get_train_sampler(train_dataset)
        if not isinstance(sampler, LengthGroupedSampler):
            return sampler
        # training.order=length: transformers groups by the examples of one process's step (batch x accumulation), so
        # 2 processes x batch B and 1 process x B with 2 accumulation steps would read different batches. Grouped by
        # the examples of one optimizer step over every process, each step reads the same examples either way.
        args = self.args
        step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        return LengthGroupedSampler(step, lengths=sampler.lengths)

    def get_train_dataloader(self):  # type: ignore[no-untyped-def]
        if self.question_batches is None:
            return super().get_train_dataloader()
        from torch.utils.data import DataLoader

        # training.order=question_batch: the batches are given (whole questions, variable size). The dataset holds
        # only input_ids and labels, so no columns to remove; accelerate's prepare shards batches across processes
        # and its skip_first_batches resumes mid-epoch from the same list.
        loader = DataLoader(
            self.train_dataset,  # type: ignore[arg-type]
            batch_sampler=self.question_batches,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def create_optimizer(self, model=None):  # type: ignore[no-untyped-def]
        if self.row_lr_multiplier == 1.0 or self.optimizer is not None:
            return super().create_optimizer(model)
        named = [(n, p) for n, p in (model or self.model).named_parameters() if p.requires_grad]  # type: ignore[union-attr]
        rows = [p for n, p in named if "trainable_tokens_delta" in n]
        others = [p for n, p in named if "trainable_tokens_delta" not in n]
        args = self.args
        groups = [
            {"params": others, "lr": args.learning_rate, "weight_decay": args.weight_decay},
            {"params": rows, "lr": args.learning_rate * self.row_lr_multiplier, "weight_decay": 0.0},
        ]
        self.optimizer = torch.optim.AdamW(
            [g for g in groups if g["params"]],
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
        )
        return self.optimizer


def save_checkpoint(trainer: Any, plain_save: Any, output_dir: str | None, state_dict: dict[str, Any] | None) -> None:
    """A trainer's ``_save`` for an adapter (SFT and GRPO alike): what the final save writes, the LoRA weights and the
    trained reflection rows (trainable-token deltas). PEFT's ``save_embedding_layers="auto"`` adds the whole grown
    matrix to each checkpoint, as input embedding and as head (tied or not): 226 of SmolLM2-135M's 236 MB, about 2 GB
    at 8B, never read, since resuming grows the base again and the deltas replace its new rows. So an adapter is saved
    with ``save_embedding_layers=False``, then the tokenizer and the arguments, as ``Trainer._save`` does; a model
    without PEFT goes to ``plain_save`` (the trainer's own ``_save``)."""
    from peft import PeftModel
    from transformers.trainer import TRAINING_ARGS_NAME

    unwrapped = trainer.accelerator.unwrap_model(trainer.model, keep_torch_compile=False)
    if not isinstance(unwrapped, PeftModel):
        plain_save(output_dir, state_dict)
        return
    directory = str(output_dir if output_dir is not None else trainer.args.output_dir)
    if trainer.args.should_save:
        os.makedirs(directory, exist_ok=True)
    unwrapped.save_pretrained(directory, state_dict=state_dict, is_main_process=trainer.args.should_save,
                              save_embedding_layers=False)
    if not trainer.args.should_save:
        return
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(directory)
    torch.save(trainer.args, os.path.join(directory, TRAINING_ARGS_NAME))
