"""Each writer a resume reads from, killed between its temp write and its rename, then resumed.

Two ways to die: ``os.replace`` raising (in process), and a real ``SIGKILL`` of a ``selfrag generate``
process at that moment. Either way the old file stays whole and the rerun succeeds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from selfrag.artifacts import ModelMeta, load_meta, save_meta
from selfrag.config import help_field, load_config, write_resolved
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.fsutil import write_json
from selfrag.jsonl import read_jsonl, write_jsonl_atomic
from selfrag.reflection import TOKENS, ReflectionIds


class Killed(BaseException):
    """Stands for the process dying: not an Exception, so no handler swallows it."""


def kill_at_rename(monkeypatch: pytest.MonkeyPatch) -> None:
    def die(*args: object, **kwargs: object) -> None:
        raise Killed

    monkeypatch.setattr(os, "replace", die)


@dataclass
class Settings:
    output: Path = help_field("where")
    steps: int = help_field("steps", 3)


def _meta(base: str) -> ModelMeta:
    ids = ReflectionIds({token: 100 + i for i, token in enumerate(TOKENS)})
    return ModelMeta(token_ids=ids, strategy="add", prompt_template="paper", base_model=base, kind="adapter")


WRITERS: dict[str, tuple[Callable[[Path, int], object], Callable[[Path], object]]] = {
    # name: (write version n into the directory, read back what a resume reads)
    "config.yaml": (
        lambda d, n: write_resolved(Settings(output=d, steps=n), d),
        lambda d: load_config(Settings, d / "config.yaml").steps,
    ),
    "selfrag.json": (lambda d, n: save_meta(d, _meta(f"base-{n}")), lambda d: load_meta(d).base_model),  # type: ignore[union-attr]
    "stats.json": (
        lambda d, n: write_json(d / "stats.json", {"records": n}),
        lambda d: json.loads((d / "stats.json").read_text())["records"],
    ),
    "records.jsonl": (
        lambda d, n: write_jsonl_atomic(d / "records.jsonl", [{"id": i} for i in range(n)]),
        lambda d: len(list(read_jsonl(d / "records.jsonl"))),
    ),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_writer_killed_before_rename_keeps_the_old_file_and_resumes(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write, read = WRITERS[name]
    write(tmp_path, 1)
    before = read(tmp_path)
    with monkeypatch.context() as patch:
        kill_at_rename(patch)
        with pytest.raises(Killed):
            write(tmp_path, 2)
    assert read(tmp_path) == before  # the old version, whole
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    write(tmp_path, 2)  # the rerun
    assert read(tmp_path) != before


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from selfrag.app.cli import main
    real_replace = os.replace
    def replace(src, dst):
        if str(dst).endswith(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGKILL)  # dead between the temp write and the rename
        real_replace(src, dst)
    os.replace = replace
    sys.exit(main(sys.argv[2:]))
    """
)


def _generate(out: Path, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = ["generate", f"passages={DEMO_CORPUS}", f"queries={DEMO_QUERIES}", f"output={out}", "limit=4"]
    runner = ["-c", KILLER, kill_at] if kill_at else ["-m", "selfrag.app.cli"]
    command = [sys.executable, *runner, *argv]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_generate_sigkilled_while_rewriting_its_config_resumes(tmp_path: Path) -> None:
    out = tmp_path / "data"
    first = _generate(out)
    assert first.returncode == 0, first.stderr
    records = (out / "records.jsonl").read_text()
    config = (out / "config.yaml").read_text()

    killed = _generate(out, kill_at="config.yaml")
    assert killed.returncode == -signal.SIGKILL
    assert (out / "config.yaml").read_text() == config  # never a cut config.yaml
    assert [p.name for p in out.iterdir() if ".tmp-" in p.name]  # the dead writer's temp file

    again = _generate(out)
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert (out / "records.jsonl").read_text() == records  # nothing lost, nothing written twice
    assert [p.name for p in out.iterdir() if ".tmp-" in p.name] == []  # the rerun removed it
