"""What the runtime returns: :class:`Answer` (the user's view plus what evaluation needs) and :class:`Candidate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from selfrag.trajectory import Passage, Trajectory

from .trace import CandidateScore, TraceEntry


@dataclass(frozen=True)
class Candidate:
    """One decoded continuation: with a passage (retrieval path) or without (``passage`` None).

    ``trajectory`` is the text after the prompt, reflection tokens and the passage included;
    ``answer`` the text with tokens and passages removed; ``score`` is None on the no-retrieval path.
    """

    passage: Passage | None
    trajectory: str
    answer: str
    well_formed: bool
    problems: tuple[str, ...]
    score: CandidateScore | None
    finish_reason: str
    truncated: str | None = None  # why the decode was cut (a [Retrieval]/<paragraph> the short form does not follow)
    pruned: bool = False  # stopped after its relevance token (early branch pruning)
    round: int = 0  # retrieval round that produced it (0: the first)
    parsed: Trajectory | None = None  # the segments, parsed from token ids (never by re-lexing text)
    generated: str = ""  # what the model wrote after the passage, special tokens kept (the raw decode)
    retried: str | None = None  # the first decode's raw text, where it had no answer text and was decoded again

    def to_json(self) -> dict[str, Any]:
        return {
            "truncated": self.truncated,
            "pruned": self.pruned,
            "round": self.round,
            "passage_id": None if self.passage is None else self.passage.id,
            "trajectory": self.trajectory,
            "answer": self.answer,
            "well_formed": self.well_formed,
            "problems": list(self.problems),
            "score": None if self.score is None else self.score.to_json(),
            "finish_reason": self.finish_reason,
            "generated": self.generated,
            "retried": self.retried,
        }


def shorten(text: str, limit: int = 160) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut), for traces and messages."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class AnswerSegment:
    """One sentence of the answer as shipped: its text, the passage it was generated from (None: written
    without evidence), the model's support verdict for it (None: no verdict) and the model's relevance verdict on
    that passage (``[Irrelevant]``: a flagged answer generated from a passage the model rejected; None: not
    recorded)."""

    text: str
    passage: Passage | None = None
    support: str | None = None
    relevance: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "passage_id": None if self.passage is None else self.passage.id,
            "support": self.support,
            "relevance": self.relevance,
        }


@dataclass(frozen=True)
class Answer:
    """The answer to one question, and the trace of every decision that produced it.

    The trace is a contract: it records what was done, and ``answer``/``abstained``/``low_confidence``
    reflect every verdict in it. ``trajectory`` is the chosen path's full text (prompt excluded,
    passage included); ``candidates`` every continuation decoded; ``chosen`` the index of the one
    used (None when none was). ``engine_calls`` and ``generated_tokens`` count this question's work.
    ``segments`` are the shipped sentences with their citations; ``reasons`` say why the answer is
    abstained or low-confidence (empty when it is neither).
    """

    question: str
    answer: str
    citations: tuple[Passage, ...]
    retrieved: bool
    abstained: bool
    low_confidence: bool
    trace: tuple[TraceEntry, ...]  # typed entries (:mod:`.trace`); ``to_json`` writes each one's ``to_dict()``
    trajectory: str
    candidates: tuple[Candidate, ...]
    chosen: int | None
    engine_calls: int
    generated_tokens: int
    segments: tuple[AnswerSegment, ...] = ()
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The user-facing answer: answer, citations, segments, retrieved, abstained, low_confidence, reasons, trace."""
        return {
            "answer": self.answer,
            "citations": [{"passage_id": p.id, "title": p.title, "text": p.text} for p in self.citations],
            "segments": [segment.to_json() for segment in self.segments],
            "retrieved": self.retrieved,
            "abstained": self.abstained,
            "low_confidence": self.low_confidence,
            "reasons": list(self.reasons),
            "trace": [entry.to_dict() for entry in self.trace],
        }
