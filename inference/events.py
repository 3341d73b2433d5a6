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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from selfrag.trajectory import Passage

from .answer import Answer
from .trace import TraceEntry


@dataclass(frozen=True)
class TraceEvent:
    """One decision, as it is appended to the answer's trace (the same typed entry; the server sends its
    ``to_dict()``)."""

    entry: TraceEntry


@dataclass(frozen=True)
class SegmentEvent:
    """Accepted answer text; ``passage`` is the evidence it was generated from (None without retrieval)."""

    text: str
    passage: Passage | None = None


@dataclass(frozen=True)
class CitationEvent:
    """A passage the answer cites, sent once, before the segments that use it are final; ``relevance`` is the model's
    verdict on it where one is recorded (``[Irrelevant]``: a flagged answer's text came from a passage it rejected)."""

    passage: Passage
    relevance: str | None = None


@dataclass(frozen=True)
class FinalEvent:
    """The complete answer, with its flags (abstained, low_confidence) and full trace."""

    answer: Answer


StreamEvent = TraceEvent | SegmentEvent | CitationEvent | FinalEvent


def relevance_of(answer: Answer) -> dict[str, str]:
    """The model's relevance verdict on each cited passage, where the answer's segments record one."""
    verdicts: dict[str, str] = {}
    for segment in answer.segments:
        if segment.passage is not None and segment.relevance is not None:
            verdicts.setdefault(segment.passage.id, segment.relevance)
    return verdicts


def final_events(answer: Answer, trace: Sequence[TraceEntry], closed_set: bool = False) -> Iterator[StreamEvent]:
    """The events after the last phase: the trace entries not sent yet, the citations, the text, the final answer.

    The text goes out segment by segment (each with its passage), so the deltas concatenate to ``answer.answer``;
    a closed-set answer is the chosen label, sent whole.
    """
    for entry in trace:
        yield TraceEvent(entry)
    for passage in answer.citations:
        yield CitationEvent(passage, relevance_of(answer).get(passage.id))
    if answer.segments and not closed_set:
        for index, segment in enumerate(answer.segments):
            yield SegmentEvent(segment.text if index == 0 else " " + segment.text, segment.passage)
    elif answer.answer:
        yield SegmentEvent(answer.answer, answer.citations[0] if answer.citations else None)
    yield FinalEvent(answer)
