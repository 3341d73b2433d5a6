"""The settings of ``selfrag rl``: GRPO on the reflection-token policy with retrieval in the loop.

    config = load_config(RLConfig, "configs/rl/smollm2-135m-cpu.yaml", ["training.max_steps=20"])

Every field is documented; ``trl`` keys pass through to ``trl.GRPOConfig`` and are checked against its real fields
when the config loads, so a typo fails before a model loads. The reward's terms and their weights are
:class:`RewardConfig` (see :mod:`selfrag.rl.reward`).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, ClassVar, Literal

from selfrag.config import at_least_one, check_options, help_field
from selfrag.errors import ConfigError
from selfrag.evaluation.config import JudgeConfig
from selfrag.inference.engines.options import EngineOptions, resolve_options
from selfrag.inference.retrievers.spec import RETRIEVER_KEYS, RetrieverConfig
from selfrag.training.config import LoraOptions

#: GRPOConfig fields this recipe sets from the typed config; setting them in ``trl`` is an error.
TRL_OWNED: dict[str, str] = {
    "output_dir": "output_dir",
    "learning_rate": "training.learning_rate",
    "max_steps": "training.max_steps",
    "per_device_train_batch_size": "training.questions_per_step x training.generations",
    "num_generations": "training.generations",
    "beta": "training.beta",
    "seed": "training.seed",
    "logging_steps": "training.logging_steps",
    "save_steps": "training.save_steps",
    "reward_weights": "reward.* (each term's weight)",
    "temperature": "rollout.temperature",
    "use_vllm": "rollout.engine (the rollouts decode through the runtime's engine: hf, or vllm serving the live LoRA)",
}


@dataclasses.dataclass
class RolloutConfig:
    """How a rollout decodes (the runtime's long form with one beam; see :mod:`selfrag.rl.rollout`)."""

    #: keys that were rollout settings once: what to write instead
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "top_k": "each [Retrieval] puts in one passage, the retriever's best not yet in context, whatever top_k said "
                 "(it never chose another; it was not passages per question as in eval); delete rollout.top_k",
    }

    mode: Literal["adaptive", "always"] = help_field(
        "adaptive: the model decides when to retrieve; always: every rollout starts with [Retrieval] and every "
        "[Retrieval] is followed (the runtime's mode: always)", "adaptive")
    depth: int = help_field("most retrieval rounds in one rollout (after that a [Retrieval] becomes [No Retrieval])", 2)
    max_segments: int = help_field("most sentences in one rollout", 3)
    segment_tokens: int = help_field("most new tokens per segment decode", 48)
    temperature: float = help_field("sampling temperature of the rollouts (> 0: GRPO compares sampled answers)", 1.0)
    merge_lora: bool = help_field(
        "fold the LoRA into the base weights while the rollouts decode (PEFT's merge_adapter, as TRL does before it "
        "syncs vLLM), and put the base weights back exactly after, from a copy taken once: the decode runs a plain "
        "model without the LoRA wrappers' extra kernels (benchmarks/rollout_profile.py measures it), at the memory of "
        "a second copy of the adapted weights (14 GB on the 8B shape). A quantised (QLoRA) base is never merged", True)
    engine: Literal["hf", "vllm", "auto"] = help_field(
        "what decodes the rollouts: hf (the policy itself, in the trainer's process); vllm (vLLM colocated: the "
        "starting adapter's base loaded once, the policy's LoRA saved and served as a new LoRARequest each step; "
        "needs a tokens.strategy=reserved adapter and vLLM installed); auto: vllm where vLLM imports, a GPU is there "
        "and the policy is a reserved adapter, else hf. The engine used is logged and in rewards.json", "hf")
    engine_options: dict[str, Any] = help_field(
        "with engine=vllm: the vLLM engine's options, spelled as selfrag's engine_options.* (max_lora_rank, "
        "max_model_len, dtype, vllm_args, ...). Here gpu_memory_utilization defaults to 0.3 (vLLM's weights and KV "
        "cache beside the trainer's) and max_loras to 1", default_factory=dict)

    #: what the rollouts' vLLM engine is given unless engine_options says otherwise: room for the trainer
    VLLM_DEFAULTS: ClassVar[dict[str, Any]] = {"gpu_memory_utilization": 0.3, "max_loras": 1}

    def vllm_options(self) -> EngineOptions:
        """The rollouts' vLLM engine options (:attr:`VLLM_DEFAULTS` under ``engine_options``); ConfigError if bad."""
        return resolve_options("vllm", None, {**self.VLLM_DEFAULTS, **self.engine_options})

    def validate(self) -> list[str]:
        problems = at_least_one(self, ("depth", "max_segments", "segment_tokens"))
        try:
            self.vllm_options()
        except ConfigError as error:
            # the loader puts "rollout." before each problem: make each start with the field it is about
            problems += [problem if problem.startswith("engine_options.") else f"engine_options: {problem}"
                         for problem in error.problems]
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0, got {self.temperature}; GRPO needs sampled rollouts, e.g. 1.0")
        return problems


