"""Train a LoRA adapter that emits the Self-RAG reflection tokens itself (TRL SFT + PEFT).

    selfrag train --config configs/train/smollm2-135m-cpu.yaml records=data/records.jsonl output_dir=runs/smollm2

Writes into ``output_dir``: the adapter, the tokenizer, ``selfrag.json``, the resolved ``config.yaml`` and
``metrics.json`` (training losses, reflection-token accuracy on the held-out split) and ``run.json`` (the
settings and the records' SHA-256). Checkpoints go to ``output_dir/checkpoints``; a killed run started again
with the same settings and records resumes from the last one; a run with different ones is refused with the
list of differences unless ``restart=true``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from selfrag import reflection as rf
from selfrag.artifacts import ModelMeta, save_meta
from selfrag.config import to_dict, write_resolved
from selfrag.errors import ConfigError, InputError
from selfrag.fsutil import write_json
from selfrag.models import ALIASES, resolve_model
from selfrag.prompting import resolve_template
from selfrag.reflection import Group, ReflectionIds
from selfrag.runs import check_rerun, run_fingerprint
from selfrag.training.config import TrainConfig
from selfrag.training.dataset import (
    EncodedRecords,
    encode_records,
    order_by_question,
    question_batches,
    read_records,
    split_records,
)
from selfrag.training.distributed import DEFAULT_TIMEOUT_S, Processes, use_cpu_backend
from selfrag.training.evaluate import reflection_accuracy
from selfrag.training.judgement import headline, judge, plot, write_report
from selfrag.training.logits import logits_at
from selfrag.training.tokens import (
    embedding_module_names,
    init_reserved_lora,
    is_tied,
    linear_module_names,
    prepare_tokens,
    resolve_strategy,
    set_rows_to_mean,
    set_rows_to_words,
)

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
METRICS_FILE = "metrics.json"
JUDGEMENT_FILE = "judgement.json"
PLOT_FILE = "training.png"


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

    def summary(self) -> str:
        """A few lines for people: where the adapter is, the loss curve's ends, held-out accuracy."""
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
        return "\n".join(lines)


