"""One retry policy for every outbound HTTP call: which failures retry, Retry-After, back-off with full jitter, capped.

    policy = RetryPolicy(max_retries=4, backoff_s=0.5, backoff_max_s=30.0)
    result = call_with_retries(attempt, policy, random.Random(0))          # sync callers (the openai engine)
    result = await acall_with_retries(attempt, policy, random.Random(0))   # async callers (the HTTP teacher)

``attempt()`` makes one call and returns its result; it raises :class:`Retryable` for a failure another try may
cure (a status in :data:`RETRY_STATUS`, a timeout, a dropped connection, a malformed body), with the server's
``Retry-After`` when it sent one, and anything else to stop at once. When the tries run out,
:class:`RetriesExhausted` carries the last reason and the count; each caller words it as its own error.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: statuses worth another try: timeouts, conflicts, rate limits and server-side failures
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

#: called before each wait with (retry number from 1, the failure's reason, the seconds about to be slept)
OnRetry = Callable[[int, str, float], None]


class Retryable(Exception):
    """One attempt failed in a way another attempt may cure."""

    def __init__(self, reason: str, wait: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wait = wait  # seconds the server asked for (Retry-After), or None for the back-off


class RetriesExhausted(Exception):
    """Every attempt failed; ``reason`` is the last failure's."""

    def __init__(self, reason: str, attempts: int) -> None:
        super().__init__(f"failed after {attempts} attempts: {reason}")
        self.reason = reason
        self.attempts = attempts


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` tries after the first; the n-th wait is uniform in [0, min(backoff_max_s, backoff_s * 2**n)]
    (full jitter), or the server's Retry-After, never longer than ``backoff_max_s``."""

    max_retries: int
    backoff_s: float
    backoff_max_s: float

    def delay(self, retry: int, wait: float | None, rng: random.Random) -> float:
        if wait is not None:
            return min(wait, self.backoff_max_s)
        return rng.uniform(0.0, min(self.backoff_max_s, self.backoff_s * 2**retry))


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds form; HTTP dates fall back to the back-off)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds) if seconds == seconds else None  # NaN falls back too


class _Schedule:
    """The waits of one call: the next one after each failure, or :class:`RetriesExhausted` when none is left."""

    def __init__(self, policy: RetryPolicy, rng: random.Random, on_retry: OnRetry | None) -> None:
        self.policy, self.rng, self.on_retry = policy, rng, on_retry
        self.retries = 0

    def after(self, error: Retryable) -> float:
        if self.retries >= self.policy.max_retries:
            raise RetriesExhausted(error.reason, self.policy.max_retries + 1)
        delay = self.policy.delay(self.retries, error.wait, self.rng)
        self.retries += 1
        if self.on_retry is not None:
            self.on_retry(self.retries, error.reason, delay)
        return delay


def call_with_retries(
    attempt: Callable[[], T],
    policy: RetryPolicy,
    rng: random.Random,
    sleep: Callable[[float], object] = time.sleep,
    on_retry: OnRetry | None = None,
) -> T:
    """Run ``attempt`` until it returns, raises a non-:class:`Retryable` error, or the tries run out."""
    schedule = _Schedule(policy, rng, on_retry)
    while True:
        try:
            return attempt()
        except Retryable as error:
            delay = schedule.after(error)
        sleep(delay)


async def acall_with_retries(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    rng: random.Random,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    on_retry: OnRetry | None = None,
) -> T:
    """:func:`call_with_retries` for a coroutine: the same schedule, awaited sleeps."""
    schedule = _Schedule(policy, rng, on_retry)
    while True:
        try:
            return await attempt()
        except Retryable as error:
            delay = schedule.after(error)
        await sleep(delay)
