"""What the runtime returns: :class:`Answer` (the user's view plus what evaluation needs) and :class:`Candidate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from selfrag.trajectory import Passage

from .scoring import CandidateScore


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

    def to_json(self) -> dict[str, Any]:
        return {
            "passage_id": None if self.passage is None else self.passage.id,
            "trajectory": self.trajectory,
            "answer": self.answer,
            "well_formed": self.well_formed,
            "problems": list(self.problems),
            "score": None if self.score is None else self.score.to_json(),
            "finish_reason": self.finish_reason,
        }


@dataclass(frozen=True)
class Answer:
    """The answer to one question, and the trace of every decision that produced it.

    The trace is a contract: it records what was done, and ``answer``/``abstained``/``low_confidence``
    reflect every verdict in it. ``trajectory`` is the chosen path's full text (prompt excluded,
    passage included); ``candidates`` every continuation decoded; ``chosen`` the index of the one
    used (None when none was). ``engine_calls`` and ``generated_tokens`` count this question's work.
    """

    question: str
    answer: str
    citations: tuple[Passage, ...]
    retrieved: bool
    abstained: bool
    low_confidence: bool
    trace: tuple[dict[str, Any], ...]
    trajectory: str
    candidates: tuple[Candidate, ...]
    chosen: int | None
    engine_calls: int
    generated_tokens: int

    def to_json(self) -> dict[str, Any]:
        """The user-facing answer: answer, citations, retrieved, abstained, low_confidence, trace."""
        return {
            "answer": self.answer,
            "citations": [{"passage_id": p.id, "title": p.title, "text": p.text} for p in self.citations],
            "retrieved": self.retrieved,
            "abstained": self.abstained,
            "low_confidence": self.low_confidence,
            "trace": [dict(step) for step in self.trace],
        }
