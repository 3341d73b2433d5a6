"""``concurrent_batches``: with a remote engine (a ``vllm serve`` tier batching every request in flight per decode
step) a request that arrives while another batch is in the engine goes to the engine at once; with an in-process
engine (hf, vllm) batches stay one at a time. The engine here is a scripted ``stream_many`` that holds each batch
until the test releases it (a unit test of the batching worker; the servers' own tests cover the real backends)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.inference.answer import Answer
from selfrag.inference.config import InferenceConfig
from selfrag.inference.events import FinalEvent, StreamEvent
from selfrag.inference.retrievers.spec import RetrieverConfig
from selfrag.inference.server.batcher import BatchWorker
from selfrag.inference.server.config import ServeConfig


def _answer(question: str) -> Answer:
    return Answer(question=question, answer=f"answer to {question}", citations=(), retrieved=False, abstained=False,
                  low_confidence=False, trace=(), trajectory="", candidates=(), chosen=None, engine_calls=1,
                  generated_tokens=1)


class HeldEngine:
    """Each batch records its questions on entry, then waits for its own release."""

    def __init__(self) -> None:
        self.entered: list[list[str]] = []
        self.release: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def stream_many(self, settings: InferenceConfig, questions: Sequence[str]) -> Iterator[tuple[int, StreamEvent]]:
        with self.lock:
            self.entered.append(list(questions))
        self.release.setdefault(questions[0], threading.Event()).wait(10)
        for index, question in enumerate(questions):
            yield index, FinalEvent(_answer(question))


async def _until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _second_batch_enters_while_the_first_is_held(concurrent: int) -> tuple[bool, list[list[str]]]:
    engine = HeldEngine()
    for question in ("first", "second"):
        engine.release[question] = threading.Event()
    worker = BatchWorker(engine.stream_many, max_queue=8, max_batch=4, batch_wait_s=0.0,
                         concurrent_batches=concurrent)
    await worker.start()
    first = worker.submit("first", InferenceConfig())
    await _until(lambda: engine.entered == [["first"]])
    second = worker.submit("second", InferenceConfig())
    await asyncio.sleep(0.3)  # the second batch's chance to reach the engine while the first is held
    entered_early = len(engine.entered) == 2
    assert worker.in_flight == (2 if entered_early else 1)
    engine.release["first"].set()
    engine.release["second"].set()
    answers = await asyncio.wait_for(asyncio.gather(first.future, second.future), 10)
    assert [a.answer for a in answers] == ["answer to first", "answer to second"]
    await worker.stop()
    assert worker.in_flight == 0
    return entered_early, engine.entered


def test_a_remote_engine_takes_a_request_while_another_batch_is_in_it() -> None:
    entered_early, entered = asyncio.run(_second_batch_enters_while_the_first_is_held(2))
    assert entered_early and entered == [["first"], ["second"]]


def test_an_in_process_engine_runs_one_batch_at_a_time() -> None:
    entered_early, entered = asyncio.run(_second_batch_enters_while_the_first_is_held(1))
    assert not entered_early and entered == [["first"], ["second"]]


def test_stop_answers_every_batch_in_flight() -> None:
    async def scenario() -> list[str]:
        engine = HeldEngine()
        worker = BatchWorker(engine.stream_many, max_queue=8, max_batch=1, batch_wait_s=0.0, concurrent_batches=3)
        await worker.start()
        jobs = [worker.submit(q, InferenceConfig()) for q in ("a", "b", "c")]
        await _until(lambda: len(engine.entered) == 3)  # all three in the engine at once
        stopping = asyncio.create_task(worker.stop())
        for question in ("a", "b", "c"):
            engine.release.setdefault(question, threading.Event()).set()
        await asyncio.wait_for(stopping, 10)
        return [job.future.result().answer for job in jobs]

    assert asyncio.run(scenario()) == ["answer to a", "answer to b", "answer to c"]


def test_the_default_follows_the_engine_and_threads_need_a_remote_one() -> None:
    corpus = RetrieverConfig(corpus="c.jsonl")
    assert ServeConfig(model="m", retriever=corpus).batches_at_once() == 1
    assert ServeConfig(model="m", retriever=corpus, inference=InferenceConfig(engine="openai")).batches_at_once() == 4
    with pytest.raises(ConfigError, match="concurrent_batches=2 needs inference.engine=openai: inference.engine=hf "
                                          "runs in this process"):
        load_config(ServeConfig, None, ["model=m", "retriever.corpus=c.jsonl", "concurrent_batches=2"])
    with pytest.raises(ConfigError, match="concurrent_batches must be at least 1, got 0"):
        load_config(ServeConfig, None, ["model=m", "retriever.corpus=c.jsonl", "inference.engine=openai",
                                        "concurrent_batches=0"])


def test_retry_after_counts_the_batches_that_drain_the_queue_at_once() -> None:
    async def scenario() -> tuple[int, int]:
        one = BatchWorker(HeldEngine().stream_many, max_queue=64, max_batch=16, batch_wait_s=0.0)
        four = BatchWorker(HeldEngine().stream_many, max_queue=64, max_batch=16, batch_wait_s=0.0,
                           concurrent_batches=4)
        for worker in (one, four):
            worker._seconds_per_job = 2.0  # measured: 2 s of engine time a job
            for _ in range(16):
                worker._waiting.append(object())  # type: ignore[arg-type]
        return one.retry_after_s(), four.retry_after_s()

    assert asyncio.run(scenario()) == (32, 8)
