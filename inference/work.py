"""One question's state between the batched phases of a short-form answer, and what its engine calls cost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from selfrag.errors import InputError
from selfrag.retrieval import Hit

from .answer import Candidate
from .engines.base import Engine, Generation, GenerationRequest, context_problem
from .trace import Outcome, TraceEntry


@dataclass
class Work:
    """One question's state between the batched phases (see :mod:`.rounds`)."""

    question: str
    query: str
    choices: tuple[str, ...] | None = None
    trace: list[TraceEntry] = field(default_factory=list)
    engine_calls: int = 0
    generated_tokens: int = 0
    retrieve: bool = False
    alone: Any = None  # the answer written without passages once decoded (the mode's own form: a Generation, a reply)
    round: int = 0
    seen: set[str] = field(default_factory=set)
    queries: list[str] = field(default_factory=list)  # every round's query, as searched (skip.repeated)
    read: set[tuple[str, str]] = field(default_factory=set)  # every passage's (title, text), normalised (skip.repeated)
    hits: list[Hit] = field(default_factory=list)  # this round's passages
    candidates: list[Candidate] = field(default_factory=list)  # every round's
    outcome: Outcome | None = None  # how its rounds ended (None: not yet, or answered without retrieving)


class Counts(Protocol):
    """Whatever an engine call is counted against (a question's work, a long-form answer)."""

    engine_calls: int
    generated_tokens: int


def call(engine: Engine, requests: list[GenerationRequest], owners: Sequence[Counts]) -> list[Generation]:
    """One engine call for ``requests``; ``owners[i]`` asked for ``requests[i]`` and is counted (one call each)."""
    if not requests:
        return []
    generations = engine.generate(requests)
    if len(generations) != len(requests):
        raise RuntimeError(f"{engine.name} returned {len(generations)} generations for {len(requests)}")
    for owner in {id(owner): owner for owner in owners}.values():
        owner.engine_calls += 1
    for owner, generation in zip(owners, generations, strict=True):  # owners[i] asked for requests[i]
        owner.generated_tokens += len(generation.token_ids)
    return generations


def check_question(
    question: str, prompt_tokens: int, max_tokens: int, limit: int | None, index: int | None = None
) -> None:
    """Refuse, before any decoding, a question that is empty or does not fit the model's context."""
    where = "" if index is None else f"question {index + 1}: "
    if not question.strip():
        raise InputError(f"{where}the question is empty; ask something")
    problem = context_problem(prompt_tokens, max_tokens, limit)
    if problem:
        raise InputError(where + problem)
