"""Ctrl-C while ``selfrag train`` or ``selfrag rl`` steps: finish the step, save a checkpoint, stop; the same command
resumes there.

    interrupt = SaveOnInterrupt()
    trainer = SelfRAGSFTTrainer(..., callbacks=[..., interrupt])
    with interrupt.listening():
        trainer.train(resume_from_checkpoint=resume)
    interrupt.stop_if_interrupted()     # KeyboardInterrupt: the CLI says "run the same command again to resume"

Before, SIGINT stopped the step where it was: the CLI promised a resume, and a run interrupted before its first
``training.save_steps`` checkpoint started again from step 0. A second Ctrl-C stops at once (the step in flight is
lost; the last checkpoint stays). Several processes (torchrun) are left to the launcher: a checkpoint is written by
all of them together, and each would see the signal at another step.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class SaveOnInterrupt(TrainerCallback):  # type: ignore[misc]
    """A trainer callback: after the first SIGINT, the end of the current optimizer step saves and stops."""

    def __init__(self) -> None:
        self.interrupted = False
        self.step: int | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.interrupted:
            control.should_save = True  # the Trainer writes checkpoint-<step>, as at training.save_steps
            control.should_training_stop = True
            self.step = state.global_step
        return control

    def interrupt(self) -> None:
        """What the first SIGINT does (a second raises KeyboardInterrupt at once)."""
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True
        logger.warning("interrupted: saving a checkpoint at the end of this step, then stopping "
                       "(Ctrl-C again to stop at once, losing this step)")

    @contextlib.contextmanager
    def listening(self, processes: int = 1) -> Iterator[None]:
        """SIGINT calls :meth:`interrupt` inside this block (one process, on the main thread; else unchanged).

        A SIGINT the process was started ignoring (``nohup``, ``cmd &`` in a script) stays ignored, as Python leaves it.
        """
        if (
            processes != 1
            or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        ):
            yield
            return
        previous = signal.signal(signal.SIGINT, lambda signum, frame: self.interrupt())
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def stop_if_interrupted(self) -> None:
        """After training: an interrupted run stops here (its checkpoint is written), before evaluating or saving."""
        if self.interrupted:
            logger.warning("checkpoint of step %s saved; run the same command again to resume from it", self.step)
            raise KeyboardInterrupt
