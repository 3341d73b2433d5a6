"""Several training processes, one output folder: who decides, who writes, who waits.

    processes = Processes.start(timeout_s=1800)           # joins the launcher's process group (gloo without CUDA)
    state = processes.on_main(lambda: check_rerun(...))   # the main process decides; every process gets its answer
    if processes.is_main: write_json(...)                 # one writer per file
    processes.wait()                                      # the others wait for it

``accelerate launch`` / ``torchrun`` start one process per device with ``WORLD_SIZE`` set. Every output file
(``run.json``, the tokenizer, ``selfrag.json``, ``config.yaml``, ``metrics.json``, the plot, the judgement
report) is written by the main process only; the others compute what every process must (the forward passes of
the evaluation, which FSDP shards) and wait. A decision that reads the folder (fresh, resume or refuse) is taken
once, on the main process, and sent to the others, so a ``restart=true`` never has one process clearing the folder
while another writes into it; a refusal reaches every process, which all fail with the same one line.

Without CUDA, accelerate would give each process its own single-process state (``DistributedType.NO``): N
independent trainings racing on one folder. ``start`` therefore asks for the CPU (gloo) backend when the
launcher started several processes and no GPU is visible. ``timeout_s`` bounds every collective: a process that
died leaves the others failing after it instead of waiting forever (the launcher usually stops them sooner).
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from selfrag.errors import ConfigError, SelfragError

T = TypeVar("T")

#: Words of a failed collective's message (gloo's transport, NCCL's watchdog, a process-group timeout).
COLLECTIVE_FAILURES = ("gloo", "Gloo", "NCCL", "Connection closed by peer", "Connection reset by peer", "Timed out")
#: The process-group timeout when ``trl.ddp_timeout`` is unset (transformers' own default: 30 minutes).
DEFAULT_TIMEOUT_S = 1800


class ProcessLostError(SelfragError, RuntimeError):
    """Another training process died (killed, out of memory, a lost machine): this one stops too.

    Every surviving process reports it (``every_process``), since the one that would speak for the run may be
    the one that died."""

    every_process = True


def launched_processes() -> int:
    """How many processes the launcher started (``WORLD_SIZE``; 1 for a plain ``selfrag train``)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def use_cpu_backend() -> bool:
    """Several processes and no GPU: the processes must join a gloo group on the CPU."""
    import torch

    return launched_processes() > 1 and not torch.cuda.is_available()


def check_cpu_sharding() -> None:
    """Refuse FSDP / DeepSpeed launched without GPUs: accelerate 1.15 would quietly train plain DDP instead.

    torch 2.13's FSDP2 (``fully_shard``) does run on CPU over gloo, but accelerate's ``AcceleratorState`` turns
    FSDP on only for GPU-like process types, so a CPU launch with an FSDP config gets full replicas, not shards.
    """
    for variable, what in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "false").lower() == "true":
            raise ConfigError([
                f"the launcher asked for {what} but no GPU is visible: accelerate runs CPU processes as plain data "
                f"parallel (every process a full copy), not sharded; launch on GPUs, or on CPU with "
                f"`accelerate launch --multi_gpu --num_processes N` (data parallel over gloo)"
            ])


@dataclass(frozen=True)
class Processes:
    """The training processes of one run, as accelerate's ``PartialState`` sees them."""

    state: Any  # accelerate.PartialState

    @classmethod
    def start(cls, timeout_s: float = DEFAULT_TIMEOUT_S) -> Processes:
        from accelerate import PartialState

        options: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s)}
        if use_cpu_backend():
            check_cpu_sharding()
            options.update(cpu=True, backend="gloo")
        processes = cls(PartialState(**options))
        if not processes.is_main:  # the main process tells the story once; the others say only what goes wrong
            logging.getLogger("selfrag").setLevel(logging.WARNING)
        return processes

    @property
    def is_main(self) -> bool:
        return bool(self.state.is_main_process)

    @property
    def count(self) -> int:
        return int(self.state.num_processes)

    @property
    def index(self) -> int:
        return int(self.state.process_index)

    def wait(self) -> None:
        """A barrier: every process waits here until all have arrived (nothing with one process)."""
        self.state.wait_for_everyone()

    def on_main(self, decide: Callable[[], T]) -> T:
        """``decide()`` on the main process only; every process returns its result or raises its error.

        The others wait meanwhile, so whatever ``decide`` writes is complete when they go on. The error (a
        ``SelfragError``: a user's mistake) is sent as text and raised again as the same class on every
        process, so each fails with the main process's one line instead of waiting at the next collective.
        """
        if self.count == 1:
            return decide()
        message: list[Any] = [None]
        if self.is_main:
            try:
                message = [("ok", decide())]
            except SelfragError as error:
                message = [("error", (type(error), getattr(error, "problems", None), str(error)))]
                self._send(message)
                raise
        self._send(message)
        kind, value = message[0]
        if kind == "error":
            error_type, problems, text = value
            raise error_type(problems) if problems is not None else error_type(text)
        return value  # type: ignore[no-any-return]

    def _send(self, message: list[Any]) -> None:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(message, from_process=0)

    @contextmanager
    def stopping_together(self, resume_point: Callable[[], str | None]) -> Iterator[None]:
        """Turn a lost process into one :class:`ProcessLostError` line naming the checkpoint a rerun resumes from
        (``resume_point()`` when it stops: the newest complete checkpoint, or None before the first).

        A collective with a dead peer fails (gloo: the connection closes; else after the timeout), or the
        launcher, which saw the process die, sends SIGTERM to the others; either way each survivor stops with it.
        """
        if self.count == 1:
            yield
            return
        import torch.distributed as dist

        def stop(why: str) -> ProcessLostError:
            last = resume_point()
            resume = f"resume from {last}" if last else "start over (no checkpoint was written yet)"
            return ProcessLostError(
                f"process {self.index} of {self.count} stopped: {why}; run the same command again to {resume}"
            )

        def on_terminate(signum: int, frame: Any) -> None:
            raise stop("the launcher stopped it (SIGTERM), as another training process had failed")

        previous = signal.signal(signal.SIGTERM, on_terminate)
        try:
            yield
        except RuntimeError as error:  # gloo raises a plain RuntimeError (torch 2.13), NCCL a DistBackendError
            text = " ".join(str(error).split())
            if not (isinstance(error, dist.DistError) or any(word in text for word in COLLECTIVE_FAILURES)):
                raise
            cause = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0]  # gloo: "[.../pair.cc:553] Connection ..."
            raise stop(f"another training process is gone ({cause[:160]})") from None
        finally:
            signal.signal(signal.SIGTERM, previous)
