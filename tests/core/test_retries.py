"""The one retry policy (selfrag.retries) that the HTTP teacher and the openai engine both use."""

from __future__ import annotations

import asyncio
import random

import pytest

from selfrag.retries import RetriesExhausted, Retryable, RetryPolicy, acall_with_retries, call_with_retries, retry_after


def failing(outcomes: list[object]):
    """An attempt that raises or returns each outcome in turn, counting its calls."""
    calls: list[int] = []

    def attempt() -> object:
        calls.append(1)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return attempt, calls


def test_waits_are_full_jitter_doubling_capped_and_retry_after_wins() -> None:
    policy = RetryPolicy(max_retries=6, backoff_s=1.0, backoff_max_s=5.0)
    attempt, calls = failing([Retryable("429", wait=7.0), Retryable("500", wait=2.5)] + [Retryable("503")] * 4 + ["ok"])
    sleeps: list[float] = []
    retried: list[tuple[int, str]] = []
    def on_retry(retry: int, reason: str, _seconds: float) -> None:
        retried.append((retry, reason))

    result = call_with_retries(attempt, policy, random.Random(0), sleeps.append, on_retry)
    assert result == "ok" and len(calls) == 7
    assert sleeps[0] == 5.0  # Retry-After 7 s, capped at backoff_max_s
    assert sleeps[1] == 2.5  # Retry-After as given
    for retry, slept in zip(range(2, 6), sleeps[2:], strict=True):
        assert 0.0 <= slept <= min(5.0, 2**retry)
    assert retried[0] == (1, "429") and [n for n, _ in retried] == [1, 2, 3, 4, 5, 6]


def test_the_jitter_is_full_not_a_fixed_fraction() -> None:
    policy = RetryPolicy(max_retries=1, backoff_s=8.0, backoff_max_s=8.0)
    delays = [policy.delay(0, None, random.Random(seed)) for seed in range(200)]
    assert min(delays) < 1.0 and max(delays) > 7.0  # uniform over [0, 8], not 8 * (1 + 25%)


def test_tries_run_out_with_the_last_reason_and_permanent_errors_stop_at_once() -> None:
    attempt, calls = failing([Retryable("HTTP 500"), Retryable("HTTP 502"), Retryable("timeout")])
    with pytest.raises(RetriesExhausted, match="failed after 3 attempts: timeout") as error:
        call_with_retries(attempt, RetryPolicy(2, 0.0, 0.0), random.Random(0), lambda _s: None)
    assert error.value.attempts == 3 and len(calls) == 3
    attempt, calls = failing([Retryable("HTTP 500"), PermissionError("HTTP 401")])
    with pytest.raises(PermissionError):
        call_with_retries(attempt, RetryPolicy(5, 0.0, 0.0), random.Random(0), lambda _s: None)
    assert len(calls) == 2


def test_the_async_loop_follows_the_same_policy() -> None:
    outcomes: list[object] = [Retryable("HTTP 429", wait=3.0), Retryable("HTTP 500"), "ok"]
    sleeps: list[float] = []

    async def attempt() -> object:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    policy = RetryPolicy(max_retries=4, backoff_s=0.5, backoff_max_s=60.0)
    assert asyncio.run(acall_with_retries(attempt, policy, random.Random(1), sleep)) == "ok"
    assert sleeps[0] == 3.0 and 0.0 <= sleeps[1] <= 1.0


@pytest.mark.parametrize(("header", "seconds"), [("3", 3.0), ("0.5", 0.5), ("-2", 0.0), (None, None),
                                                 ("Wed, 21 Oct 2015 07:28:00 GMT", None), ("nan", None)])
def test_retry_after_header_forms(header: str | None, seconds: float | None) -> None:
    assert retry_after(header) == seconds
