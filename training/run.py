"""Train a LoRA adapter that emits the Self-RAG reflection tokens itself (TRL SFT + PEFT).

    selfrag train --config configs/train/smollm2-135m-cpu.yaml records=data/records.jsonl output_dir=runs/smollm2

Writes into ``output_dir``: the adapter, the tokenizer, ``selfrag.json``, the resolved ``config.yaml`` and
``metrics.json`` (training losses, reflection-token accuracy on the held-out split, tokens/s and peak memory of the
training steps) and ``run.json`` (the
settings and the records' SHA-256). Checkpoints go to ``output_dir/checkpoints``; a killed run started again
with the same settings and records resumes from the last one; a run with different ones is refused with the
list of differences unless ``restart=true``.

The run reads as one story; its parts live beside it: the model (:mod:`~selfrag.training.model`), the loss
(:mod:`~selfrag.training.loss`), the trainer and its callbacks (:mod:`~selfrag.training.trainer`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from selfrag.artifacts import META_FILE, load_meta, save_meta, save_trained_questions
from selfrag.config import to_dict, write_resolved
from selfrag.errors import ConfigError, InputError
from selfrag.fsutil import hold_output, write_json
from selfrag.reflection import ReflectionIds
from selfrag.runs import check_rerun, run_fingerprint, setting_defaults
from selfrag.splits import HELD_SPLITS
from selfrag.training.config import TrainConfig
from selfrag.training.dataset import (
    EncodedRecords,
    encode_records,
    order_by_question,
    question_batches,
    read_records,
    split_records,
)
from selfrag.training.distributed import DEFAULT_TIMEOUT_S, Processes
from selfrag.training.evaluate import reflection_accuracy
from selfrag.training.interrupt import SaveOnInterrupt
from selfrag.training.judgement import headline, judge, plot, write_report
from selfrag.training.loss import answer_start, label_counts, loss_weight_table, relevance_rank
from selfrag.training.model import prepare_model
from selfrag.training.packing import (
    PackedCollator,
    SharedPrefixCollator,
    isolates_packed,
    packed_attention,
    use_padding_free,
    use_shared_prefixes,
)
from selfrag.training.plan import plan_run
from selfrag.training.rag_form import QUESTION_KEY, rag_records
from selfrag.training.resources import StepProfiler, StepTimer, peak_memory, reset_peak_memory
from selfrag.training.sft_trainer import SelfRAGSFTTrainer
from selfrag.training.shortcuts import StepShortcuts
from selfrag.training.trainer import (
    LoraInputCast,
    accuracy_callback,
    attention_kernels,
    check_sharding,
    drop_autocast,
    input_side_detached,
    last_checkpoint,
    lora_head_allowed,
    row_step_callback,
    save_adapter,
    sft_arguments,
    use_bf16,
)

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
METRICS_FILE = "metrics.json"
JUDGEMENT_FILE = "judgement.json"
PLOT_FILE = "training.png"
PROFILE_FILE = "profile.txt"  # training.profile_steps


@dataclass(frozen=True)
class TrainResult:
    """What a run produced: where, the logged losses, and the held-out reflection accuracy."""

    output_dir: Path
    losses: list[dict[str, float]]
    accuracy: dict[str, Any]
    train_examples: int
    held_out_examples: int
    skipped_too_long: int
    resumed_from: str | None
    accuracy_during: list[dict[str, Any]] = field(default_factory=list)  # at each checkpoint: step + accuracy
    model: Any = field(default=None, repr=False, compare=False)  # the trained PeftModel (method full: the model)
    kind: str = "adapter"  # what output_dir holds: "adapter", or "merged" (a whole model, method full)
    resources: dict[str, Any] = field(default_factory=dict)  # throughput and peak memory of the training steps
    already_trained: bool = False  # a rerun of a finished run: nothing was trained or written
    dropped_calibration: bool = False  # restart=true over a calibrated model: its calibration went with it

    def summary(self) -> str:
        """A few lines for people: where the adapter is, the loss curve's ends, held-out accuracy."""
        if self.already_trained:
            return (f"already trained: {self.output_dir} holds the finished run of these settings and records; nothing "
                    "was changed (restart=true trains it again from the start, and drops its calibration)")
        first = self.losses[0]["loss"] if self.losses else float("nan")
        last = self.losses[-1]["loss"] if self.losses else float("nan")
        accuracy = ", ".join(
            f"{name} {value:.0%}" for name, value in self.accuracy.items() if isinstance(value, float)
        )
        lines = [
            f"{'adapter' if self.kind == 'adapter' else 'fine-tuned model'} written to {self.output_dir} "
            f"({self.train_examples} training examples, "
            f"{self.held_out_examples} held out, {self.skipped_too_long} skipped as too long)",
            (f"loss {first:.3f} -> {last:.3f} over {len(self.losses)} logged steps" if self.losses
             else "loss not logged (fewer steps than training.logging_steps)")
            + (f" (resumed from {self.resumed_from})" if self.resumed_from else ""),
            f"held-out reflection-token accuracy: {accuracy or 'n/a'}",
        ]
        if self.dropped_calibration:
            lines.append("restart=true: the earlier run and its calibration are gone; run selfrag calibrate again")
        return "\n".join(lines)


