"""What :meth:`selfrag.inference.runtime.SelfRAG.stream` yields: the contract between the runtime and the server.

    for event in rag.stream("Who wrote Hamlet?"):
        if isinstance(event, SegmentEvent):
            print(event.text, end="", flush=True)

Order: zero or more :class:`TraceEvent` / :class:`SegmentEvent` / :class:`CitationEvent` as decisions are
made and segments accepted, then exactly one :class:`FinalEvent`. A :class:`SegmentEvent` is sent only once
its verdict is final and is never retracted: the concatenation of every ``SegmentEvent.text`` equals
``FinalEvent.answer.answer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from selfrag.trajectory import Passage

from .answer import Answer


@dataclass(frozen=True)
class TraceEvent:
    """One decision, as it is appended to the answer's trace (same dict)."""

    entry: dict[str, Any]


@dataclass(frozen=True)
class SegmentEvent:
    """Accepted answer text; ``passage`` is the evidence it was generated from (None without retrieval)."""

    text: str
    passage: Passage | None = None


@dataclass(frozen=True)
class CitationEvent:
    """A passage the answer cites, sent once, before the segments that use it are final."""

    passage: Passage


@dataclass(frozen=True)
class FinalEvent:
    """The complete answer, with its flags (abstained, low_confidence) and full trace."""

    answer: Answer


StreamEvent = TraceEvent | SegmentEvent | CitationEvent | FinalEvent