@dataclasses.dataclass
class RewardJudgeConfig(JudgeConfig):
    """The support term's claim judge (:mod:`selfrag.evaluation.claims`): ``selfrag eval``'s judge section, spelled
    the same (``reward.judge.kind``, ``.model``, ``.threshold``), of the kinds that judge without the policy."""

    #: eval's other kinds, each refused with why and what to write instead
    REFUSED_VALUES: ClassVar[dict[str, dict[str, str]]] = {"kind": {
        "critic": "the critic is the policy itself, which would grade its own sentences; write reward.judge.kind="
                  "overlap (no model) or reward.judge.kind=nli with reward.judge.model=DIR",
        "llm": "a second generative model beside the policy is not loaded in selfrag rl; write reward.judge.kind="
               "overlap (no model) or reward.judge.kind=nli with reward.judge.model=DIR",
        "none": "the support term needs a judge; write reward.judge.kind=overlap, or reward.support=0 to drop the term",
    }}

    kind: Literal["overlap", "nli"] = help_field(  # type: ignore[assignment]  # eval's kinds, narrowed
        "overlap: content-word overlap >= judge.threshold (no model); nli: an NLI classifier's P(entailment) of the "
        "sentence given its passage (judge.model)", "overlap")


@dataclasses.dataclass
class RewardConfig:
    """The reward: a weighted sum of terms, each logged on its own (``rewards/<term>/mean``). A weight of 0 drops
    a term."""

    #: the judge's flat keys before it was a section (as in selfrag eval): what to write instead
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "judge_model": "write reward.judge.model=DIR (the judge is a section, as in selfrag eval: kind, model, "
                       "threshold)",
        "judge_threshold": "write reward.judge.threshold=0.5 (the judge is a section, as in selfrag eval: kind, "
                           "model, threshold)",
    }
    REFUSED_VALUES: ClassVar[dict[str, dict[str, str]]] = {"judge": {
        kind: f"the judge is a section, as in selfrag eval (kind, model, threshold); write reward.judge.kind={kind}"
        for kind in ("overlap", "nli")
    }}

    correct: float = help_field(
        "weight of correctness on answerable questions: the shipped answer holds a gold answer (correctness: "
        "contains) or its token F1 against the golds (correctness: f1); an abstention scores 0", 1.0)
    correctness: Literal["contains", "f1"] = help_field("how correctness is measured: contains or f1", "contains")
    abstain: float = help_field(
        "weight of abstention: +1 for abstaining on an unanswerable question, -1 for answering it, -1 for "
        "abstaining on an answerable one", 0.5)
    support: float = help_field(
        "weight of support: the share of shipped sentences the claim judge finds supported by the passage they "
        "came from (a sentence without a passage counts unsupported; an abstention scores 0)", 0.5)
    format: float = help_field("weight of well-formedness: -1 when the rollout breaks the grammar", 0.5)
    retrieval: float = help_field("weight of the cost per retrieval round: -1 per passage retrieved", 0.05)
    judge: RewardJudgeConfig = help_field(
        "the claim judge of the support term: selfrag eval's judge section (kind, model, threshold), overlap or nli",
        default_factory=RewardJudgeConfig)
    abstain_text: str = help_field("what counts as abstaining besides an empty answer", "The sources do not say.")

    def validate(self) -> list[str]:
        problems = []
        for name in ("correct", "abstain", "support", "format", "retrieval"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                problems.append(f"{name} must be a weight >= 0, got {value!r}; 0 drops the term")
        return problems


@dataclasses.dataclass
class RLTrainingOptions:
    """GRPO's optimisation: steps, questions per step, the group of rollouts per question, the KL coefficient."""

    learning_rate: float = help_field("AdamW learning rate of the LoRA weights.", 1e-4)
    max_steps: int = help_field("GRPO optimizer steps.", 50)
    questions_per_step: int = help_field("Questions per step; each is answered `generations` times.", 2)
    generations: int = help_field("Rollouts per question (GRPO's group: advantages are relative to its mean).", 4)
    beta: float = help_field("KL coefficient against the starting policy (0: no reference model is kept).", 0.0)
    seed: int = help_field("Seed of sampling, shuffling and LoRA initialisation.", 0)
    logging_steps: int = help_field("Log rewards per term every this many steps.", 1)
    save_steps: int = help_field("Write a resumable checkpoint every this many steps.", 10)

    def validate(self) -> list[str]:
        problems = at_least_one(self, ("max_steps", "questions_per_step", "logging_steps", "save_steps"))
        if self.generations < 2:
            problems.append(f"generations must be at least 2, got {self.generations}; GRPO compares a group's rollouts")
        if self.beta < 0:
            problems.append(f"beta must be >= 0, got {self.beta}")
        return problems


@dataclasses.dataclass
class RLConfig:
    """``selfrag rl``: GRPO on a trained Self-RAG model, rollouts with retrieval in the loop."""

    REMOVED_KEYS: ClassVar[dict[str, str]] = RETRIEVER_KEYS  # the spelling of other commands' past, refused alike
    #: settings a run recorded before they were renamed (the judge's flat keys) or removed: resumed as spelled now
    RENAMED_SETTINGS: ClassVar[dict[str, str | None]] = {
        "reward.judge": "reward.judge.kind", "reward.judge_model": "reward.judge.model",
        "reward.judge_threshold": "reward.judge.threshold", "rollout.top_k": None,
    }

    model: str = help_field(
        "The policy to start from: an adapter from `selfrag train` (its LoRA goes on training) or a merged model with "
        "the reflection tokens (`selfrag export --merge`, or a released checkpoint: a new LoRA is trained on it).")
    queries: Path = help_field(
        "Questions with gold answers: queries JSONL (question, answers, answerable; the format `selfrag generate` "
        "reads).")
    output_dir: Path = help_field("Where the adapter, selfrag.json, rewards and checkpoints go.")
    more_queries: list[Path] = help_field(
        "Further question files joined to queries, as a data recipe's more_queries: the other sources the adapter was "
        "trained on (the split, records and per_source select from all of them; ids unique across them).",
        default_factory=list)
    more_passages: list[Path] = help_field(
        "Further passage files joined to retriever.corpus, as a data recipe's more_passages: the passages of "
        "more_queries' questions, searched with the corpus in one in-memory index (ids unique across them).",
        default_factory=list)
    per_source: int | None = help_field(
        "At most N questions of each source (meta.source; a question without one counts as its file's): the first N "
        "in file order, source by source, before limit, so the largest source does not crowd out the others (null: "
        "every question, in file order).", None)
    records: Path | None = help_field(
        "Records from `selfrag generate`: only the questions they were made from (meta.query_id) are used; null: every "
        "question of `queries` the split selects.", None)
    split: str = help_field("meta.split of the questions to train on; all: every question.", "train")
    limit: int | None = help_field("The first N questions after the split (null: all).", None)
    retriever: RetrieverConfig = help_field(
        "Where passages come from (retriever.index for a prebuilt index, retriever.corpus for a small corpus).",
        default_factory=RetrieverConfig)
    rollout: RolloutConfig = help_field("How rollouts decode.", default_factory=RolloutConfig)
    reward: RewardConfig = help_field("The reward's terms and weights.", default_factory=RewardConfig)
    lora: LoraOptions = help_field("LoRA settings for a merged starting model (an adapter keeps its own).",
                                   default_factory=LoraOptions)
    training: RLTrainingOptions = help_field("Optimisation settings.", default_factory=RLTrainingOptions)
    trl: dict[str, Any] = help_field("Further trl.GRPOConfig options (e.g. epsilon, loss_type).", default_factory=dict)
    dtype: Literal["float32", "bfloat16", "float16"] = help_field(
        "dtype the policy's base weights are loaded in: float32 on CPU; bfloat16 for 7-8B models on GPUs (an 8B "
        "base is 32 GB in float32, 16 GB in bfloat16; the LoRA weights stay fp32 either way, as in selfrag train).",
        "float32")
    random_init: bool = help_field(
        "Build the policy's base from its config.json with seeded random weights (training.seed) instead of loading "
        "them: for checking speed, memory and the machinery at a model's real size where no weights can be "
        "downloaded (an adapter that selfrag train made with random_init=true). What it learns means nothing; never "
        "implied: a base without weights is refused unless this is true.", False)
    restart: bool = help_field(
        "Start over when output_dir holds a run with different settings or data; without it such a rerun is refused "
        "with the differences, and the same settings resume from the last checkpoint.", False)

    def validate(self) -> list[str]:
        problems = check_options("trl", self.trl, _grpo_config(), TRL_OWNED)
        if not self.retriever.is_set():
            problems.append("retriever: no passages; set retriever.index (a prebuilt index) or retriever.corpus")
        if self.lora.layers is not None:
            problems.append(f"lora.layers={self.lora.layers} is a selfrag train setting; selfrag rl adapts every "
                            "block of a merged model (an adapter keeps its own): remove lora.layers")
        if self.limit is not None and self.limit < 1:
            problems.append(f"limit must be at least 1 or null, got {self.limit}")
        if self.per_source is not None and self.per_source < 1:
            problems.append(f"per_source must be at least 1 or null, got {self.per_source}")
        if self.more_passages and self.retriever.corpus is None and self.retriever.is_set():
            problems.append("more_passages joins passage files to retriever.corpus, searched in memory; a prebuilt "
                            "index (retriever.index or retriever.url) holds what it was built from: build one index "
                            "of every passage file, or use retriever.corpus")
        return problems


def _grpo_config() -> type:
    return importlib.import_module("trl").GRPOConfig  # type: ignore[no-any-return]
