"""User mistakes at the command line: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES

REPO = Path(__file__).parents[2]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip() and " INFO " not in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_corpus_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run_cli(capsys, "ask", f"model={tmp_path}", f"retriever.corpus={tmp_path / 'none.jsonl'}", "q?")
    assert_one_line_error(code, err, "selfrag ask: error:", "none.jsonl", "not found")


def test_malformed_jsonl_line_names_file_and_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "title": "T", "text": "fine"}\n{"id": "b", "title": "T", "text": "broken"\n')
    code, err = run_cli(capsys, "generate", f"passages={corpus}", f"queries={DEMO_QUERIES}",
                        f"output={tmp_path / 'out'}")
    assert_one_line_error(code, err, f"{corpus}:2: not valid JSON")


def test_unknown_model_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(capsys, "ask", "model=no-such-model", f"retriever.corpus={DEMO_CORPUS}", "q?")
    assert_one_line_error(code, err, "unknown model 'no-such-model'", "smollm2-135m-instruct")


def test_unknown_config_key(capsys: pytest.CaptureFixture[str]) -> None:
    config = REPO / "configs" / "train" / "smollm2-135m-cpu.yaml"
    code, err = run_cli(capsys, "train", "--config", str(config), "training.learning_rat=1e-3")
    assert code == 2 and "Traceback" not in err
    assert "unknown config key 'training.learning_rat'; did you mean 'training.learning_rate'?" in err
    assert "records is required" in err and "output_dir is required" in err  # all problems at once


def test_every_command_has_a_handler() -> None:
    from selfrag.app.cli import COMMANDS, build_parser

    parser = build_parser()
    commands = next(action for action in parser._actions if action.dest == "command").choices
    assert set(commands) == set(COMMANDS)
    assert {"generate", "train", "export", "ask", "index", "serve", "eval", "calibrate", "quickstart"} <= set(COMMANDS)


def test_help_config_lists_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["ask", "model=m", "retriever.corpus=c", "q", "--help-config"])
    assert "threshold (float | None, None): adaptive mode retrieves" in capsys.readouterr().out


def test_real_process_prints_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "selfrag.app.cli",
            "generate",
            f"passages={tmp_path / 'nope.jsonl'}",
            f"queries={DEMO_QUERIES}",
            f"output={tmp_path / 'out'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "selfrag generate: error: corpus file" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
@pytest.mark.parametrize("command", ["ask", "serve"])
def test_missing_vllm_gives_the_install_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    """`ask inference.engine=vllm` gave a traceback and `serve inference.engine=vllm` only "No module named
    'vllm'"; both now say how to install it, from one place (selfrag.inference.engines.options.VLLM_INSTALL), as
    generate's teacher does."""
    from selfrag.inference.engines.options import VLLM_INSTALL

    argv = [command, f"model={tmp_path}", f"retriever.corpus={DEMO_CORPUS}", "inference.engine=vllm"]
    argv += ["q?"] if command == "ask" else []  # serve: refused before the port opens
    code, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, "inference.engine=vllm needs vLLM", VLLM_INSTALL)


def test_the_teacher_says_the_same_install_line() -> None:
    from selfrag.data_gen.config import TeacherConfig
    from selfrag.data_gen.teachers import vllm_teacher
    from selfrag.errors import ConfigError
    from selfrag.inference.engines.options import VLLM_INSTALL

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ConfigError, match="teacher.engine=vllm") as error:
        vllm_teacher(TeacherConfig(engine="vllm", model="smollm2"))
    assert VLLM_INSTALL in str(error.value)
