"""The bounded queue and the batching worker: concurrent requests share one ``answer_many`` engine call.

    worker = BatchWorker(backend.answer_many, backend.stream, max_queue=64, max_batch=16, batch_wait_s=0.01)
    await worker.start()
    job = worker.submit("Who wrote Hamlet?", settings)   # raises QueueFull when max_queue jobs wait
    answer = await job.future
    job = worker.submit("Who wrote Hamlet?", settings, stream=True)
    event = await job.events.get()                       # each event as the runtime yields it

One asyncio task takes the first waiting job, waits up to ``batch_wait_s`` for more (up to ``max_batch``),
groups them by their runtime settings and runs one ``answer_many`` per group in a single worker thread (the
engine is not shared between threads). A streaming job runs alone through ``stream(settings, question)`` in
that same thread; each event goes into the job's ``events`` queue as soon as the runtime yields it, and
``None`` follows the last one (then ``future`` holds the answer or the engine's error). A job whose client
went away is removed from the queue at once, so its slot is free for the next request; a batch already in
the engine is answered and dropped; a stream already in the engine stops at its next event.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from selfrag.config import to_dict
from selfrag.inference.answer import Answer
from selfrag.inference.config import InferenceConfig
from selfrag.inference.events import FinalEvent, StreamEvent

from .metrics import ServerMetrics

logger = logging.getLogger(__name__)

AnswerMany = Callable[[InferenceConfig, Sequence[str]], list[Answer]]
StreamOne = Callable[[InferenceConfig, str], Iterator[StreamEvent]]


class QueueFull(Exception):
    """The queue holds ``max_queue`` waiting jobs; the request is answered 429."""


@dataclass(eq=False)
class Job:
    question: str
    settings: InferenceConfig
    future: asyncio.Future[Answer]
    events: asyncio.Queue[StreamEvent | None] | None = None  # a streaming job's events; None ends them
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False


class BatchWorker:
    """See the module docstring."""

    def __init__(
        self,
        answer_many: AnswerMany,
        stream: StreamOne,
        max_queue: int,
        max_batch: int,
        batch_wait_s: float,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self._answer_many, self._stream = answer_many, stream
        self.max_queue, self.max_batch, self.batch_wait_s = max_queue, max_batch, batch_wait_s
        self.metrics = metrics
        self._waiting: collections.deque[Job] = collections.deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="selfrag-engine")
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.in_flight = 0

    @property
    def depth(self) -> int:
        return len(self._waiting)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="selfrag-batcher")

    async def stop(self) -> None:
        """Answer what is still queued, then stop the worker and its thread."""
        self._stopping = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    def submit(self, question: str, settings: InferenceConfig, stream: bool = False) -> Job:
        if self._stopping:
            raise QueueFull("the server is shutting down")
        if len(self._waiting) >= self.max_queue:
            raise QueueFull(f"{len(self._waiting)} requests are already waiting (max_queue={self.max_queue})")
        job = Job(question, settings, asyncio.get_running_loop().create_future(), asyncio.Queue() if stream else None)
        self._waiting.append(job)
        self._update_gauges()
        self._wakeup.set()
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone or timed out: free its queue slot now (or drop its answer, or stop its stream, if it
        is being decoded)."""
        job.cancelled = True
        try:
            self._waiting.remove(job)
        except ValueError:
            pass
        if not job.future.done():
            job.future.cancel()
        self._update_gauges()

    # -- the worker ---------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            if not self._waiting:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._waiting[0].events is None:
                await self._gather()
            batch = self._take()
            self._update_gauges()
            if batch and batch[0].events is not None:
                await self._run_stream(batch[0])
                continue
            for group in _by_settings(batch):
                await self._run(group)

    def _take(self) -> list[Job]:
        """The oldest job alone when it streams; else up to max_batch non-streaming jobs in arrival order."""
        if self._waiting and self._waiting[0].events is not None:
            return [self._waiting.popleft()]
        batch = [job for job in self._waiting if job.events is None][: self.max_batch]
        for job in batch:
            self._waiting.remove(job)
        return batch

    async def _gather(self) -> None:
        """Wait up to batch_wait_s (from the oldest job's arrival) for a fuller batch."""
        deadline = self._waiting[0].enqueued + self.batch_wait_s
        while len(self._waiting) < self.max_batch and not self._stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return
            if not self._waiting:
                return

    async def _run(self, jobs: list[Job]) -> None:
        jobs = [job for job in jobs if not job.cancelled]
        if not jobs:
            return
        self.in_flight = len(jobs)
        self._update_gauges()
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            answers = await loop.run_in_executor(
                self._executor, self._answer_many, jobs[0].settings, [job.question for job in jobs]
            )
        except Exception as error:  # an engine failure fails this batch's requests, not the server
            logger.exception("engine call failed for a batch of %d", len(jobs))
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
            return
        finally:
            self.in_flight = 0
            self._update_gauges()
        if self.metrics is not None:
            self.metrics.batch_size.observe(len(jobs))
            self.metrics.engine_seconds.observe(time.monotonic() - started)
        for job, answer in zip(jobs, answers, strict=True):
            if not job.future.done():
                job.future.set_result(answer)

    async def _run_stream(self, job: Job) -> None:
        if job.cancelled:
            return
        assert job.events is not None, "only streaming jobs are streamed"
        self.in_flight = 1
        self._update_gauges()
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            answer = await loop.run_in_executor(self._executor, self._drain, job, loop)
        except Exception as error:  # an engine failure ends this stream with an error, not the server
            logger.exception("engine failed while streaming a request")
            if not job.future.done():
                job.future.set_exception(error)
            return
        finally:
            self.in_flight = 0
            self._update_gauges()
            # After every event: the executor's result arrives through the loop after their call_soon_threadsafe.
            job.events.put_nowait(None)
        if self.metrics is not None:
            self.metrics.batch_size.observe(1)
            self.metrics.engine_seconds.observe(time.monotonic() - started)
        if answer is not None and not job.future.done():
            job.future.set_result(answer)

    def _drain(self, job: Job, loop: asyncio.AbstractEventLoop) -> Answer | None:
        """In the engine thread: hand each event to the loop as the runtime yields it; stop when the job is cancelled.

        Returns the final answer (None when the client went away first). Checking between events stops a
        cancelled stream before its next engine call, not in the middle of one.
        """
        assert job.events is not None
        events = self._stream(job.settings, job.question)
        try:
            for event in events:
                if job.cancelled:
                    return None
                loop.call_soon_threadsafe(job.events.put_nowait, event)
                if isinstance(event, FinalEvent):
                    return event.answer
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
        raise RuntimeError("the runtime's stream ended without a final answer")

    def _update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._waiting))
            self.metrics.in_flight.set(self.in_flight)


def _by_settings(jobs: list[Job]) -> list[list[Job]]:
    """Jobs grouped by equal runtime settings (one engine call each), in arrival order of each group's first."""
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        if not job.cancelled:
            groups.setdefault(json.dumps(to_dict(job.settings), sort_keys=True), []).append(job)
    return list(groups.values())
