"""The bounded queue and the batching worker: concurrent requests share engine calls; streams get each event as
the runtime yields it.

    worker = BatchWorker(backend.stream_many, max_queue=64, max_batch=16, batch_wait_s=0.01)
    await worker.start()
    job = worker.submit("Who wrote Hamlet?", settings)   # raises QueueFull when max_queue jobs wait
    answer = await job.future
    job = worker.submit("Who wrote Hamlet?", settings, stream=True)
    event = await job.events.get()                       # as soon as the runtime has it

One asyncio task takes the first waiting job, waits up to ``batch_wait_s`` for more (up to ``max_batch``),
groups them by their runtime settings and runs one ``stream_many`` per group in a worker thread: a group's
questions share each engine call, as with ``answer_many``. ``concurrent_batches`` batches run at once, each in its
own thread: 1 for an in-process engine (hf, vllm: not shared between threads), more for a remote one (openai: a
``vllm serve`` tier batches every request in flight per decode step, so a request that arrives while another batch
is in the engine goes to the engine at once instead of waiting for that batch to end).
Each event is handed to the loop as the runtime yields it: a streaming job's goes into its ``events`` queue, and
every job's ``future`` gets its answer at its final event. ``None`` closes a streaming job's queue after the
group is done (without a final event before it, ``future`` holds the engine's error). A job whose client went
away is removed from the queue at once, so its slot is free for the next request; in the engine, its requests
leave the batch at the next decode step (hf; see ``abandon_check``), and a group stops at its next event once all
of its jobs are gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from selfrag.config import to_dict
from selfrag.inference.answer import Answer
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines.cancel import AbandonCheck, abandon_when
from selfrag.inference.events import FinalEvent, StreamEvent

from .metrics import ServerMetrics

logger = logging.getLogger(__name__)

StreamMany = Callable[[InferenceConfig, Sequence[str]], Iterator[tuple[int, StreamEvent]]]
#: (the group's questions, "is question i's client gone?") -> the engine's per-request check
AbandonCheckOf = Callable[[Sequence[str], Callable[[int], bool]], AbandonCheck]


class QueueFull(Exception):
    """The queue holds ``max_queue`` waiting jobs; the request is answered 429."""


class ShuttingDown(Exception):
    """The server stopped before this job's answer was ready (past ``graceful_shutdown_s``); answered 503."""


@dataclass(eq=False)
class Job:
    question: str
    settings: InferenceConfig
    future: asyncio.Future[Answer]
    events: asyncio.Queue[StreamEvent | None] | None = None  # a streaming job's events; None closes it
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False


