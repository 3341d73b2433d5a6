"""Answers and stream events in OpenAI's shapes, plus the ``selfrag`` extension.

A non-streamed answer is one ``chat.completion`` with ``selfrag`` beside ``choices``. A stream is a list of
``chat.completion.chunk`` objects: a role chunk, then one chunk per runtime event as the runtime yields it
(:mod:`selfrag.inference.events`): an extension chunk (``choices: []``, ``selfrag.type`` ``trace`` or
``citation``) per decision and cited passage; a content delta per accepted segment; a final chunk with
``finish_reason`` and the whole extension (``selfrag.type`` ``final``); optionally a usage chunk. Extension chunks
keep the chunk shape so every OpenAI client parses them.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

from selfrag.inference.answer import Answer
from selfrag.inference.events import CitationEvent, SegmentEvent, StreamEvent, TraceEvent, relevance_of
from selfrag.trajectory import Passage


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def segments(answer: Answer) -> list[tuple[str, Passage | None]]:
    """Accepted answer text with the passage each piece came from (the short form has one piece)."""
    explicit = getattr(answer, "segments", None)  # a runtime that tracks segments per passage
    if explicit:
        return [(segment.text, getattr(segment, "passage", None)) for segment in explicit]
    if not answer.answer:
        return []
    passage = answer.citations[0] if answer.citations and not answer.abstained else None
    return [(answer.answer, passage)]


def extension(answer: Answer) -> dict[str, Any]:
    """The ``selfrag`` object: citations with the sentences they support (and the model's relevance verdict on each
    passage), the flags with every reason behind them (``Answer.reasons``), the trace."""
    sentences: dict[str, list[str]] = {}
    for text, passage in segments(answer):
        if passage is not None:
            sentences.setdefault(passage.id, []).append(text)
    relevance = relevance_of(answer)
    return {
        "citations": [
            {**citation(passage, relevance.get(passage.id)), "sentences": sentences.get(passage.id, [])}
            for passage in answer.citations
        ],
        "retrieved": answer.retrieved,
        "abstained": answer.abstained,
        "low_confidence": answer.low_confidence,
        "reasons": list(answer.reasons),
        "trace": [clean(entry.to_dict()) for entry in answer.trace],
        "engine_calls": answer.engine_calls,
        "generated_tokens": answer.generated_tokens,
    }


def citation(passage: Passage, relevance: str | None = None) -> dict[str, Any]:
    return {"passage_id": passage.id, "title": passage.title, "text": passage.text, "relevance": relevance}


def finish_reason(answer: Answer) -> str:
    chosen = answer.candidates[answer.chosen] if answer.chosen is not None and answer.candidates else None
    return "length" if chosen is not None and chosen.finish_reason == "length" and not answer.abstained else "stop"


def completion(answer: Answer, model: str, prompt_tokens: int) -> dict[str, Any]:
    return {
        "id": completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": answer.answer},
            "finish_reason": finish_reason(answer),
            "logprobs": None,
        }],
        "usage": usage(answer, prompt_tokens),
        "selfrag": extension(answer),
    }


def usage(answer: Answer, prompt_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": answer.generated_tokens,
        "total_tokens": prompt_tokens + answer.generated_tokens,
    }


class ChunkWriter:
    """Builds the chunks of one stream (same id, created and model on every chunk)."""

    def __init__(self, model: str) -> None:
        self.id, self.created, self.model = completion_id(), int(time.time()), model

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": choices, **extra,
        }

    def role(self) -> dict[str, Any]:
        return self.chunk([_delta({"role": "assistant", "content": ""})])

    def event(self, event: StreamEvent) -> dict[str, Any]:
        if isinstance(event, TraceEvent):
            return self.chunk([], selfrag={"type": "trace", "step": clean(event.entry.to_dict())})
        if isinstance(event, CitationEvent):
            return self.chunk([], selfrag={"type": "citation", "citation": citation(event.passage, event.relevance)})
        if isinstance(event, SegmentEvent):
            passage_id = event.passage.id if event.passage is not None else None
            return self.chunk([_delta({"content": event.text})], selfrag={"type": "segment", "passage_id": passage_id})
        answer = event.answer
        return self.chunk([_delta({}, finish_reason(answer))], selfrag={"type": "final", **extension(answer)})

    def usage(self, answer: Answer, prompt_tokens: int) -> dict[str, Any]:
        return self.chunk([], usage=usage(answer, prompt_tokens))


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}


def clean(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None (strict JSON has no NaN/Infinity), tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [clean(item) for item in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)
