"""`selfrag train` under `accelerate launch`, recording which rank writes which file (a test helper, not a test).

    accelerate launch --cpu --num_processes 2 tests/training/multiprocess_entry.py train --config ... k=v

Environment:
  SELFRAG_TEST_WATCH    a folder: every file opened for writing, renamed, removed or made under it is recorded
  SELFRAG_TEST_WRITERS  a folder for the records: ``rank<R>.log``, one ``<event>\\t<path>`` a line
  SELFRAG_TEST_KILL     ``<rank>:<step>``: that rank kills itself (SIGKILL) once checkpoint-<step> is complete

A Python audit hook sees every ``open`` (Python's and ``os.open``), ``os.replace``/``os.rename``, ``os.remove``
and ``shutil.rmtree`` of the process, whatever library does it; only writes from native code (safetensors'
Rust writer) escape it, so the adapter is recorded through its ``adapter_config.json``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _install_recorder(watch: Path, log_path: Path) -> None:
    handle = open(log_path, "a", encoding="utf-8", buffering=1)  # opened before the hook: not recorded
    root = str(watch.resolve())
    busy = [False]

    def record(event: str, path: Any) -> None:
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        if not isinstance(path, str | os.PathLike):
            return
        text = os.path.abspath(os.fspath(path))
        if text == root or text.startswith(root + os.sep):
            handle.write(f"{event}\t{os.path.relpath(text, root)}\n")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if busy[0]:
            return
        busy[0] = True
        try:
            if event == "open":
                path, mode, flags = args
                writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                    mode is None and isinstance(flags, int) and flags & WRITE_FLAGS
                )
                if writing:
                    record("write", path)
            elif event in ("os.rename", "os.replace"):
                record("rename-from", args[0])
                record("rename-to", args[1])
            elif event in ("os.remove", "os.unlink", "shutil.rmtree", "os.rmdir"):
                record("remove", args[0])
        finally:
            busy[0] = False

    sys.addaudithook(hook)


def _install_killer(spec: str, watch: Path) -> None:
    """Rank ``rank`` dies (SIGKILL) as it starts step ``step + 1``, once checkpoint-``step`` is complete."""
    from transformers import Trainer

    rank, step = (int(part) for part in spec.split(":"))
    if int(os.environ.get("RANK", "0")) != rank:
        return
    done = watch / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json"  # the checkpoint's last file
    original = Trainer.training_step
    calls = [0]

    def training_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > step * self.args.gradient_accumulation_steps:
            while not done.is_file():
                time.sleep(0.05)
            time.sleep(0.5)  # the main process rotates old checkpoints after writing the state
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args, **kwargs)

    Trainer.training_step = training_step  # type: ignore[method-assign]


def main() -> int:
    watch = os.environ.get("SELFRAG_TEST_WATCH")
    writers = os.environ.get("SELFRAG_TEST_WRITERS")
    if watch and writers:
        Path(writers).mkdir(parents=True, exist_ok=True)
        _install_recorder(Path(watch), Path(writers) / f"rank{os.environ.get('RANK', '0')}.log")
    if watch and os.environ.get("SELFRAG_TEST_KILL"):
        _install_killer(os.environ["SELFRAG_TEST_KILL"], Path(watch))
    from selfrag.app.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
