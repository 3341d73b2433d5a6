"""Two processes never write one output folder: the second is refused at once, in one line, and nothing changes.

Before, a second `selfrag rl` (or train, eval, generate, quickstart) started into a folder another one was writing
was not refused: both wrote checkpoints and answers into it, interleaved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.errors import InputError
from selfrag.fsutil import hold_output, lock_path

DEMO = Path(__file__).resolve().parents[2] / "data_gen" / "demo"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """Another process holding ``tmp_path/out`` as `selfrag train` would, until it is killed."""
    out = tmp_path / "out"
    ready = tmp_path / "ready"
    script = textwrap.dedent(f"""
        import pathlib, time
        from selfrag.fsutil import hold_output
        with hold_output({str(out)!r}, "train"):
            pathlib.Path({str(ready)!r}).write_text("held")
            time.sleep(300)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert process.poll() is None, "the holding process ended early"
        assert time.monotonic() < deadline, "the holding process never took the folder"
        time.sleep(0.05)
    yield out, process
    process.kill()
    process.wait()


def test_a_second_process_is_refused_naming_the_holder(holder: tuple[Path, subprocess.Popen[str]]) -> None:
    out, process = holder
    with pytest.raises(InputError) as refused, hold_output(out, "rl"):
        pass
    message = str(refused.value)
    assert "in use by another process" in message and f"pid {process.pid}" in message
    assert "selfrag train" in message and "give another output directory" in message and "\n" not in message


def test_a_killed_holder_leaves_no_stale_lock(holder: tuple[Path, subprocess.Popen[str]]) -> None:
    out, process = holder
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    with hold_output(out, "rl"):  # the kernel dropped the dead process's lock: taken at once
        assert "selfrag rl" in lock_path(out).read_text(encoding="utf-8")
    assert not lock_path(out).exists()


def test_holds_nest_in_one_process_and_leave_no_file(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "model"
    with hold_output(out, "quickstart"), hold_output(out, "train"):  # a command run inside another, in-process
        assert lock_path(out).parent == out.parent and lock_path(out).name == ".model.selfrag-lock"
        assert lock_path(out).exists() and not out.exists()  # the folder's own entries are the command's alone
    assert not lock_path(out).exists()
    with hold_output(out, "train"):  # released: taken again
        pass


def test_a_url_output_is_not_held(tmp_path: Path) -> None:
    with hold_output("memory://bucket/out", "generate"):
        assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", f"passages={DEMO / 'corpus.jsonl'}", f"queries={DEMO / 'queries.jsonl'}", "labeler=gold",
         "output={out}"],
        ["train", "model=HuggingFaceTB/SmolLM2-135M-Instruct", f"records={DEMO / 'queries.jsonl'}", "output_dir={out}"],
        ["rl", "model=HuggingFaceTB/SmolLM2-135M-Instruct", f"queries={DEMO / 'queries.jsonl'}",
         f"retriever.corpus={DEMO / 'corpus.jsonl'}", "output_dir={out}"],
        ["eval", f"data={DEMO / 'queries.jsonl'}", "model=HuggingFaceTB/SmolLM2-135M-Instruct",
         f"retriever.corpus={DEMO / 'corpus.jsonl'}", "output_dir={out}"],
        ["quickstart", "output_dir={out}"],
        # no output_dir: calibrate writes into the model's folder, so it holds that one
        ["calibrate", "model={out}", f"data={DEMO / 'queries.jsonl'}", f"retriever.corpus={DEMO / 'corpus.jsonl'}"],
    ],
    ids=["generate", "train", "rl", "eval", "quickstart", "calibrate-into-the-model"],
)
def test_each_writing_command_is_refused_before_any_work(
    argv: list[str], holder: tuple[Path, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    out, process = holder
    out.mkdir(exist_ok=True)
    (out / "step-7.txt").write_text("the other run's work\n")
    before = _snapshot(out)
    started = time.monotonic()
    assert main([word.replace("{out}", str(out)) for word in argv]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "in use by another process" in error and f"pid {process.pid}" in error
    assert _snapshot(out) == before
    assert time.monotonic() - started < 30  # refused before a model loads or a record is read
