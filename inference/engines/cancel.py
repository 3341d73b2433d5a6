"""Work whose client has gone: the server says which requests nobody waits for, an engine drops them between decode
steps.

    with abandon_when(lambda requests: [request.prompt_ids[:n] in gone for request in requests]):
        engine.generate(requests)        # the hf engine asks before every decode step after the first

The check is a context variable, set by the caller in the thread that calls the engine (the server's engine
thread), so the Self-RAG runtime between them needs no parameter for it and engines that never ask (vllm, openai,
scripted) are unchanged. An abandoned request still returns a :class:`~selfrag.inference.engines.Generation` (the
ids decoded so far, ``finish_reason`` ``length``), so the caller's bookkeeping for the requests that remain holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from .base import GenerationRequest

AbandonCheck = Callable[[Sequence[GenerationRequest]], Sequence[bool]]

_CHECK: ContextVar[AbandonCheck | None] = ContextVar("selfrag_abandon_check", default=None)


@contextmanager
def abandon_when(check: AbandonCheck) -> Iterator[None]:
    """Within this block, ``check(requests)`` says per request whether nobody waits for it any more."""
    token = _CHECK.set(check)
    try:
        yield
    finally:
        _CHECK.reset(token)


def abandoned(requests: Sequence[GenerationRequest]) -> list[bool]:
    """Per request: True when the caller said nobody waits for it (all False outside :func:`abandon_when`)."""
    check = _CHECK.get()
    if check is None:
        return [False] * len(requests)
    flags = [bool(flag) for flag in check(requests)]
    if len(flags) != len(requests):
        raise ValueError(f"the abandon check returned {len(flags)} flags for {len(requests)} requests")
    return flags
