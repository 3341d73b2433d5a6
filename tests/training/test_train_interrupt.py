"""Ctrl-C while training saves a checkpoint at the end of the step, so "run the same command again to resume"
holds (issue 56): interrupted before its first training.save_steps checkpoint, a run started again from step 0."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_train_run import make_config

from selfrag.training.interrupt import SaveOnInterrupt
from selfrag.training.run import run


@pytest.mark.usefixtures("ctrl_c")
def test_sigint_before_the_first_checkpoint_saves_one_and_the_rerun_resumes_from_it(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import Trainer

    config = make_config(tiny_base_dir, records_path, tmp_path / "out", max_steps=4, save_steps=100, batch_size=2)
    real_step, calls = Trainer.training_step, []

    def sigint_in_step_2(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, in the middle of the step
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", sigint_in_step_2)
    with pytest.raises(KeyboardInterrupt):
        run(config)
    monkeypatch.setattr(Trainer, "training_step", real_step)
    checkpoints = Path(config.output_dir) / "checkpoints"
    saved = sorted(path.name for path in checkpoints.glob("checkpoint-*"))
    assert saved == ["checkpoint-2"]  # step 2 finished, then saved
    assert len(calls) == 2 and not (Path(config.output_dir) / "adapter_model.safetensors").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    resumed = run(config)
    assert resumed.resumed_from is not None and resumed.resumed_from.endswith("checkpoint-2")
    assert [entry["step"] for entry in resumed.losses] == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.usefixtures("ctrl_c")
def test_the_first_sigint_asks_for_a_save_and_a_second_stops_at_once() -> None:
    interrupt = SaveOnInterrupt()
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    state = SimpleNamespace(global_step=7)
    interrupt.on_step_end(None, state, control)
    assert not control.should_save and not control.should_training_stop  # not interrupted: the step goes on
    with interrupt.listening():
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupt.interrupted
        interrupt.on_step_end(None, state, control)
        assert control.should_save and control.should_training_stop
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        interrupt.stop_if_interrupted()
    untouched = SaveOnInterrupt()
    with untouched.listening(processes=2):  # several processes: the launcher's signal handling stays
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    untouched.stop_if_interrupted()


def test_a_sigint_the_process_was_started_ignoring_stays_ignored() -> None:
    # `nohup selfrag train …` or `selfrag train … &` in a script: Ctrl-C is not meant to reach the run
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupt = SaveOnInterrupt()
        with interrupt.listening():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
        assert not interrupt.interrupted
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        interrupt.stop_if_interrupted()  # nothing to stop
    finally:
        signal.signal(signal.SIGINT, previous)
