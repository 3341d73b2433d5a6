"""Long form's partial answers (beams) and the rules that read them; the search itself is :mod:`.longform`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from selfrag import reflection as rf
from selfrag.reflection import ReflectionIds
from selfrag.trajectory import Passage, lex_ids, parse_trajectory

from . import policy
from .answer import AnswerSegment, Candidate
from .config import InferenceConfig
from .trace import BeamSummary, CandidateScore


@dataclass
class Counter:
    """A long-form answer's engine calls and generated tokens."""

    engine_calls: int = 0
    generated_tokens: int = 0


@dataclass
class Beam:
    """One partial answer: its ids after the prompt, shipped sentences, evidence in context, score."""

    ids: tuple[int, ...] = ()
    segments: list[AnswerSegment] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # passage ids in context
    current: Passage | None = None  # the passage [Continue to Use Evidence] keeps
    score: float = 0.0
    retrievals: int = 0
    written: int = 0  # segments generated (shipped or not)
    steps: int = 0  # decodes along this beam (guards against a model that never writes text)
    done: str | None = None  # why it ended (None: still going)
    reasons: list[str] = field(default_factory=list)

    def child(self, ids: tuple[int, ...]) -> Beam:
        return Beam(
            ids,
            list(self.segments),
            list(self.evidence),
            self.current,
            self.score,
            self.retrievals,
            self.written,
            self.steps,
            None,
            list(self.reasons),
        )


def segment_verdict(score: CandidateScore, config: InferenceConfig) -> tuple[bool, str]:
    """Whether a long-form segment is supported, and why (its passage judged irrelevant, no support verdict, no
    support, or a support score below ``support_bound`` make it unsupported)."""
    if score.relevance_token == rf.IRRELEVANT:
        return False, f"the model judged the passage {rf.IRRELEVANT}"
    if score.support_token is None:
        return False, "the segment has no support verdict"
    if score.support_token == rf.NO_SUPPORT:
        return False, f"the model judged the segment {rf.NO_SUPPORT}"
    bound = config.support_floor
    if bound > 0 and (score.support is None or score.support < bound):
        return False, f"support score {score.support} is below support_bound {bound}"
    return True, f"the model judged the segment {score.support_token}"


def beam_candidate(beam: Beam, ids: ReflectionIds, tokenizer: Any) -> Candidate:
    """A finished beam as a candidate of the answer (its whole trajectory; no passage or score of its own)."""
    pieces = lex_ids(beam.ids, ids, lambda run: tokenizer.decode(run, skip_special_tokens=False))
    trajectory = parse_trajectory(pieces)
    return Candidate(
        passage=None,
        trajectory="".join(content for content, _ in pieces),
        answer=policy.join_segments(beam.segments),
        well_formed=trajectory.well_formed,
        problems=trajectory.problems,
        score=None,
        finish_reason=beam.done or "",
        parsed=trajectory,
    )


def common_prefix(lists: list[list[AnswerSegment]]) -> list[AnswerSegment]:
    prefix: list[AnswerSegment] = []
    for items in zip(*lists, strict=False):
        if any(item is not items[0] for item in items):
            break
        prefix.append(items[0])
    return prefix


def last_text(beam: Beam | None) -> str:
    return beam.segments[-1].text if beam is not None and beam.segments else ""


def describe(beam: Beam) -> BeamSummary:
    """The beam as the trace names it."""
    return BeamSummary(beam.score, len(beam.segments), tuple(beam.evidence), beam.done)
