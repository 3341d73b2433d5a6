"""The training config: one dataclass, every field documented; TRL/PEFT options pass through as dicts.

    config = load_config(TrainConfig, "configs/train/smollm2-135m-cpu.yaml", ["training.max_steps=50"])

``trl`` and ``peft`` keys are checked against the real ``trl.SFTConfig`` / ``peft.LoraConfig`` fields
when the config loads, so a typo fails before a model is loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import typing
from pathlib import Path
from typing import Any, Literal

from selfrag.config import check_options, help_field

#: SFTConfig fields this recipe sets itself from the typed config; setting them in ``trl`` is an error.
TRL_OWNED: dict[str, str] = {
    "output_dir": "output_dir",
    "learning_rate": "training.learning_rate",
    "num_train_epochs": "training.epochs",
    "max_steps": "training.max_steps",
    "per_device_train_batch_size": "training.batch_size",
    "gradient_accumulation_steps": "training.gradient_accumulation_steps",
    "max_length": "training.max_length",
    "seed": "training.seed",
    "logging_steps": "training.logging_steps",
    "save_steps": "training.save_steps",
    "dataset_kwargs": "(fixed: the dataset is pre-tokenized)",
    "loss_type": "(fixed: plain nll over the prebuilt labels)",
}
#: LoraConfig fields this recipe sets itself.
PEFT_OWNED: dict[str, str] = {
    "r": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "target_modules": "lora.target_modules",
    "layers_to_transform": "lora.layers",
    "trainable_token_indices": "(fixed: the reflection token ids)",
    "task_type": "(fixed: CAUSAL_LM)",
}


#: Keys of ``training.loss_weights``: the four reflection types, the passage markup, and everything else.
LOSS_WEIGHT_KEYS = ("retrieve", "relevance", "support", "utility", "markup", "text", "answer_start")
#: Keys of ``training.balance``: the reflection types.
BALANCE_KEYS = LOSS_WEIGHT_KEYS[:4]


#: training.attention_kernels: the SDPA backends a training step may be limited to (torch.nn.attention.SDPBackend)
ATTENTION_KERNELS = ("flash", "efficient", "cudnn", "math")

@dataclasses.dataclass
class TokensConfig:
    """How the reflection tokens enter the tokenizer: new tokens, or reserved ones renamed."""

    strategy: Literal["auto", "add", "reserved"] = help_field(
        "How the reflection tokens get ids: 'add' new special tokens (trained via PEFT trainable tokens; serve the "
        "`selfrag export` merged model with vLLM), 'reserved': rename 15 unused Llama-3 style "
        "<|reserved_special_token_N|> tokens (vocabulary and base unchanged; a plain LoRA adapter that vLLM "
        "serves as a LoRARequest), or 'auto': reserved where the tokenizer has >= 15 reserved tokens, else add.",
        default="auto",
    )
    init: Literal["mean", "words"] = help_field(
        "Initial rows of the new reflection tokens (strategy 'add'): 'mean' of all rows (every token starts the "
        "same), or 'words': the mean embedding of words that say what the token means ('relevant', "
        "'irrelevant', 'supported', ...), so [Relevant] and [Irrelevant] start apart.",
        default="mean",
    )


@dataclasses.dataclass
class LoraOptions:
    """The LoRA adapter: rank, alpha, dropout, the modules and the blocks it wraps."""

    r: int = help_field("LoRA rank.", default=16)
    alpha: int = help_field("LoRA alpha (the update is scaled by alpha / r).", default=32)
    dropout: float = help_field("Dropout on the LoRA input.", default=0.05)
    target_modules: str | list[str] = help_field(
        "Modules that get LoRA: 'all-linear' or a list of module names (q_proj, v_proj, ...).", default="all-linear"
    )
    layers: int | float | None = help_field(
        "LoRA on the top blocks only: N (an integer) blocks, or a share of the model's blocks (a number in (0, 1]: "
        "0.5 is the top half); null: every block. The reflection rows then learn from the output head alone (their "
        "input side is detached during training), so the backward pass stops at the lowest adapted block: on the CPU "
        "recipe the top 15 of 30 blocks made a step 1.6x faster. Needs tokens.strategy=add.",
        default=None,
    )

    def validate(self) -> list[str]:
        problems = []
        if self.r < 1:
            problems.append(f"r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            problems.append(f"alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        problems += _check_target_modules(self.target_modules)
        if isinstance(self.layers, float) and not 0 < self.layers <= 1:
            problems.append(f"layers must be a share of the blocks in (0, 1], a number of blocks >= 1, or null for "
                            f"every block, got {self.layers}")
        elif isinstance(self.layers, int) and self.layers < 1:
            problems.append(f"layers must be a number of blocks >= 1, a share of them in (0, 1], or null for every "
                            f"block, got {self.layers}")
        return problems


def _check_target_modules(modules: str | list[str]) -> list[str]:
    # PEFT reads a string as a regular expression over full module names: a bare name matches nothing.
    if isinstance(modules, str) and modules != "all-linear" and re.fullmatch(r"[A-Za-z0-9_.]+", modules):
        return [
            f"target_modules is the string {modules!r}, which PEFT reads as a regular expression over full "
            f"module names and matches nothing; write a list: lora.target_modules=[{modules}]"
        ]
    if isinstance(modules, list) and not modules:
        return ["target_modules is an empty list; write lora.target_modules=all-linear or name the modules"]
    return []


@dataclasses.dataclass
class TrainingOptions:
    """Optimisation: learning rate, epochs or steps, batch size, checkpoints, and how the reflection tokens' loss is
    weighted."""

    learning_rate: float = help_field(
        "Peak learning rate. 2e-4 collapsed SmolLM2-135M to constant reflection tokens; 1e-3 learned.", default=1e-3
    )
    epochs: float = help_field("Passes over the training records (ignored when max_steps > 0).", default=1.0)
    max_steps: int = help_field("Optimizer steps to run; -1 runs `epochs` epochs.", default=-1)
    batch_size: int = help_field("Examples per device per step.", default=4)
    gradient_accumulation_steps: int = help_field("Micro-batches accumulated per optimizer step.", default=1)
    max_length: int = help_field(
        "Longest example in tokens; longer records are skipped and counted, never truncated.", default=1024
    )
    seed: int = help_field("Seed for initialisation, shuffling and the held-out split.", default=0)
    logging_steps: int = help_field("Log the training loss every this many steps.", default=10)
    eval_fraction: float = help_field(
        "Fraction of questions held out (by a stable hash of the question id: all of a question's records "
        "together) for reflection-token accuracy.",
        default=0.05,
    )
    save_steps: int = help_field("Write a resumable checkpoint every this many steps.", default=200)
    loss_weights: dict[str, float] = help_field(
        "Loss weight per label position, by kind: retrieve, relevance, support, utility (the reflection types), "
        "markup (<paragraph> tokens) and text (answer words, EOS); unset kinds weigh 1. The loss is the weighted "
        "mean over the batch's labelled positions, so {relevance: 4} makes each IsREL position count as four "
        "text tokens and {text: 0} trains the reflection positions only. answer_start: the first answer word "
        "after a [Relevant]/[Irrelevant]/[No Retrieval] verdict (default: the text weight); with text far below "
        "the verdicts, a model otherwise learns to follow [Relevant] with a verdict and writes no answer.",
        default_factory=dict,
    )
    balance: list[str] = help_field(
        "Reflection types whose tokens are class-balanced in the loss: each token of the type is weighted by "
        "1 / (its share of the type's labels in the training records x the number of tokens seen), so every "
        "verdict counts as much as the others, times the type's loss_weights entry. E.g. [relevance] when "
        "[Irrelevant] outnumbers [Relevant] (extra hard negatives): an unbalanced IsREL learns the majority first.",
        default_factory=list,
    )
    row_lr_multiplier: float = help_field(
        "Learning rate of the reflection-token rows (PEFT trainable tokens) as a multiple of learning_rate; "
        "the rows start at their initialisation and must move far to separate [Relevant] from [Irrelevant]. "
        "With method=full the rows share the embedding matrix, so each optimizer step they take is scaled "
        "instead (the same thing for Adam).",
        default=1.0,
    )
    relevance_rank: float = help_field(
        "Weight of a pairwise ranking term on IsREL, added to the loss: for every [Relevant]-labelled and "
        "[Irrelevant]-labelled IsREL position of one micro-batch, softplus(m_irrelevant - m_relevant), with m the "
        "logit of [Relevant] minus that of [Irrelevant], averaged over the pairs. With order: question a batch holds "
        "one question's gold passage and its negatives, so the term ranks a question's own evidence above its "
        "same-article hard negative, the contrast the cross-entropy of each record alone leaves weakest. 0: off.",
        default=0.0,
    )
    order: Literal["length", "question", "question_batch"] = help_field(
        "Order of the training examples: 'length' batches examples of similar length in random order (least "
        "padding); 'question' keeps each question's records together (its gold passage, easy, hard and support "
        "negatives fill consecutive batches, questions in a seeded random order), so each step contrasts passages "
        "for the same question: the model must read whether the passage holds the answer, not what relevant "
        "passages look like. 'question_batch' is 'question' with batches of whole questions only (batch_size "
        "becomes a maximum: a 3-record question is a batch of 3 unless a 1-record one follows), where 'question' "
        "lays questions end to end in batches of exactly batch_size, so most batches hold parts of two.",
        default="length",
    )
    bf16: bool | Literal["auto"] = help_field(
        "bf16 mixed precision (autocast; the weights and the optimizer stay fp32): 'auto' turns it on where the "
        "hardware computes bf16 natively, a CUDA GPU with bf16 or a CPU with AVX512-BF16 or AMX (1.42x faster "
        "steps of the CPU recipe on the 2-core development machine), and off elsewhere, where emulated bf16 is "
        "slower than fp32; true / false force it (false, fp32, is the default and the CPU recipes' setting, as "
        "their results were measured). trl.bf16 / trl.fp16, when given, win.",
        default=False,
    )
    eval_steps: int = help_field(
        "Score the judgement (eval_records) and the held-out reflection accuracy every this many steps; "
        "0: at each checkpoint (save_steps).",
        default=0,
    )
    padding_free: bool | Literal["auto"] = help_field(
        "Pack each micro-batch's records end to end in one row without pads (position ids restart per record, so "
        "attention stays within each record; the loss is the same per-token mean over the same tokens): a padded "
        "micro-batch computes every record at its longest one's length. 'auto' packs where the model's attention "
        "keeps packed records apart (sdpa, eager, flash attention) and batch_size > 1. false: padded batches.",
        default=False,
    )
    share_prefixes: bool | Literal["auto"] = help_field(
        "With padding_free: the micro-batch's records as one prefix tree, each token that several records begin "
        "with (a question's prompt; the same passage under two verdicts) computed once, and each record attending to "
        "its own path through the tree; the loss reads every labelled position as before, so the loss and gradients "
        "are the packed batch's. Pays with training.order=question (the quickstart's batches: 0.68 of the tokens). "
        "'auto': on where the batches are packed, the attention is sdpa or eager (not flash attention, whose "
        "kernel reads only contiguous records) and lora.dropout is 0 (with dropout one mask would serve every record "
        "at a shared token: true shares anyway). false: records side by side.",
        default="auto",
    )
    profile_steps: int = help_field(
        "Profile this many optimizer steps after the first with torch.profiler and write profile.txt into "
        "output_dir: the operators by their own time (the device's on a GPU, else the CPU's), to see where a step's "
        "time goes before changing settings. The profiled steps run slower, and metrics.json's throughput counts "
        "them. 0: off.",
        default=0,
    )
    lora_input_cast: Literal["auto", "always"] = help_field(
        "PEFT casts each LoRA layer's input to the adapter's dtype (fp32) before its matmuls; under bf16 autocast "
        "those run in bf16 anyway, so the cast and autocast's cast back are two wasted copies per adapted layer. "
        "'auto' skips them in the training steps when bf16 autocast is on (same result); 'always' keeps PEFT's "
        "cast (to compare). Scoring outside autocast always casts.",
        default="auto",
    )
    trainable_rows: Literal["gather", "peft"] = help_field(
        "How a training step reads the trained reflection rows (PEFT trainable tokens, strategies add and reserved). "
        "'gather': the embedding takes the base matrix and puts the trained rows at their ids, and the tied head adds "
        "their columns, so no step copies the whole vocabulary matrix or computes its gradient (same values; 0.25 s "
        "of a 1.9 s step on 2 CPU cores with a 49k vocabulary). 'peft': PEFT's merged copy (to compare).",
        default="gather",
    )
    dropout_masks: Literal["fast", "torch"] = help_field(
        "LoRA dropout's masks in a training step on the CPU. 'fast': 16 random bits an element from numpy's PCG64, "
        "seeded from torch's generator (the same dropout probability and scaling; torch's Mersenne Twister was a "
        "sixth of a CPU step). 'torch': torch.nn.Dropout's own. Other devices always use torch's.",
        default="fast",
    )
    attention_kernels: list[str] = help_field(
        "The scaled-dot-product attention backends the training steps may use, from flash, efficient, cudnn, math "
        "(torch.nn.attention.sdpa_kernel); empty: torch's choice. On an H200 torch picked cudnn, which spent "
        "1.4-1.6 ms of host time per call (2026-11-30 profile): [flash, efficient] avoids it.",
        default_factory=list,
    )
    memory_plan: bool = help_field(
        "On a CUDA GPU, choose gradient checkpointing and the micro-batch from selfrag.training.memory's estimate "
        "and the card's memory, printed at start: checkpointing off where the card holds the micro-batch without "
        "it, and the largest micro-batch that fits, keeping batch_size x gradient_accumulation_steps examples per "
        "optimizer step (order: question_batch keeps its batches). Overrides trl.gradient_checkpointing. Ignored "
        "without a GPU.",
        default=False,
    )

    def validate(self) -> list[str]:
        problems = []
        if self.learning_rate <= 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}; try 1e-3 for a small model")
        if self.epochs <= 0 and self.max_steps <= 0:
            problems.append(f"epochs must be > 0 when max_steps is -1, got {self.epochs}")
        if self.max_steps == 0 or self.max_steps < -1:
            problems.append(f"max_steps must be -1 (use epochs) or >= 1, got {self.max_steps}")
        unknown = [name for name in self.attention_kernels if name not in ATTENTION_KERNELS]
        if unknown or len(set(self.attention_kernels)) != len(self.attention_kernels):
            problems.append(f"attention_kernels must name each of flash, efficient, cudnn, math at most once, got "
                            f"{self.attention_kernels}; e.g. [flash, efficient], or [] for torch's choice")
        if self.profile_steps < 0:
            problems.append(f"profile_steps must be >= 0 (0: off), got {self.profile_steps}")
        for name in ("batch_size", "gradient_accumulation_steps", "max_length", "logging_steps", "save_steps"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        for key, weight in self.loss_weights.items():
            if key not in LOSS_WEIGHT_KEYS:
                close = difflib.get_close_matches(str(key), LOSS_WEIGHT_KEYS, n=1)
                hint = f"; did you mean {close[0]}?" if close else f"; use one of {list(LOSS_WEIGHT_KEYS)}"
                problems.append(f"loss_weights has unknown key {key!r}{hint}")
            elif not isinstance(weight, int | float) or weight < 0:
                problems.append(f"loss_weights.{key} must be a number >= 0, got {weight!r}")
        if self.loss_weights and not any(self.loss_weights.get(key, 1.0) > 0 for key in LOSS_WEIGHT_KEYS):
            problems.append("loss_weights are all 0: nothing would be trained; give some kind a weight > 0")
        for key in self.balance:
            if key not in BALANCE_KEYS:
                close = difflib.get_close_matches(str(key), BALANCE_KEYS, n=1)
                hint = f"; did you mean {close[0]}?" if close else f"; use some of {list(BALANCE_KEYS)}"
                problems.append(f"balance has unknown type {key!r}{hint}")
        if self.row_lr_multiplier <= 0:
            problems.append(
                f"row_lr_multiplier must be > 0, got {self.row_lr_multiplier}; 1 trains the rows at learning_rate"
            )
        if self.relevance_rank < 0:
            problems.append(f"relevance_rank must be >= 0, got {self.relevance_rank}; 0 turns the ranking term off")
        if self.eval_steps < 0:
            problems.append(f"eval_steps must be >= 0, got {self.eval_steps}; 0 scores at each checkpoint")
        if not 0 <= self.eval_fraction < 1:
            problems.append(f"eval_fraction must be in [0, 1), got {self.eval_fraction}; use 0 for no held-out split")
        return problems


@dataclasses.dataclass
class TrainConfig:
    """``selfrag train``: a LoRA adapter (or, with ``method: full``, a whole fine-tuned model) that emits the
    reflection tokens itself."""

    model: str = help_field("Base model: a built-in name (smollm2-135m-instruct), a local directory, or a hub id.")
    records: Path = help_field("Trajectory records (JSONL, from `selfrag generate`).")
    output_dir: Path = help_field("Where the adapter, tokenizer, selfrag.json, metrics and checkpoints go.")
    eval_records: Path | None = help_field(
        "Held-out records for the judgement evaluation (JSONL from `selfrag generate split=test` with "
        "easy/hard/support negatives): relevance and support AUROC with intervals, per-type accuracy and "
        "confusion matrices, during and after training. null: no judgement evaluation.",
        default=None,
    )
    judgement_items: int = help_field(
        "Questions scored per judgement evaluation after training (each gives one item per class); "
        "evaluations during training use a third of them.",
        default=300,
    )
    form: Literal["selfrag", "rag"] = help_field(
        "What the model learns from the records. 'selfrag': the trajectories with their reflection tokens. 'rag': the "
        "fine-tuned RAG baseline (the paper's 'FT + retrieval' row): the same records with the reflection tokens "
        "stripped, one example per question -- the plain-RAG prompt over its passages, its answer (or the abstain "
        "sentence) as the target; `selfrag eval` compares it as mode ft_rag (ft_rag_model=DIR). Train both with the "
        "same base, records, steps and seed.",
        default="selfrag",
    )
    tokens: TokensConfig = help_field("Reflection token set-up.", default_factory=TokensConfig)
    prompt_template: Literal["auto", "chat", "paper"] = help_field(
        "Prompt format: 'auto' uses the model's chat template when it has one, else the paper's.", default="auto"
    )
    method: Literal["lora", "full"] = help_field(
        "'lora': a LoRA adapter on the frozen base (output_dir holds the adapter; `selfrag export` merges it). "
        "'full': every weight trains, the reflection rows included, and output_dir holds a whole model "
        "(selfrag.json kind merged) that the engines and vLLM load as it stands; lora.* and peft are not used. "
        "135M fits a CPU (~2 GB with AdamW); a 7-8B base needs an FSDP or ZeRO-3 accelerate config.",
        default="lora",
    )
    lora: LoraOptions = help_field("LoRA settings (method lora).", default_factory=LoraOptions)
    training: TrainingOptions = help_field("Optimisation settings.", default_factory=TrainingOptions)
    trl: dict[str, Any] = help_field(
        "Extra trl.SFTConfig options, passed through (e.g. {bf16: true, warmup_steps: 0.03}).", default_factory=dict
    )
    peft: dict[str, Any] = help_field(
        "Extra peft.LoraConfig options, passed through (e.g. {use_rslora: true}).", default_factory=dict
    )
    quantization: dict[str, Any] = help_field(
        "QLoRA: transformers.BitsAndBytesConfig options for loading the base (e.g. {load_in_4bit: true, "
        "bnb_4bit_quant_type: nf4, bnb_4bit_compute_dtype: bfloat16}); empty loads it unquantised. Needs a GPU "
        "and bitsandbytes.",
        default_factory=dict,
    )
    random_init: bool = help_field(
        "Build the base from its config.json with seeded random weights (training.seed) instead of loading weights: "
        "for checking speed, memory and the machinery at a model's real size where no weights can be downloaded "
        "(model=configs/models/llama-3.1-8b: the shape without weights). What such a model learns means nothing. "
        "Never implied: a directory without weights is refused unless this is true.",
        default=False,
    )
    dtype: Literal["float32", "bfloat16", "float16"] = help_field(
        "dtype the base model is loaded in: float32 on CPU; bfloat16 for 7-8B models on GPUs (LoRA weights are "
        "trained in fp32 by PEFT either way).",
        default="float32",
    )
    restart: bool = help_field(
        "Start over when output_dir holds a run with different settings or records (its outputs are deleted). "
        "Without it such a rerun is refused with the list of differences; the same settings resume. "
        "The same key as selfrag generate's.",
        default=False,
    )

    def validate(self) -> list[str]:
        # Keys and value types against the real dataclasses (check_options), so a wrong type fails before a model loads.
        problems = check_options("trl", self.trl, _library_class("trl", "SFTConfig"), TRL_OWNED)
        problems += check_options("peft", self.peft, _library_class("peft", "LoraConfig"), PEFT_OWNED)
        if self.quantization:  # BitsAndBytesConfig is not a dataclass: its keys are checked against __init__
            problems += _check_pass_through(
                "quantization", self.quantization, _init_names("transformers", "BitsAndBytesConfig"), {}
            )
        if self.method == "full" and self.quantization:
            problems.append("method=full trains every weight and needs an unquantised base; quantization (QLoRA) "
                            "is for method=lora: remove quantization or set method=lora")
        if self.random_init and self.quantization:
            problems.append("random_init=true builds random unquantised weights; quantization (QLoRA) needs real "
                            "weights to quantise: remove quantization or set random_init=false")
        if self.method == "full" and self.lora.layers is not None:
            problems.append(f"lora.layers={self.lora.layers} chooses the blocks LoRA adapts; method=full trains every "
                            "weight: remove lora.layers or set method=lora")
        if self.tokens.strategy == "reserved" and self.lora.layers is not None:
            problems.append(f"lora.layers={self.lora.layers} detaches the reflection rows' input side, where "
                            "tokens.strategy=reserved trains them; set tokens.strategy=add or remove lora.layers")
        if self.method == "full" and self.peft:
            problems.append(f"peft options ({', '.join(sorted(self.peft))}) apply to method=lora; remove them or "
                            "set method=lora")
        if self.judgement_items < 1:
            problems.append(f"judgement_items must be >= 1, got {self.judgement_items}")
        scheduler = self.trl.get("lr_scheduler_kwargs")
        if isinstance(scheduler, str):  # transformers also takes the JSON text of a mapping
            try:
                scheduler = json.loads(scheduler)
            except ValueError:
                scheduler = None
            if not isinstance(scheduler, dict):
                problems.append(f"trl.lr_scheduler_kwargs: expected a mapping (or its JSON text), got "
                                f"{self.trl['lr_scheduler_kwargs']!r}; e.g. trl.lr_scheduler_kwargs.num_decay_steps=30")
        decay = scheduler.get("num_decay_steps") if isinstance(scheduler, dict) else None
        if decay is not None and (isinstance(decay, bool) or not isinstance(decay, int | float)):
            problems.append(f"trl.lr_scheduler_kwargs.num_decay_steps: expected a step count or a ratio in (0, 1) of "
                            f"training.max_steps, got {decay!r}")
        elif isinstance(decay, float) and not 0 < decay < 1:
            problems.append(f"trl.lr_scheduler_kwargs.num_decay_steps: expected a step count or a ratio in (0, 1) of "
                            f"training.max_steps, got {decay}")
        elif isinstance(decay, float) and self.training.max_steps <= 0:
            problems.append(f"trl.lr_scheduler_kwargs.num_decay_steps={decay} is a ratio of training.max_steps, which "
                            "is not set (epochs decide the length); give the decay in steps instead")
        return problems


def _library_class(module: str, name: str) -> type:
    import importlib

    return typing.cast(type, getattr(importlib.import_module(module), name))


def _field_names(module: str, name: str) -> set[str]:
    import importlib

    cls = getattr(importlib.import_module(module), name)
    return {spec.name for spec in dataclasses.fields(cls) if spec.init}


def _init_names(module: str, name: str) -> set[str]:
    import importlib
    import inspect

    cls = getattr(importlib.import_module(module), name)
    return {p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")}


def _check_pass_through(prefix: str, options: dict[str, Any], known: set[str], owned: dict[str, str]) -> list[str]:
    problems = []
    for key in options:
        if key in owned:
            problems.append(f"{prefix}.{key} is set by this recipe; set {owned[key]} instead")
        elif key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"; did you mean {prefix}.{close[0]}?" if close else ""
            problems.append(f"unknown {prefix} option {key!r}{hint}")
    return problems
