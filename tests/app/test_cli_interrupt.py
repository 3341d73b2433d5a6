"""What the CLI says after Ctrl-C is what the command does when it is run again (issue 56): "run the same command
again to resume" only where a rerun goes on from where it stopped; it said so after every command, including those
that start over (calibrate, export, paper-data) or have nothing to resume (ask, serve)."""

from __future__ import annotations

from typing import Any

import pytest

from selfrag.app import cli
from selfrag.app.cli import main

RESUME = "interrupted; run the same command again to resume"
START_OVER = "interrupted; this command does not resume: run the same command again to start over"


@pytest.mark.parametrize(("argv", "said"), [
    (["generate"], RESUME),
    (["train"], RESUME),
    (["rl"], RESUME),
    (["index"], RESUME),
    (["eval"], RESUME),
    (["quickstart"], RESUME),
    (["calibrate"], START_OVER),
    (["export", "adapter", "merged"], START_OVER),
    (["paper-data", "import", "a.jsonl", "b.jsonl"], START_OVER),
    (["generate-merge"], "interrupted; its output folder may hold part of the merge: delete it, then run the same "
                         "command again"),
    (["ask", "Who ruled Normandy?"], "interrupted"),
    (["serve"], "interrupted"),
    (["pg", "status", "pgdata"], "interrupted"),
    (["audit", "data"], "interrupted"),
])
def test_ctrl_c_says_what_a_rerun_does(argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, argv[0], interrupted)
    assert main(argv) == 130
    assert capsys.readouterr().err.splitlines()[-1] == f"selfrag {argv[0]}: {said}"


def test_every_command_has_its_line() -> None:
    assert set(cli.INTERRUPTED) == set(cli.COMMANDS)