class BatchWorker:
    """See the module docstring."""

    def __init__(
        self,
        stream_many: StreamMany,
        max_queue: int,
        max_batch: int,
        batch_wait_s: float,
        metrics: ServerMetrics | None = None,
        abandon_check: AbandonCheckOf | None = None,
        concurrent_batches: int = 1,
    ) -> None:
        self._stream_many = stream_many
        self._abandon_check = abandon_check
        self.max_queue, self.max_batch, self.batch_wait_s = max_queue, max_batch, batch_wait_s
        self.metrics = metrics
        self._waiting: collections.deque[Job] = collections.deque()
        self._wakeup = asyncio.Event()
        self.concurrent_batches = concurrent_batches
        self._slots = asyncio.Semaphore(concurrent_batches)  # a batch holds one from being taken to its end
        self._running: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._expired = False  # expire() ran: stop() does not wait for the engine
        self._active: set[Job] = set()  # jobs in the engine
        self.in_flight = 0
        self._seconds_per_job: float | None = None  # moving average of engine seconds per job: Retry-After

    @property
    def depth(self) -> int:
        return len(self._waiting)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="selfrag-batcher")

    async def stop(self) -> None:
        """Answer what is still queued, then stop the worker; after :meth:`expire`, without waiting for the engine
        (its thread is a daemon: a batch it is still decoding does not hold the process)."""
        self._stopping = True
        self._wakeup.set()
        if self._expired:  # the loop may wait for a slot the engine holds: stop it instead of waiting
            for task in (self._task, *self._running):
                if task is not None:
                    task.cancel()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    def expire(self, reason: str) -> int:
        """Fail every job still waiting or in the engine with :class:`ShuttingDown` (``reason``): a plain request is
        answered at once, a stream ends with an error event. Their engine rows are abandoned (hf stops them at its
        next decode step). Returns how many jobs it failed."""
        self._stopping = self._expired = True
        jobs = [*self._waiting, *self._active]
        self._waiting.clear()
        failed = 0
        for job in jobs:
            job.cancelled = True
            if not job.future.done():
                job.future.set_exception(ShuttingDown(reason))
                failed += 1
            if job.events is not None:
                job.events.put_nowait(None)
        self._update_gauges()
        self._wakeup.set()
        return failed

    def submit(self, question: str, settings: InferenceConfig, stream: bool = False) -> Job:
        """Queue a question; with ``stream`` its events also go to ``job.events`` as the runtime yields them."""
        if self._stopping:
            raise QueueFull("the server is shutting down")
        if len(self._waiting) >= self.max_queue:
            raise QueueFull(f"{len(self._waiting)} requests are already waiting (max_queue={self.max_queue})")
        job = Job(question, settings, asyncio.get_running_loop().create_future(), asyncio.Queue() if stream else None)
        self._waiting.append(job)
        self._update_gauges()
        self._wakeup.set()
        return job

    def retry_after_s(self) -> int:
        """Whole seconds until the queue has likely drained by one batch (Retry-After of a 429), 1 to 60."""
        per_job = self._seconds_per_job if self._seconds_per_job is not None else 1.0
        per_job /= self.concurrent_batches  # that many batches drain the queue at once
        return max(1, min(60, math.ceil(per_job * min(self.max_batch, max(len(self._waiting), 1)))))

    def cancel(self, job: Job) -> None:
        """The client is gone or timed out: free its queue slot now (or drop its events if it is being decoded)."""
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
            await self._slots.acquire()  # a free engine thread before the batch is formed: late arrivals join it
            if not self._waiting:  # every waiting client left meanwhile
                self._slots.release()
                continue
            await self._gather()
            batch = [self._waiting.popleft() for _ in range(min(self.max_batch, len(self._waiting)))]
            self._update_gauges()
            task = asyncio.create_task(self._run_batch(_by_settings(batch)), name="selfrag-batch")
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run_batch(self, groups: list[list[Job]]) -> None:
        try:
            for group in groups:
                await self._run(group)
        finally:
            self._slots.release()

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
        self.in_flight += len(jobs)
        self._active.update(jobs)
        self._update_gauges()
        started = time.monotonic()
        if self.metrics is not None:
            for job in jobs:  # the queue wait ends here, when the engine takes the job
                self.metrics.queue_wait.observe(started - job.enqueued)
        loop = asyncio.get_running_loop()
        try:
            await _in_daemon_thread(loop, self._drain, jobs, loop)
        except Exception as error:  # an engine failure fails this batch's requests, not the server
            logger.exception("engine call failed for a batch of %d", len(jobs))
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
            return
        finally:
            self.in_flight -= len(jobs)
            self._active.difference_update(jobs)
            self._update_gauges()
            # The thread's result reaches the loop after every _deliver the thread scheduled: these come last.
            for job in jobs:
                if job.events is not None:
                    job.events.put_nowait(None)
        seconds = time.monotonic() - started
        per_job = seconds / len(jobs)
        previous = self._seconds_per_job
        self._seconds_per_job = per_job if previous is None else 0.8 * previous + 0.2 * per_job
        if self.metrics is not None:
            self.metrics.batch_size.observe(len(jobs))
            self.metrics.engine_seconds.observe(seconds)
        for job in jobs:
            if not job.future.done():  # only if the runtime broke its contract (one final event per question)
                job.future.set_exception(RuntimeError("the runtime sent no final answer for this question"))

    def _drain(self, jobs: list[Job], loop: asyncio.AbstractEventLoop) -> None:
        """In the engine thread: hand each event to the loop as the runtime yields it; stop once every job is gone.

        Between events, a group whose clients all left stops before its next engine call; within an engine call, an
        engine that asks :mod:`~selfrag.inference.engines.cancel` (hf) drops a gone job's requests before its next
        decode step.
        """
        questions = [job.question for job in jobs]
        check = None if self._abandon_check is None else self._abandon_check(questions, lambda i: jobs[i].cancelled)
        with abandon_when(check) if check is not None else contextlib.nullcontext():
            events = self._stream_many(jobs[0].settings, questions)
            try:
                for index, event in events:
                    if all(job.cancelled for job in jobs):
                        return
                    loop.call_soon_threadsafe(_deliver, jobs[index], event)
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()

    def _update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._waiting))
            self.metrics.in_flight.set(self.in_flight)


def _in_daemon_thread(
    loop: asyncio.AbstractEventLoop, function: Callable[..., None], *args: Any
) -> asyncio.Future[None]:
    """Run ``function(*args)`` in a new daemon thread; the future settles on the loop after every callback the
    thread scheduled before it returned. Not an executor: its threads are joined at exit, so a batch still decoding
    when the server stops (past graceful_shutdown_s) would hold the process until the batch ends."""
    future: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def target() -> None:
        error: BaseException | None = None
        try:
            function(*args)
        except BaseException as caught:  # handed to the loop, which re-raises it in _run
            error = caught
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:  # the loop is closed: the server has stopped, nobody waits for this batch
            pass

    threading.Thread(target=target, name="selfrag-engine", daemon=True).start()
    return future


def _deliver(job: Job, event: StreamEvent) -> None:
    """On the loop: a streaming job's event into its queue; the final answer into the job's future."""
    if job.cancelled:
        return
    if job.events is not None:
        job.events.put_nowait(event)
    if isinstance(event, FinalEvent) and not job.future.done():
        job.future.set_result(event.answer)


def _by_settings(jobs: list[Job]) -> list[list[Job]]:
    """Jobs grouped by equal runtime settings (one engine call each), in arrival order of each group's first."""
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        if not job.cancelled:
            groups.setdefault(json.dumps(to_dict(job.settings), sort_keys=True), []).append(job)
    return list(groups.values())
