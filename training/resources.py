"""What a training run cost: optimizer-step throughput and peak memory, for ``metrics.json``.

    timer = StepTimer()                # a TrainerCallback: pass it to the trainer
    trainer.train(); timer.summary()   # {"steps": 4, "seconds": 3.1, "input_tokens": 8192, "tokens_per_second": ...}
    peak_memory()                      # {"device": "cuda", "allocated_gb": ..., "device_peak_gb": ..., "rss_gb": ...}

The throughput leaves out the first optimizer step (kernel selection, allocator growth, lazy initialisation): it is
the steps after it, each timed at its end with the GPU synchronised. Tokens are the non-padding input tokens the
Trainer counts (``include_num_input_tokens_seen=non_padding``).
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

GB = 1024**3
logger = logging.getLogger(__name__)


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StepTimer(TrainerCallback):
    """Times each optimizer step of ``trainer.train()`` (wall clock, device synchronised) with the tokens seen.

    ``judge_every``: a checkpoint judgement runs every that many steps (``training.eval_steps``, else ``save_steps``;
    0: none). The estimate after the second step counts the judgements left; the first judgement's time, reported to
    :meth:`judged`, prints the estimate again with every judgement left in it. Judgement seconds are not step seconds:
    the throughput leaves them out.
    """

    def __init__(self, judge_every: int = 0) -> None:
        self.start: tuple[float, int] | None = None
        self.marks: list[tuple[float, int]] = []  # (perf_counter at a step's end, input tokens seen by then)
        self.judge_every = judge_every
        self.steps: list[int] = []  # the global step of each mark
        self.judgements: list[tuple[int, float]] = []  # (step, seconds) of each checkpoint judgement

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _synchronize()
        self.start = (time.perf_counter(), int(state.num_input_tokens_seen or 0))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _synchronize()
        self.marks.append((time.perf_counter(), int(state.num_input_tokens_seen or 0)))
        self.steps.append(int(state.global_step))
        if len(self.marks) == 2:  # the first step warms up: the second says how long the rest takes
            logger.info("%s", self.estimate(int(state.global_step), int(state.max_steps or 0)))

    def judged(self, step: int, seconds: float, max_steps: int) -> None:
        """A checkpoint judgement after ``step`` took ``seconds``; after the first, the estimate again with them all."""
        self.judgements.append((step, seconds))
        if len(self.judgements) == 1 and len(self.marks) >= 2:
            logger.info("%s", self.estimate(step, max_steps))

    def judgements_left(self, step: int, max_steps: int) -> int:
        """Checkpoint judgements after ``step`` and before ``max_steps`` (the last step's is the final judgement,
        after training)."""
        if self.judge_every <= 0 or max_steps <= 0:
            return 0
        return max(0, (max_steps - 1) // self.judge_every - step // self.judge_every)

    def _judging(self) -> float:
        """Seconds of the judgements between the first step's end and the last one's (each runs after its step)."""
        if not self.steps:
            return 0.0
        return sum(seconds for step, seconds in self.judgements if self.steps[0] <= step < self.steps[-1])

    def step_seconds(self) -> float:
        """Mean seconds of a step after the warm-up one, checkpoint judgements left out."""
        return max(0.0, (self.marks[-1][0] - self.marks[0][0] - self._judging()) / (len(self.marks) - 1))

    def estimate(self, step: int, max_steps: int) -> str:
        """One line: a step's seconds here, and when the steps and checkpoint judgements left end at that pace."""
        seconds = self.step_seconds()
        steps_left = max(0, max_steps - step)
        left = steps_left * seconds
        judgements = self.judgements_left(step, max_steps)
        head = f"training: {seconds:.1f} s a step on this machine"
        if self.judgements:
            first_step, first = self.judgements[0]
            left += judgements * first
            ends = time.strftime("%H:%M", time.localtime(time.time() + left))
            return (f"{head}, and the checkpoint judgement at step {first_step} took {first:.0f} s; the {steps_left} "
                    f"steps and {judgements} judgements left take about {left / 60:.0f} min (until ~{ends})")
        ends = time.strftime("%H:%M", time.localtime(time.time() + left))
        line = f"{head}; the {steps_left} steps left take about {left / 60:.0f} min (until ~{ends})"
        if judgements:
            first_step = (step // self.judge_every + 1) * self.judge_every
            line += (f", and {judgements} checkpoint judgements more (the first, at step {first_step}, says how long "
                     "they take)")
        return line

    def summary(self) -> dict[str, Any]:
        """Steps timed after the first, their seconds (checkpoint judgements left out), input tokens and tokens/s;
        the first step's seconds and the judgements' apart."""
        first = round(self.marks[0][0] - self.start[0], 3) if self.marks and self.start else None
        judging = round(sum(seconds for _, seconds in self.judgements), 3)
        if len(self.marks) < 2:
            return {"steps": 0, "seconds": None, "input_tokens": None, "tokens_per_second": None,
                    "first_step_seconds": first, "judgement_seconds": judging}
        (begin, tokens_begin), (end, tokens_end) = self.marks[0], self.marks[-1]
        seconds, tokens = end - begin - self._judging(), tokens_end - tokens_begin
        return {"steps": len(self.marks) - 1, "seconds": round(seconds, 3), "input_tokens": tokens,
                "tokens_per_second": round(tokens / seconds, 1) if seconds > 0 and tokens > 0 else None,
                "first_step_seconds": first, "judgement_seconds": judging}


class StepProfiler(TrainerCallback):
    """``training.profile_steps``: torch.profiler over ``steps`` optimizer steps after the first (which warms up), then
    ``path`` holds the operators' table by self time (CUDA time where the GPU ran, else CPU time) and a header line."""

    def __init__(self, steps: int, path: Path) -> None:
        self.steps, self.path = steps, path
        self.profiler: Any = None
        self.seen = 0
        self.started = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None or self.seen >= self.steps or int(state.global_step) < 1:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        _synchronize()
        self.profiler = profile(activities=activities, record_shapes=False)
        self.profiler.__enter__()
        self.started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None:
            self.seen += 1
            if self.seen >= self.steps:
                self.finish(state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None:  # fewer steps left than asked for: what was profiled
            self.finish(state)

    def finish(self, state: Any) -> None:
        """Stop the profiler; the main process writes the table (one writer when several processes train)."""
        _synchronize()
        seconds = time.perf_counter() - self.started
        self.profiler.__exit__(None, None, None)
        if getattr(state, "is_world_process_zero", True):
            self.write(self.profiler, seconds, int(state.global_step))
        self.profiler = None

    def write(self, profiler: Any, seconds: float, step: int) -> None:
        events = profiler.key_averages()
        device = any(getattr(event, "self_device_time_total", 0) for event in events)
        sort = "self_cuda_time_total" if device else "self_cpu_time_total"
        header = (f"training.profile_steps: {self.seen} optimizer step(s) ending at step {step}, {seconds:.2f} s wall "
                  f"with the profiler on; operators by their own {'device' if device else 'CPU'} time\n\n")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(header + events.table(sort_by=sort, row_limit=40) + "\n", encoding="utf-8")
        logger.info("profile of %d step(s) written to %s", self.seen, self.path)


STATUS = Path("/proc/self/status")


def reset_peak_memory() -> None:
    """Start the peak counts here: the CUDA allocator's, and on Linux the process's peak RSS (``VmHWM``, reset by
    writing 5 to ``/proc/self/clear_refs``; elsewhere the peak RSS counts from the process's start)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_gb() -> float:
    """Peak resident memory since :func:`reset_peak_memory` (Linux ``VmHWM``), else since the process started."""
    try:
        line = next(line for line in STATUS.read_text().splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024 / GB
    except (OSError, StopIteration):
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / GB


def peak_memory() -> dict[str, Any]:
    """The process's peak resident memory, and on CUDA the allocator's peak allocated and reserved bytes (GiB)."""
    peak: dict[str, Any] = {"device": "cpu", "rss_gb": round(peak_rss_gb(), 3)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        # what the device holds beyond the allocator's pool now: the CUDA context, cuBLAS/cuDNN workspaces (and any
        # other process on the card); with the pool's peak, the process's peak as nvidia-smi would have shown it
        outside = max(0, total - free - torch.cuda.memory_reserved())
        peak.update(device="cuda", name=torch.cuda.get_device_name(),
                    allocated_gb=round(torch.cuda.max_memory_allocated() / GB, 3),
                    reserved_gb=round(torch.cuda.max_memory_reserved() / GB, 3),
                    device_peak_gb=round((torch.cuda.max_memory_reserved() + outside) / GB, 3))
    return peak
