"""The trace: one typed, frozen entry per decision the runtime makes, and the outcome a question's rounds end with.

    for entry in answer.trace:
        if isinstance(entry, Skip):
            print(entry.rule, entry.reason)
    json.dumps([entry.to_dict() for entry in answer.trace])   # what ``--json``, the server and eval records carry

Every entry has a ``step`` (its kind, the JSON's discriminator), a ``chosen`` (what the step decided) and a
``reason``; the rest is the kind's own evidence. ``to_dict()`` is the JSON the product emits (docs/runtime.md, "The
trace"): an optional field left unset (None) is left out of it, a required one is written even when it is null.
Serialisation happens only at the edges (``Answer.to_json``, the server, evaluation records, the CLI's printout).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from .candidate import CandidateScore as CandidateScore  # trace entries hold it; callers import it from here

#: A JSON value as ``to_dict`` writes it.
Json = Any


def optional() -> Any:
    """A field that ``to_dict`` leaves out while it is None."""
    return field(default=None, metadata={"optional": True})


def json_value(value: object) -> Json:
    """``value`` as JSON: entries and what they hold by their ``to_dict``, tuples as lists."""
    if isinstance(value, _Entry | CriticRecord | BeamSummary | RankedCandidate):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [json_value(item) for item in value]
    if isinstance(value, Mapping):
        return {key: json_value(item) for key, item in value.items()}
    return value


class _Entry:
    """What every entry shares: its kind (``step``) and ``to_dict``."""

    __slots__ = ()
    step: ClassVar[str]

    def to_dict(self) -> dict[str, Json]:
        """The entry's JSON: ``step`` first, then its fields in order (optional ones only where set)."""
        out: dict[str, Json] = {"step": self.step}
        for item in fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if value is None and item.metadata.get("optional"):
                continue
            if "under" in item.metadata:  # a field the JSON nests in an object of its own
                out[item.metadata["under"]] = {item.name: json_value(value)}
            else:
                out[item.name] = json_value(value)
        return out


# -- what entries hold ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CriticRecord:
    """One prompted-critic verdict: every reply it took, the verdict used, and whether it was a retry or the
    fallback (every reply malformed)."""

    replies: tuple[str, ...]
    verdict: str
    retried: bool = False
    fallback: bool = False

    def to_dict(self) -> dict[str, Json]:
        out: dict[str, Json] = {"replies": list(self.replies), "verdict": self.verdict}
        if self.fallback:
            out["fallback"] = True
        else:
            out["retried"] = self.retried
        return out


@dataclass(frozen=True, slots=True)
class BeamSummary:
    """A long-form partial answer as the trace names it: its score, sentences, passages read and why it ended."""

    score: float
    segments: int
    evidence: tuple[str, ...]
    done: str | None

    def to_dict(self) -> dict[str, Json]:
        return {"score": self.score, "segments": self.segments, "evidence": list(self.evidence), "done": self.done}


@dataclass(frozen=True, slots=True, kw_only=True)
class RankedCandidate:
    """One candidate as a ``rank`` or ``vote`` entry shows it: its passage, its critique (flattened into the JSON:
    ``score``, ``components``, ``tokens``, ``missing``) and why it lost, where it did."""

    passage_id: str | None
    score: CandidateScore | None
    well_formed: bool
    problems: tuple[str, ...] = ()
    generated: str
    retried: str | None = None
    complete: bool
    pruned: bool = False
    truncated: str | None = None
    round: int = 0
    rejected: str | None = None

    def to_dict(self) -> dict[str, Json]:
        """Only what applies: ``problems`` where malformed, ``pruned``/``truncated``/``round`` where set."""
        shown = {
            **({} if self.score is None else self.score.to_json()), "well_formed": self.well_formed,
            "problems": None if self.well_formed else list(self.problems), "generated": self.generated,
            "retried": self.retried, "complete": self.complete, "pruned": self.pruned or None,
            "truncated": self.truncated or None, "round": self.round or None, "rejected": self.rejected,
        }
        return {"passage_id": self.passage_id} | {key: value for key, value in shown.items() if value is not None}


# -- the entries, in the order a question meets them ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Decide(_Entry):
    """Retrieve or not: the model's ``p_retrieve`` against the threshold (adaptive), the critic's verdict, or the
    fixed mode. Long form decides once per segment (``segment``)."""
    step: ClassVar[str] = "decide"
    segment: int | None = optional()
    mode: str | None = optional()
    #: the retrieve tokens' probabilities (adaptive: retrieval, no_retrieval, p_retrieve; long form: p_retrieve);
    #: null where nothing was decoded (a fixed mode, the critic)
    probabilities: Mapping[str, float | None] | None = None
    threshold: float | None = optional()
    first_token: str | None = optional()
    critic: CriticRecord | None = optional()
    chosen: str
    reason: str
    discarded: str | None = optional()
    reused: str | None = optional()