def run(config: TrainConfig) -> TrainResult:
    """Train, evaluate and save one adapter as ``config`` describes."""
    with hold_output(config.output_dir, "train"):  # a second train into the folder is refused: checkpoints interleave
        return _run(config)


def _run(config: TrainConfig) -> TrainResult:
    output_dir = Path(config.output_dir)
    processes = Processes.start(float(config.trl.get("ddp_timeout", DEFAULT_TIMEOUT_S)))

    # --- Honest rerun: same settings and records resume, different ones are refused --------------
    # Decided (and run.json written, or the folder cleared for restart=true) by the main process only.
    # a setting added to the toolkit since a run was made counts as its default (a run from before training.bf16
    # was fp32), so an upgrade resumes a killed run instead of refusing it
    # A finished run of the same settings and records is a no-op: resuming would step past max_steps and rewrite the
    # adapter and selfrag.json (dropping its calibration). restart=true trains again from the start.
    calibrated = config.restart and _calibrated(output_dir)
    state = processes.on_main(lambda: rerun_state(output_dir, config))
    if state == "finished":
        logger.info("%s already holds this finished run (same settings and records); nothing to do", output_dir)
        processes.wait()
        return finished_result(output_dir)

    # --- Records first: a bad file fails in a second, before any model loads ------------------------
    records = read_records(config.records)
    eval_records = read_records(config.eval_records) if config.eval_records is not None else []
    if config.form == "rag":  # the fine-tuned RAG baseline: one plain-RAG example per question, no reflection tokens
        records = rag_records(records, config.training.seed)
        logger.info("form=rag: %d questions as plain-RAG examples (no reflection tokens)", len(records))

    # --- Base model, reflection tokens, LoRA -------------------------------------------------------
    prepared = prepare_model(config)
    model, tokenizer, meta = prepared.model, prepared.tokenizer, prepared.meta
    token_ids, template = meta.token_ids, meta.prompt_template

    # --- Records: split by stable id hash, encode with the paragraph mask ---------------------------
    train_records, held_out_records = split_records(records, config.training.eval_fraction, config.training.seed)
    marked = sorted({str(r.meta.get("split")) for r in train_records if r.meta.get("split") in HELD_SPLITS})
    if marked:  # generate split=test made them on purpose, or the records predate split=all keeping them out
        logger.warning("%s: training on questions marked %s; calibrate and eval will refuse those questions "
                       "(trained-questions.json)", config.records, " and ".join(marked))
    max_length = config.training.max_length
    train_set = encode_records(train_records, tokenizer, token_ids, template, max_length)
    held_out_set = encode_records(held_out_records, tokenizer, token_ids, template, max_length)
    if not train_set.examples:
        raise InputError(
            f"no training record fits training.max_length={max_length} ({train_set.skipped} too long); raise it"
        )
    batches: list[list[int]] | None = None
    if config.training.order == "question":
        train_set = EncodedRecords(
            order_by_question(train_set.examples, train_records, config.training.seed), train_set.skipped
        )
    elif config.training.order == "question_batch":
        ordered, batches = question_batches(
            train_set.examples, train_records, config.training.seed, config.training.batch_size
        )
        train_set = EncodedRecords(ordered, train_set.skipped)
    logger.info("%d training and %d held-out examples", len(train_set.examples), len(held_out_set.examples))
    judgement_examples = judgement_set(config, tokenizer, token_ids, template, eval_records)

    # --- SFT on the pre-tokenized input_ids + labels ---------------------------------------------
    checkpoints = output_dir / CHECKPOINTS
    timer = StepTimer(judge_every=(config.training.eval_steps or config.training.save_steps)
                      if held_out_set.examples or judgement_examples else 0)
    interrupt = SaveOnInterrupt()  # Ctrl-C: a checkpoint at the end of the step, so the same command resumes
    callbacks: list[Any] = [timer, interrupt]
    if config.training.profile_steps:
        callbacks.append(StepProfiler(config.training.profile_steps, output_dir / PROFILE_FILE))
    if held_out_set.examples or judgement_examples:
        during_items = max(1, config.judgement_items // 3)
        callbacks.append(
            accuracy_callback(held_out_set.examples, token_ids, judgement_examples, during_items, config.training,
                              timer)
        )
    if config.method == "full" and config.training.row_lr_multiplier != 1.0:
        callbacks.append(row_step_callback(model, token_ids, config.training.row_lr_multiplier))
    plan = plan_run(config, model, train_set.examples, meta.strategy)  # training.memory_plan; None when off
    if plan is not None:
        logger.info("%s", plan.line())
    arguments = sft_arguments(config, checkpoints, plan)
    logger.info("bf16 mixed precision %s (training.bf16=%s)", "on" if arguments.bf16 else "off",
                config.training.bf16)
    collator = packed_collator(config, model, arguments.per_device_train_batch_size)
    with lora_head_allowed(model):
        trainer = SelfRAGSFTTrainer(
            model=model,
            args=arguments,
            train_dataset=train_set.to_dataset(),
            processing_class=tokenizer,
            callbacks=callbacks,
            loss_weights=loss_weight_table(
                config.training.loss_weights, token_ids, len(tokenizer), config.training.balance,
                label_counts(train_set.examples) if config.training.balance else None,
            ),
            row_lr_multiplier=config.training.row_lr_multiplier,
            start=answer_start(config.training.loss_weights, token_ids),
            batches=batches,
            rank=relevance_rank(config.training.relevance_rank, token_ids),
            data_collator=collator,
            lora_input_cast=LoraInputCast(
                model, config.training.lora_input_cast == "auto" and bool(arguments.bf16) and config.method == "lora"),
            shortcuts=StepShortcuts(model, rows=config.training.trainable_rows == "gather",
                                    dropout=config.training.dropout_masks == "fast"),
        )
    check_sharding(trainer, meta.strategy, config)
    resume = last_checkpoint(checkpoints) if state == "resume" else None
    if resume:
        logger.info("resuming from %s", resume)
    detached = config.lora.layers is not None  # the backward pass stops at the lowest adapted block
    reset_peak_memory()  # the peak of the steps, not of building the model
    with processes.stopping_together(lambda: last_checkpoint(checkpoints)), input_side_detached(
            model, detached, bool(arguments.gradient_checkpointing)), packed_attention(model, collator is not None), \
            interrupt.listening(processes.count), attention_kernels(config.training.attention_kernels):
        trainer.train(resume_from_checkpoint=resume)
    interrupt.stop_if_interrupted()
    resources = {"throughput": timer.summary(), "peak_memory": peak_memory()}  # the steps', before evaluation
    if plan is not None:
        resources["memory_plan"] = asdict(plan)  # what the steps ran with (gpu_check's estimate reads it)
    logger.info("training steps: %s; peak memory: %s", resources["throughput"], resources["peak_memory"])
    drop_autocast(trainer.model)  # bf16 autocast was for the steps; what follows scores in the model's precision

    # --- Held-out reflection-token accuracy (teacher-forced, fp32) ---------------------------------
    accuracy = reflection_accuracy(model, held_out_set.examples, token_ids)
    logger.info("held-out reflection accuracy: %s", accuracy)
    judgement = judge(model, judgement_examples, token_ids, config.judgement_items) if judgement_examples else None
    if judgement is not None and processes.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_report(output_dir / JUDGEMENT_FILE, judgement)
        logger.info("judgement on %s: %s", config.eval_records, headline(judgement))

    # --- Save: adapter, tokenizer, selfrag.json, resolved config, metrics (the main process writes) -----
    kind = meta.kind
    save_adapter(trainer, model, output_dir, kind)  # every process: FSDP/ZeRO-3 gather the shards together
    history = trainer.state.log_history
    losses = [{"step": float(entry["step"]), "loss": float(entry["loss"])} for entry in history if "loss" in entry]
    during = [entry for entry in history if "reflection_accuracy" in entry or "judgement" in entry]
    if held_out_set.examples or judgement_examples:  # the last step's judgement is the one after training
        final: dict[str, Any] = {"step": trainer.state.global_step}
        if held_out_set.examples:
            final["reflection_accuracy"] = accuracy
        if judgement is not None:
            final["judgement"] = headline(judgement)
        during = [entry for entry in during if entry["step"] < final["step"]] + [final]
    result = TrainResult(
        output_dir, losses, accuracy, len(train_set.examples), len(held_out_set.examples),
        train_set.skipped + held_out_set.skipped, resume, during, model, kind, resources=resources,
        dropped_calibration=calibrated,
    )
    if processes.is_main:
        tokenizer.save_pretrained(str(output_dir))
        save_meta(output_dir, meta)
        # what eval and calibrate check their questions against (the held-out records were not trained on)
        save_trained_questions(output_dir, (str(record.meta.get(QUESTION_KEY, record.instruction))
                                            for record in train_records))
        write_resolved(config, output_dir)
        plot(output_dir / PLOT_FILE, losses, during)
        write_metrics(result)
    processes.wait()  # no process returns before the outputs are complete
    return result


def packed_collator(config: TrainConfig, model: Any, micro_batch: int) -> PackedCollator | SharedPrefixCollator | None:
    """``training.padding_free`` and ``training.share_prefixes`` resolved for this model: the packing or prefix-tree
    collator, or None for TRL's padded one."""
    setting = config.training.padding_free
    packed = use_padding_free(setting, model, micro_batch)
    if packed and not isolates_packed(model):
        implementation = getattr(model.config, "_attn_implementation", None)
        raise ConfigError([
            f"training.padding_free=true: attention {implementation!r} with this transformers release does not keep "
            "packed records apart; set training.padding_free=auto or false, or load the model with sdpa attention"
        ])
    logger.info("padding-free batches %s (training.padding_free=%s)", "on" if packed else "off", setting)
    share = config.training.share_prefixes
    if share is True and not packed:
        raise ConfigError(["training.share_prefixes=true needs packed batches: set training.padding_free=true (or "
                           "auto), or share_prefixes=auto"])
    shared = use_shared_prefixes(share, model, packed, config.lora.dropout)
    implementation = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if shared and implementation not in ("sdpa", "eager"):
        raise ConfigError([f"training.share_prefixes=true: attention {implementation!r} cannot attend over a prefix "
                           "tree; load the model with sdpa attention or set training.share_prefixes=auto"])
    if packed:
        why = (f"; lora.dropout={config.lora.dropout} would give every record at a shared token one mask"
               if share == "auto" and not shared and config.lora.dropout else "")
        logger.info("shared prefixes %s (training.share_prefixes=%s%s)", "on" if shared else "off", share, why)
    if shared:
        return SharedPrefixCollator()
    return PackedCollator() if packed else None


def rerun_state(output_dir: Path, config: TrainConfig) -> Literal["fresh", "resume", "finished"]:
    """:func:`selfrag.runs.check_rerun` (same run resumes, another is refused, ``restart`` starts over), and
    ``finished`` for a resumed run whose outputs are complete (``metrics.json`` is written last)."""
    state = check_rerun(output_dir, train_fingerprint(config), config.restart, defaults=setting_defaults(TrainConfig))
    complete = (output_dir / METRICS_FILE).is_file() and (output_dir / META_FILE).is_file()
    return "finished" if state == "resume" and complete else state


def finished_result(output_dir: Path) -> TrainResult:
    """The result of a finished run, as its ``metrics.json`` recorded it (``already_trained``)."""
    metrics = json.loads((output_dir / METRICS_FILE).read_text(encoding="utf-8"))
    meta = load_meta(output_dir)
    return TrainResult(
        output_dir, list(metrics.get("train_losses") or []), dict(metrics.get("reflection_accuracy") or {}),
        int(metrics.get("train_examples", 0)), int(metrics.get("held_out_examples", 0)),
        int(metrics.get("skipped_too_long", 0)), metrics.get("resumed_from"),
        list(metrics.get("reflection_accuracy_at_checkpoints") or []), None,
        meta.kind if meta is not None else "adapter", already_trained=True,
    )


def _calibrated(output_dir: Path) -> bool:
    try:
        meta = load_meta(output_dir)
    except InputError:
        return False
    return meta is not None and meta.calibration is not None


def train_fingerprint(config: TrainConfig) -> dict[str, Any]:
    """The settings and the records' content hash that make a training run; ``run.json`` in its output_dir."""
    settings = to_dict(config)
    # what training.bf16=auto became on this machine: a run resumed where it resolves otherwise is a different run
    settings["training"]["bf16"] = use_bf16(config.training.bf16)
    return run_fingerprint(
        "train", settings, {"records": config.records},
        # profiling changes no weight; the cast and the attention kernels change how, not what, a step computes
        ignore=("output_dir", "restart", "records", "training.profile_steps", "training.lora_input_cast",
                "training.attention_kernels", "training.trainable_rows"),
    )


def judgement_set(
    config: TrainConfig, tokenizer: Any, token_ids: ReflectionIds, template: str, records: Sequence[Any] | None = None
) -> list[dict[str, Any]]:
    """The encoded ``eval_records`` (``records`` when already read) with their kind and question id.

    Empty when none are configured.
    """
    if config.eval_records is None:
        return []
    records = read_records(config.eval_records) if records is None else records
    kinds = {
        record.id: (str(record.meta.get("kind")), str(record.meta.get("query_id", record.id))) for record in records
    }
    encoded = encode_records(records, tokenizer, token_ids, template, config.training.max_length)
    examples = [
        {**example, "kind": kinds[example["id"]][0], "query_id": kinds[example["id"]][1]}
        for example in encoded.examples
    ]
    logger.info("judgement evaluation: %d records from %s", len(examples), config.eval_records)
    return examples


def write_metrics(result: TrainResult) -> Path:
    path = result.output_dir / METRICS_FILE
    data = {
        "train_losses": result.losses,
        "reflection_accuracy": result.accuracy,
        "train_examples": result.train_examples,
        "held_out_examples": result.held_out_examples,
        "skipped_too_long": result.skipped_too_long,
        "resumed_from": result.resumed_from,
        "reflection_accuracy_at_checkpoints": result.accuracy_during,
        **result.resources,  # throughput (tokens/s after the first step) and peak_memory of the training steps
    }
    write_json(path, data)
    return path