def run(config: TrainConfig) -> TrainResult:
    """Train, evaluate and save one adapter as ``config`` describes."""
    from trl import SFTConfig

    output_dir = Path(config.output_dir)
    processes = Processes.start(float(config.trl.get("ddp_timeout", DEFAULT_TIMEOUT_S)))

    # --- Honest rerun: same settings and records resume, different ones are refused --------------
    # Decided (and run.json written, or the folder cleared for restart=true) by the main process only.
    state = processes.on_main(lambda: check_rerun(output_dir, train_fingerprint(config), config.restart))

    # --- Records first: a bad file fails in a second, before any model loads ------------------------
    records = read_records(config.records)
    eval_records = read_records(config.eval_records) if config.eval_records is not None else []

    # --- Base model, reflection tokens, LoRA -------------------------------------------------------
    prepared = prepare_model(config)
    model, tokenizer, token_ids, template = prepared.model, prepared.tokenizer, prepared.token_ids, prepared.template

    # --- Records: split by stable id hash, encode with the paragraph mask ---------------------------
    train_records, held_out_records = split_records(records, config.training.eval_fraction, config.training.seed)
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
    callbacks = []
    if held_out_set.examples or judgement_examples:
        during_items = max(1, config.judgement_items // 3)
        callbacks.append(
            _accuracy_callback(held_out_set.examples, token_ids, judgement_examples, during_items, config.training)
        )
    if config.method == "full" and config.training.row_lr_multiplier != 1.0:
        callbacks.append(_row_step_callback(model, token_ids, config.training.row_lr_multiplier))
    with _lora_head_allowed(model):
        trainer = _plain_loss_trainer(
            model=model,
            args=SFTConfig(**sft_options(config, checkpoints)),
            train_dataset=train_set.to_dataset(),
            processing_class=tokenizer,
            callbacks=callbacks or None,
            loss_weights=loss_weight_table(
                config.training.loss_weights, token_ids, len(tokenizer), config.training.balance,
                label_counts(train_set.examples) if config.training.balance else None,
            ),
            row_lr_multiplier=config.training.row_lr_multiplier,
            start=answer_start(config.training.loss_weights, token_ids),
            batches=batches,
            rank=relevance_rank(config.training.relevance_rank, token_ids),
        )
    check_sharding(trainer, prepared.strategy, config)
    resume = last_checkpoint(checkpoints) if state == "resume" else None
    if resume:
        logger.info("resuming from %s", resume)
    with processes.stopping_together(checkpoints):
        trainer.train(resume_from_checkpoint=resume)

    # --- Held-out reflection-token accuracy (teacher-forced, fp32) ---------------------------------
    accuracy = reflection_accuracy(model, held_out_set.examples, token_ids)
    logger.info("held-out reflection accuracy: %s", accuracy)
    judgement = judge(model, judgement_examples, token_ids, config.judgement_items) if judgement_examples else None
    if judgement is not None and processes.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_report(output_dir / JUDGEMENT_FILE, judgement)
        logger.info("judgement on %s: %s", config.eval_records, headline(judgement))

    # --- Save: adapter, tokenizer, selfrag.json, resolved config, metrics (the main process writes) -----
    kind: Literal["adapter", "merged"] = "merged" if config.method == "full" else "adapter"
    save_adapter(trainer, model, output_dir, kind)  # every process: FSDP/ZeRO-3 gather the shards together
    history = trainer.state.log_history
    losses = [{"step": float(entry["step"]), "loss": float(entry["loss"])} for entry in history if "loss" in entry]
    during = [entry for entry in history if "reflection_accuracy" in entry or "judgement" in entry]
    result = TrainResult(
        output_dir, losses, accuracy, len(train_set.examples), len(held_out_set.examples),
        train_set.skipped + held_out_set.skipped, resume, during, model, kind,
    )
    if processes.is_main:
        tokenizer.save_pretrained(str(output_dir))
        base_model = base_model_name(config.model, prepared.base_path)
        save_meta(output_dir, ModelMeta(token_ids, prepared.strategy, template, base_model, kind))
        write_resolved(config, output_dir)
        plot(output_dir / PLOT_FILE, losses, during)
        write_metrics(result)
    processes.wait()  # no process returns before the outputs are complete
    return result


@dataclass(frozen=True)
class PreparedModel:
    """The LoRA-wrapped model before training, with its tokenizer, reflection ids and resolved template."""

    model: Any
    tokenizer: Any
    token_ids: ReflectionIds
    template: str
    base_path: str
    strategy: Literal["add", "reserved"] = "add"  # the resolved tokens.strategy ("auto" resolved)


def prepare_model(config: TrainConfig) -> PreparedModel:
    """Load the base, give it the reflection tokens, wrap it in LoRA; seeded, so repeatable."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    set_seed(config.training.seed)
    base_path = resolve_model(config.model)
    logger.info("loading base model %s from %s", config.model, base_path)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, **model_load_options(config))
    if config.quantization:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    strategy = resolve_strategy(tokenizer, config.tokens.strategy)
    token_ids = prepare_tokens(model, tokenizer, strategy, init=config.tokens.init)
    template = resolve_template(tokenizer, config.prompt_template)
    if config.method == "full":
        if strategy == "reserved":  # no LoRA to hold the start values: the reserved rows themselves are set
            start_reserved_rows(model, tokenizer, token_ids, config.tokens.init)
        model.requires_grad_(True)
        total = sum(parameter.numel() for parameter in model.parameters())
        trainable = total
    else:
        model = get_peft_model(model, lora_config(config, token_ids, model, strategy))
        if strategy == "reserved":
            init_reserved_lora(model, token_ids, _base_rows(tokenizer))
        trainable, total = model.get_nb_trainable_parameters()
    logger.info("method=%s, tokens.strategy=%s; trainable parameters: %d of %d", config.method, strategy,
                trainable, total)
    return PreparedModel(model, tokenizer, token_ids, template, base_path, strategy)


def start_reserved_rows(model: Any, tokenizer: Any, token_ids: ReflectionIds, init: str) -> None:
    """method=full with strategy reserved: the reserved rows start at the mean of the real rows (or at their
    words' embeddings, ``tokens.init=words``), as the LoRA of method lora makes them start."""
    ids = sorted(token_ids.all_ids)
    set_rows_to_mean(model, ids, _base_rows(tokenizer))
    if init == "words":
        set_rows_to_words(model, tokenizer, {i: token for token, i in token_ids.token_to_id.items()})


def model_load_options(config: TrainConfig) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments: the dtype, and a ``BitsAndBytesConfig`` for QLoRA."""
    options: dict[str, Any] = {"dtype": getattr(torch, config.dtype)}
    if config.quantization:
        from transformers import BitsAndBytesConfig

        settings = dict(config.quantization)
        for key in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
            if isinstance(settings.get(key), str):
                settings[key] = getattr(torch, settings[key])
        options["quantization_config"] = BitsAndBytesConfig(**settings)
    return options


def lora_config(config: TrainConfig, token_ids: ReflectionIds, model: Any, strategy: str = "add") -> Any:
    """PEFT ``LoraConfig`` for a strategy.

    ``add``: LoRA plus the reflection rows trained through ``trainable_token_indices`` (input embeddings; the
    head too when untied). ``reserved``: a plain LoRA that vLLM loads as a ``LoRARequest``: the linear layers
    plus ``embed_tokens`` and ``lm_head`` (see ``tokens.init_reserved_lora`` for how only the reflection rows
    move). vLLM's loader accepts nothing else: no ``trainable_tokens_delta``, no ``modules_to_save``.
    """
    from peft import LoraConfig

    options: dict[str, Any] = {
        "r": config.lora.r, "lora_alpha": config.lora.alpha, "lora_dropout": config.lora.dropout,
        "task_type": "CAUSAL_LM",
    }
    if strategy == "reserved":
        embedding, head = embedding_module_names(model)
        linear = config.lora.target_modules
        linear = linear_module_names(model) if linear == "all-linear" else list(linear)
        options["target_modules"] = sorted({*linear, embedding, *([head] if head else [])})
    else:
        ids = list(token_ids.all_ids)
        # With tied weights PEFT wraps the head with an adapter tied to the embedding one; an untied head
        # needs its own entry, else the new tokens could be read but never predicted.
        trainable = {"embed_tokens": ids} if is_tied(model) else {"embed_tokens": ids, "lm_head": ids}
        options.update(target_modules=config.lora.target_modules, trainable_token_indices=trainable)
    return LoraConfig(**options, **config.peft)


@contextmanager
def _lora_head_allowed(model: Any) -> Iterator[None]:
    """Let TRL's SFTTrainer take a model with LoRA on ``lm_head`` (strategy ``reserved``).

    TRL 1.16 refuses it in ``__init__`` because its fused loss reads ``lm_head.weight`` directly and would
    never train the adapter. This recipe's loss is the model's own forward (``_plain_loss_trainer``), which
    goes through the LoRA head, so the check does not apply; it is hidden only while the trainer is built.
    """
    model.get_output_embeddings = lambda: None  # an instance attribute shadows the method
    try:
        yield
    finally:
        del model.get_output_embeddings


def check_sharding(trainer: Any, strategy: str, config: TrainConfig | None = None) -> None:
    """Refuse what sharded parameters break: strategy ``reserved``'s gradient masks (LoRA), and method full's
    scaled row steps, which index the embedding matrix that FSDP / ZeRO-3 hold in shards."""
    sharded = trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled
    full = config is not None and config.method == "full"
    if sharded and full and config is not None and config.training.row_lr_multiplier != 1.0:
        raise ConfigError([
            f"training.row_lr_multiplier={config.training.row_lr_multiplier} with method=full scales the "
            "reflection rows' steps inside the embedding matrix, which FSDP and DeepSpeed ZeRO-3 shard; set "
            "training.row_lr_multiplier=1 or launch with configs/accelerate/ddp.yaml or single_gpu.yaml"
        ])
    if strategy == "reserved" and sharded and not full:
        raise ConfigError([
            "tokens.strategy=reserved keeps the other rows of its embed_tokens/lm_head LoRA at zero with gradient "
            "masks, which FSDP and DeepSpeed ZeRO-3 bypass; launch with configs/accelerate/ddp.yaml or "
            "single_gpu.yaml (an 8B LoRA fits one GPU), or use tokens.strategy=add"
        ])


def save_adapter(trainer: Any, model: Any, output_dir: Path, kind: str = "adapter") -> None:
    """Write the adapter (or, ``kind`` merged, the whole model) once: gathered from the shards under
    FSDP/DeepSpeed, else from the main process.

    Strategy ``add``: the base is resized before the adapter loads and the new rows live in the
    trainable-token deltas; ``reserved``: the base is unchanged. Either way the full embedding matrix need
    not be saved with the adapter (and vLLM's loader skips it). method full: the model with its grown
    embedding, as ``from_pretrained`` reads it.
    """
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        trainer.save_model(str(output_dir))  # gathers the sharded weights; writes on the main process only
    elif trainer.is_world_process_zero():
        if kind == "merged":
            model.save_pretrained(str(output_dir))
        else:
            model.save_pretrained(str(output_dir), save_embedding_layers=False)


def train_fingerprint(config: TrainConfig) -> dict[str, Any]:
    """The settings and the records' content hash that make a training run; ``run.json`` in its output_dir."""
    settings = to_dict(config)
    return run_fingerprint(
        "train", settings, {"records": config.records}, ignore=("output_dir", "restart", "records")
    )


def _base_rows(tokenizer: Any) -> int:
    """Rows of real (not added/special) tokens: what the reserved rows' mean start value is taken over."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return int(backend.get_vocab_size(with_added_tokens=False)) if backend is not None else len(tokenizer)


def sft_options(config: TrainConfig, checkpoints: Path) -> dict[str, Any]:
    """``trl.SFTConfig`` keyword arguments: the recipe's settings, then the ``trl`` pass-through."""
    training = config.training
    options: dict[str, Any] = {
        "output_dir": str(checkpoints),
        "learning_rate": training.learning_rate,
        "num_train_epochs": training.epochs,
        "max_steps": training.max_steps,
        "per_device_train_batch_size": training.batch_size,
        "gradient_accumulation_steps": training.gradient_accumulation_steps,
        "seed": training.seed,
        "logging_steps": training.logging_steps,
        "save_steps": training.save_steps,
        # Pre-tokenized with our own labels: TRL must neither re-tokenize, rebuild labels nor truncate.
        "dataset_kwargs": {"skip_prepare_dataset": True},
        "max_length": None,
        "packing": False,
        # Batches of similar length: padding was ~30% of the tokens with random batches of demo records. With
        # order=question the examples are already arranged (order_by_question) and are read as they stand.
        "train_sampling_strategy": "group_by_length" if training.order == "length" else "sequential",
        # TRL defaults these for GPUs; on CPU bf16 is slow and checkpointing costs time for no gain.
        "gradient_checkpointing": False,
        "bf16": False,
        "report_to": "none",
        "dataloader_pin_memory": torch.cuda.is_available(),
        "save_total_limit": 2,
    }
    if use_cpu_backend():  # several processes, no GPU: one gloo group, not N independent single-process runs
        options.update(use_cpu=True, ddp_backend="gloo")
    options.update(config.trl)
    given = options.get("lr_scheduler_kwargs")
    scheduler = dict(json.loads(given) if isinstance(given, str) else given or {})  # JSON text: checked by validate
    decay = scheduler.get("num_decay_steps")
    if isinstance(decay, float) and 0 < decay < 1 and training.max_steps > 0:
        # a ratio of the run, as transformers reads a float warmup_steps: the recipe's decay stays its last fifth
        # whether the run is the quickstart's 150 steps, a 300-step rerun or CI's 4-step smoke run
        scheduler["num_decay_steps"] = max(1, round(decay * training.max_steps))
        options["lr_scheduler_kwargs"] = scheduler
    return options


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


def loss_weight_table(
    weights: dict[str, float],
    token_ids: ReflectionIds,
    vocab_size: int,
    balance: Sequence[str] = (),
    label_counts: Mapping[int, int] | None = None,
) -> Any:
    """A per-id weight vector (``text`` weight for ordinary ids, the group's weight for reflection/markup ids).

    ``balance``: reflection types whose ids are also weighted by ``n / (k * count(id))`` (``label_counts``:
    how often each id is a label in the training set; ``n`` the type's labels, ``k`` its ids that occur), so
    each verdict weighs as much in total as the others. None when every weight is 1 (the plain mean loss).
    """
    balanced: dict[int, float] = {}
    for name in balance:
        ids = [i for i in token_ids.ids(Group(name)) if (label_counts or {}).get(i, 0) > 0]
        total = sum((label_counts or {})[i] for i in ids)
        balanced.update({i: total / (len(ids) * (label_counts or {})[i]) for i in ids})
    if not balanced and (not weights or all(float(value) == 1.0 for value in weights.values())):
        return None
    size = max(vocab_size, max(token_ids.all_ids) + 1)
    table = torch.full((size,), float(weights.get("text", 1.0)))
    for token_id in token_ids.all_ids:
        group = token_ids.group_of_id(token_id)
        table[token_id] = float(weights.get(group.value if group is not None else "markup", 1.0))
        table[token_id] *= balanced.get(token_id, 1.0)
    return table


def label_counts(examples: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """How often each id is a (trained) label across ``examples``."""
    counts: dict[int, int] = {}
    for example in examples:
        for label in example["labels"]:
            if label != -100:
                counts[label] = counts.get(label, 0) + 1
    return counts


def weighted_loss(logits: Any, labels: Any, table: Any) -> Any:
    """Weighted mean next-token cross-entropy: sum(w * ce) / sum(w) over the labelled positions.

    ``logits`` covers every position (``batch x length x vocab``); see :func:`masked_loss` for the cheap path.
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    mask = shift_labels != -100
    safe = shift_labels.masked_fill(~mask, 0)
    ce = torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]), safe.reshape(-1), reduction="none"
    ).view_as(safe)
    weights = table.to(logits.device)[safe] * mask
    return (ce * weights).sum() / weights.sum().clamp_min(1e-8)


def predicting_positions(labels: Any) -> Any:
    """A ``batch x length`` bool mask of the positions whose next token is labelled (what the loss reads)."""
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != -100
    return keep


@dataclass(frozen=True)
class AnswerStart:
    """The weight of the first answer word after a verdict: ``after`` ids (the verdicts), ``reflection`` ids
    (a reflection token after a verdict is not an answer word) and the ``weight``."""

    after: Any
    reflection: Any
    weight: float


def answer_start(weights: dict[str, float], token_ids: ReflectionIds) -> AnswerStart | None:
    """:class:`AnswerStart` from ``training.loss_weights.answer_start`` (None when unset)."""
    if "answer_start" not in weights:
        return None
    after = [token_ids.id(token) for token in (rf.RELEVANT, rf.IRRELEVANT, rf.NO_RETRIEVAL)]
    return AnswerStart(torch.tensor(after), torch.tensor(sorted(token_ids.all_ids)), float(weights["answer_start"]))


@dataclass(frozen=True)
class RelevanceRank:
    """The pairwise IsREL ranking term (``training.relevance_rank``): the two verdict ids and the weight."""

    relevant: int
    irrelevant: int
    weight: float


def relevance_rank(weight: float, token_ids: ReflectionIds) -> RelevanceRank | None:
    """:class:`RelevanceRank` for ``training.relevance_rank`` (None when 0)."""
    if weight <= 0:
        return None
    return RelevanceRank(token_ids.id(rf.RELEVANT), token_ids.id(rf.IRRELEVANT), float(weight))


def rank_loss(logits: Any, targets: Any, rank: RelevanceRank) -> Any:
    """Mean ``softplus(m_neg - m_pos)`` over every (``[Relevant]``, ``[Irrelevant]``) pair of IsREL positions.

    ``logits``: one row per labelled position, ``targets`` its label; ``m`` = logit([Relevant]) -
    logit([Irrelevant]) at the position. Zero (no gradient) when the positions hold only one of the verdicts.
    """
    positive, negative = targets == rank.relevant, targets == rank.irrelevant
    if not bool(positive.any()) or not bool(negative.any()):
        return logits.new_zeros(())
    margin = logits[:, rank.relevant].float() - logits[:, rank.irrelevant].float()
    return torch.nn.functional.softplus(margin[negative][None, :] - margin[positive][:, None]).mean()


def masked_loss(
    model: Any,
    inputs: dict[str, Any],
    table: Any,
    start: AnswerStart | None = None,
    rank: RelevanceRank | None = None,
) -> tuple[Any, Any]:
    """The loss of :func:`weighted_loss` with logits computed only where a label is read.

    The model projects onto the vocabulary only the hidden states of :func:`predicting_positions`
    (transformers' ``logits_to_keep`` with a bool mask): in Self-RAG records most positions are the masked
    prompt and passage, so this skips most of the ``length x vocab`` head and its backward. ``table`` None
    is the plain mean over the labelled positions of the micro-batch; ``start`` reweights the first answer
    word after a verdict; ``rank`` adds the pairwise IsREL term (:func:`rank_loss`) times its weight.
    Returns ``(loss, outputs)``.
    """
    labels = inputs["labels"]
    keep = predicting_positions(labels)
    logits, outputs = logits_at(model, {key: value for key, value in inputs.items() if key != "labels"}, keep)
    targets = labels[:, 1:][labels[:, 1:] != -100]
    ce = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
    if table is None and start is None:
        loss = ce.mean() if ce.numel() else ce.sum()
    else:
        weights = table.to(ce.device)[targets] if table is not None else torch.ones_like(ce)
        if start is not None:
            previous = inputs["input_ids"][keep]  # the token read at each predicting position
            verdict_before = torch.isin(previous, start.after.to(ce.device))
            first_word = verdict_before & ~torch.isin(targets, start.reflection.to(ce.device))
            weights = torch.where(first_word, torch.full_like(weights, start.weight), weights)
        loss = (ce * weights).sum() / weights.sum().clamp_min(1e-8)
    if rank is not None:
        loss = loss + rank.weight * rank_loss(logits, targets, rank)
    return loss, outputs


def _plain_loss_trainer(
    loss_weights: Any = None,
    row_lr_multiplier: float = 1.0,
    start: AnswerStart | None = None,
    batches: list[list[int]] | None = None,
    rank: RelevanceRank | None = None,
    **kwargs: Any,
) -> Any:
    """An ``SFTTrainer`` whose loss is the model's own forward over the prebuilt labels.

    TRL 1.16 always patches a fused LM head (``loss_type="nll"`` *is* the fused loss; ``chunked_nll`` is
    an alias) that reads ``lm_head.weight``/``.bias`` directly. Around PEFT's trainable-token wrapper of
    a tied head that fails (``'TrainableTokensWrapper' object has no attribute 'bias'``), and even where
    it ran it would read the base weight without the trained reflection rows. The plain forward goes
    through the wrapper.

    ``loss_weights``: a per-id weight vector (:func:`loss_weight_table`) for a weighted mean loss, or None.
    ``batches``: the training batches as lists of example indices (``training.order=question_batch``), or None
    for the trainer's own sampler.
    ``row_lr_multiplier``: the reflection rows (PEFT ``trainable_tokens_delta``) get this multiple of the
    learning rate, in their own optimizer parameter group.
    """
    from trl import SFTTrainer

    class PlainLossSFTTrainer(SFTTrainer):
        # compute_loss returns each micro-batch's mean: the trainer divides it by the accumulation steps.
        loss_is_scaled_for_ga = False  # type: ignore[assignment]  # TRL declares it None; transformers bool | None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
            loss, outputs = masked_loss(model, inputs, loss_weights, start, rank)
            return (loss, outputs) if return_outputs else loss

        def _get_train_sampler(self, train_dataset=None):  # type: ignore[no-untyped-def]
            from transformers.trainer_pt_utils import LengthGroupedSampler

            sampler = super()._get_train_sampler(train_dataset)
            if not isinstance(sampler, LengthGroupedSampler):
                return sampler
            # training.order=length: transformers groups by the examples of one process's step (batch x accumulation),
            # so 2 processes x batch B and 1 process x B with 2 accumulation steps would read different batches. Grouped
            # by the examples of one optimizer step over every process, each step reads the same examples either way.
            args = self.args
            step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            return LengthGroupedSampler(step, lengths=sampler.lengths)

        def get_train_dataloader(self):  # type: ignore[no-untyped-def]
            if batches is None:
                return super().get_train_dataloader()
            from torch.utils.data import DataLoader

            # training.order=question_batch: the batches are given (whole questions, variable size). The dataset
            # holds only input_ids and labels, so no columns to remove; accelerate's prepare shards batches across
            # processes and its skip_first_batches resumes mid-epoch from the same list.
            loader = DataLoader(
                self.train_dataset,  # type: ignore[arg-type]
                batch_sampler=batches,
                collate_fn=self.data_collator,
                num_workers=self.args.dataloader_num_workers,
                pin_memory=self.args.dataloader_pin_memory,
            )
            return self.accelerator.prepare(loader)

        def create_optimizer(self, model=None):  # type: ignore[no-untyped-def]
            if row_lr_multiplier == 1.0 or self.optimizer is not None:
                return super().create_optimizer(model)
            named = [(n, p) for n, p in (model or self.model).named_parameters() if p.requires_grad]  # type: ignore[union-attr]
            rows = [p for n, p in named if "trainable_tokens_delta" in n]
            others = [p for n, p in named if "trainable_tokens_delta" not in n]
            args = self.args
            groups = [
                {"params": others, "lr": args.learning_rate, "weight_decay": args.weight_decay},
                {"params": rows, "lr": args.learning_rate * row_lr_multiplier, "weight_decay": 0.0},
            ]
            self.optimizer = torch.optim.AdamW(
                [g for g in groups if g["params"]],
                lr=args.learning_rate,
                betas=(args.adam_beta1, args.adam_beta2),
                eps=args.adam_epsilon,
            )
            return self.optimizer

    return PlainLossSFTTrainer(**kwargs)


def _accuracy_callback(
    examples: list[dict[str, Any]],
    token_ids: ReflectionIds,
    judgement_examples: list[dict[str, Any]] | None = None,
    judgement_items: int = 100,
    training: Any = None,
) -> Any:
    """A trainer callback that scores held-out reflection accuracy and the judgement, and logs them.

    Every ``training.eval_steps`` steps, or at each checkpoint when that is 0.
    """
    from transformers import TrainerCallback

    every = int(getattr(training, "eval_steps", 0) or 0)

    def evaluate(state: Any, model: Any) -> None:
        entry: dict[str, Any] = {"step": state.global_step}
        if examples:
            entry["reflection_accuracy"] = reflection_accuracy(model, examples, token_ids)
        if judgement_examples:
            report = judge(model, judgement_examples, token_ids, judgement_items)
            entry["judgement"] = headline(report)
        logger.info("step %d: %s", state.global_step, {k: v for k, v in entry.items() if k != "step"})
        state.log_history.append(entry)

    class ReflectionAccuracyCallback(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            if every and model is not None and state.global_step % every == 0:
                evaluate(state, model)

        def on_save(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            if not every and model is not None:
                evaluate(state, model)

    return ReflectionAccuracyCallback()


def _row_step_callback(model: Any, token_ids: ReflectionIds, multiplier: float) -> Any:
    """method=full: each optimizer step of the reflection rows (input embeddings, and an untied head) is scaled
    by ``multiplier``, their ``row_lr_multiplier``.

    The rows share one parameter with every other row, so no optimizer group can give them their own rate;
    for Adam(W) a step scaled after the fact is the step of a ``multiplier`` times larger learning rate (the
    moments do not depend on the rate).
    """
    from transformers import TrainerCallback

    ids = sorted(token_ids.all_ids)

    def matrices() -> list[Any]:
        embedding = model.get_input_embeddings().weight
        head = model.get_output_embeddings()
        untied = head is not None and head.weight.data_ptr() != embedding.data_ptr()
        return [embedding, head.weight] if untied else [embedding]

    class RowStepCallback(TrainerCallback):
        before: list[Any] = []

        def on_pre_optimizer_step(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.before = [weight[ids].detach().clone() for weight in matrices()]

        def on_optimizer_step(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            with torch.no_grad():
                for weight, old in zip(matrices(), self.before, strict=True):
                    weight[ids] = old + multiplier * (weight[ids] - old)
            self.before = []

    return RowStepCallback()


def last_checkpoint(checkpoints: Path) -> str | None:
    """The newest ``checkpoint-N`` of a previous (killed) run, or None."""
    if not checkpoints.is_dir():
        return None
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(checkpoints))


def base_model_name(name: str, resolved: str) -> str:
    """What ``selfrag.json`` records as the base: the built-in name, else an absolute path, else the hub id."""
    if name.lower() in ALIASES:
        return name.lower()
    path = Path(resolved)
    return str(path.resolve()) if path.is_dir() else resolved


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
    }
    write_json(path, data)
    return path