@dataclass(frozen=True, slots=True, kw_only=True)
class Retrieve(_Entry):
    """One search: the query, the passages kept (ids, and their scores in short form), and those left out because
    their text repeats one already read (skip.repeated)."""
    step: ClassVar[str] = "retrieve"
    segment: int | None = optional()
    round: int
    query: str
    chosen: tuple[str, ...]
    scores: tuple[float, ...] | None = optional()
    reason: str
    repeated: tuple[str, ...] | None = optional()


SkipRule = Literal["repeated_query", "repeated_passages", "relevance_gap", "unpaid_rounds"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Skip(_Entry):
    """Work not worth its decode (``skip.*``): a round not run (``chosen`` ``give_up``) or, for ``relevance_gap``,
    the round's branches stopped at their relevance verdicts (``chosen`` the passage ids stopped)."""
    step: ClassVar[str] = "skip"
    round: int
    rule: SkipRule
    chosen: str | tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Relevance(_Entry):
    """The model's relevance verdict per passage, read at ``relevance_threshold`` (``overridden``: where that
    differs from the token the model generated)."""
    step: ClassVar[str] = "relevance"
    relevance_threshold: float
    relevance: Mapping[str, float | None]
    chosen: Mapping[str, str | None]
    generated: Mapping[str, str | None]
    overridden: tuple[str, ...]
    reason: str
    round: int | None = optional()
    segment: int | None = optional()


@dataclass(frozen=True, slots=True, kw_only=True)
class CriticRelevance(_Entry):
    """The prompted critic's relevance verdict per passage (``critic``) and the passages answered from."""
    step: ClassVar[str] = "relevance"
    round: int
    critic: Mapping[str, CriticRecord]
    chosen: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Prune(_Entry):
    """The branches stopped after their relevance token (``chosen``), with every branch's relevance score."""
    step: ClassVar[str] = "prune"
    segment: int | None = optional()
    round: int | None = optional()
    relevance_bound: float | None = optional()
    margin: float | None = optional()
    relevance: Mapping[str, float | None]
    chosen: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Together(_Entry):
    """``read=together``: the passages judged relevant read in one paragraph and answered once."""
    step: ClassVar[str] = "together"
    round: int
    chosen: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry(_Entry):
    """Branches that judged their passage relevant and wrote no text, decoded once more from ``[Relevant]``."""
    step: ClassVar[str] = "retry"
    round: int
    chosen: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Critique(_Entry):
    """The prompted critic's support and utility verdicts on one answer (``chosen``: relevance, support, utility)."""
    step: ClassVar[str] = "critique"
    round: int
    passage_id: str
    critic: Mapping[str, CriticRecord]
    chosen: tuple[str, str, str]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Rank(_Entry):
    """The round's candidates ranked by weighted score: the best one's passage is ``chosen``; ``tie`` lists a tie
    broken by retrieval order; ``no_match``, on a closed-set question, the candidates that matched no choice."""
    step: ClassVar[str] = "rank"
    weights: Mapping[str, float]
    candidates: tuple[RankedCandidate, ...]
    chosen: str | None
    reason: str
    tie: tuple[str | None, ...] | None = optional()
    no_match: tuple[str | None, ...] | None = optional()
    round: int | None = optional()


@dataclass(frozen=True, slots=True, kw_only=True)
class Vote(_Entry):
    """A closed-set round: the choice with the highest summed score wins (``answer``); ``chosen`` is the passage of
    its best voter."""
    step: ClassVar[str] = "vote"
    choices: tuple[str, ...]
    totals: Mapping[str, float]
    voters: Mapping[str, tuple[str | None, ...]]
    no_match: tuple[str | None, ...]
    candidates: tuple[RankedCandidate, ...]
    chosen: str | None
    answer: str
    reason: str
    round: int | None = optional()


@dataclass(frozen=True, slots=True, kw_only=True)
class ChoiceMatch(_Entry):
    """A closed-set answer written without passages: the choice it matches (None: none)."""
    step: ClassVar[str] = "vote"
    answer: str | None
    chosen: str | None
    reason: str


SupportAction = Literal["accept", "answer_without_retrieval", "re-retrieve", "rounds exhausted", "abstain", "flag"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Support(_Entry):
    """The best candidate's support verdict and what follows from it (``chosen``): accept, re-retrieve (with the
    rewritten ``query``), answer without retrieval, or after the last round abstain / flag (``why``)."""
    step: ClassVar[str] = "support"
    round: int
    passage_id: str | None
    verdict: str | None
    relevance_verdict: str | None
    support: float | None = field(metadata={"under": "probabilities"})  # written as ``probabilities: {"support": …}``
    support_bound: float
    chosen: SupportAction
    reason: str
    why: str | None = optional()
    query: str | None = optional()


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentSupport(_Entry):
    """Long form: whether a retrieval step's branches are supported, and what follows (``chosen``: re-retrieve with
    ``query``, answer without retrieval, or on_unsupported)."""
    step: ClassVar[str] = "support"
    segment: int
    round: int
    chosen: str
    reason: str
    why: str | None = optional()
    query: str | None = optional()


@dataclass(frozen=True, slots=True, kw_only=True)
class Generate(_Entry):
    """The answer written without passages: its shape, its text (shortened), and why it abstains where it has no
    text (``abstain``). ``counts`` (a mode's tally, e.g. ``critic_calls``) are written as fields of their own."""
    step: ClassVar[str] = "generate"
    chosen: Literal["answer_without_retrieval"] = "answer_without_retrieval"
    reason: str
    well_formed: bool
    problems: tuple[str, ...]
    generated: str
    counts: Mapping[str, int] = field(default_factory=dict)
    truncated: str | None = optional()
    abstain: str | None = optional()

    def to_dict(self) -> dict[str, Json]:
        return _flatten_counts(_Entry.to_dict(self))


@dataclass(frozen=True, slots=True, kw_only=True)
class Length(_Entry):
    """``max_tokens`` cut the answer: it ships flagged."""
    step: ClassVar[str] = "length"
    chosen: Literal["flag"] = "flag"
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Malformed(_Entry):
    """The answer without passages has reflection tokens out of place: it ships flagged."""
    step: ClassVar[str] = "malformed"
    chosen: Literal["flag"] = "flag"
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Partial(_Entry):
    """``on_partial`` rewrote or dropped partially supported sentences (``chosen``: the setting applied)."""
    step: ClassVar[str] = "partial"
    chosen: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Abstain(_Entry):
    """No sentence is left to ship: the answer abstains."""
    step: ClassVar[str] = "abstain"
    chosen: Literal["abstain"] = "abstain"
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BeamStep(_Entry):
    """Long form: the partial answers kept (``chosen``) and dropped after one step of the beam search."""
    step: ClassVar[str] = "beam"
    chosen: tuple[BeamSummary, ...]
    dropped: tuple[BeamSummary, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish(_Entry):
    """The closing entry: the outcome shipped (short form, with a mode's ``counts``) or the best beam (long form)."""
    step: ClassVar[str] = "finish"
    chosen: str | BeamSummary
    counts: Mapping[str, int] = field(default_factory=dict)
    reason: str

    def to_dict(self) -> dict[str, Json]:
        out = _flatten_counts(_Entry.to_dict(self))
        out["reason"] = out.pop("reason")  # after the counts, which it spells out
        return out


def _flatten_counts(out: dict[str, Json]) -> dict[str, Json]:
    counts = out.pop("counts")
    items = list(out.items())
    at = next((i for i, (key, _) in enumerate(items) if key in ("truncated", "abstain")), len(items))
    return dict(items[:at] + list(counts.items()) + items[at:])


TraceEntry = (
    Decide | Retrieve | Skip | Relevance | CriticRelevance | Prune | Together | Retry | Critique | Rank | Vote
    | ChoiceMatch | Support | SegmentSupport | Generate | Length | Malformed | Partial | Abstain | BeamStep | Finish
)
#: every entry kind, in the order docs/runtime.md lists them
ENTRY_TYPES: tuple[type[_Entry], ...] = (
    Decide, Retrieve, Skip, Relevance, CriticRelevance, Prune, Together, Retry, Critique, Rank, Vote, ChoiceMatch,
    Support, SegmentSupport, Generate, Length, Malformed, Partial, Abstain, BeamStep, Finish,
)

OutcomeKind = Literal["accept", "abstain", "flag", "no_retrieval"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a question's rounds ended: ``kind`` (accept the best candidate, abstain, flag it, or answer without the
    passages, all judged irrelevant), ``best`` (the index of that candidate in the work's candidates) and why."""

    kind: OutcomeKind
    best: int
    reason: str
