"""The command line's own mistakes, each with the exact line the user sees (exit 2, no traceback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from selfrag.app.cli import main
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.errors import ModelNotFoundError
from selfrag.inference.ask import AskConfig
from selfrag.models import resolve_model


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace the model call of `selfrag ask` and record what it was given."""
    seen: dict[str, Any] = {}

    def fake_ask_many(config: AskConfig, questions: list[str]) -> Any:
        seen.update(model=config.model, corpus=config.retriever.corpus, question=questions[0], config=config)
        raise SystemExit(0)

    monkeypatch.setattr("selfrag.inference.ask.ask_many", fake_ask_many)
    return seen


ASK = ["ask", "model=m", "retriever.corpus=c.jsonl"]


def test_overrides_before_the_question_are_not_the_question(asked: dict[str, Any]) -> None:
    with pytest.raises(SystemExit):
        main([*ASK, "inference.mode=always", "Who ruled Normandy?", "inference.top_k=2"])
    assert asked["question"] == "Who ruled Normandy?"
    assert asked["config"].inference.mode == "always" and asked["config"].inference.top_k == 2


def test_options_after_the_question_still_count(asked: dict[str, Any]) -> None:
    with pytest.raises(SystemExit):
        main(["ask", "Who?", "model=m", "--json", "inference.threshold=0.5", "retriever.corpus=c.jsonl"])
    assert asked["question"] == "Who?" and asked["config"].inference.threshold == 0.5


def test_a_question_with_equals_sign_goes_through_q(asked: dict[str, Any]) -> None:
    with pytest.raises(SystemExit):
        main([*ASK, "-q", "x=5: what is 2x?", "inference.mode=never"])
    assert asked["question"] == "x=5: what is 2x?" and asked["config"].inference.mode == "never"


@pytest.mark.parametrize(
    ("words", "line"),
    [
        (
            ["inference.mode=always"],
            "selfrag ask: error: no question given; write it in quotes, e.g. selfrag ask model=M retriever.index=I "
            "\"Who ruled Normandy?\" (use -q/--question when the question contains '=')",
        ),
        (
            ["Who", "ruled?"],
            "selfrag ask: error: got 2 questions ('Who', 'ruled?'); put the question in quotes as one argument, "
            "and write settings as key=value",
        ),
        ([""], "selfrag ask: error: the question is empty; write the question in quotes"),
        (["  "], "selfrag ask: error: the question is empty; write the question in quotes"),
        (
            ["-q", "Who?", "Why?"],
            "selfrag ask: error: give the question once: got --question and also 'Why?'; quote one question",
        ),
        (
            ["Q?", "--bogus"],
            "selfrag ask: error: unrecognized option '--bogus'; see selfrag ask --help",
        ),
    ],
)
def test_ask_usage_mistakes(
    words: list[str], line: str, capsys: pytest.CaptureFixture[str], asked: dict[str, Any]
) -> None:
    try:
        code = main([*ASK, *words])
    except SystemExit as stop:
        code = stop.code  # type: ignore[assignment]
    assert code == 2 and stderr_lines(capsys) == [line] and not asked


def test_each_problem_is_one_line_once(capsys: pytest.CaptureFixture[str], asked: dict[str, Any]) -> None:
    assert main([*ASK, "Q?", "inference.top_k=abc", "inference.threshold=abc", "inference.top_k=abc"]) == 2
    assert stderr_lines(capsys) == [
        "selfrag ask: error: inference.threshold must be a number, got 'abc'; e.g. inference.threshold=0.2",
        "selfrag ask: error: inference.top_k must be an integer, got 'abc'; e.g. inference.top_k=3",
    ]


@pytest.mark.parametrize(
    ("command", "first"),
    [
        ("ask", "model (str, required):"),
        ("generate", "output (str, required):"),  # a directory or an fsspec URL
        ("train", "model (str, required):"),
        ("quickstart", "output_dir (Path, PosixPath('selfrag-quickstart')):"),
    ],
)
def test_help_config_needs_no_other_argument(command: str, first: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main([command, "--help-config"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(first)


def test_help_config_on_a_command_without_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["export", "--help-config"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(
        "selfrag export has no config keys; its arguments:\nusage: selfrag export"
    )


def test_model_messages_name_no_flag() -> None:
    # `selfrag train model=...` named `--model`, a flag train does not have.
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("no-such-model")
    assert str(caught.value) == (
        "unknown model 'no-such-model': not a built-in name (smollm2-135m-instruct), not an existing directory, "
        "and not a hub id like owner/name; give the model as one of those"
    )


def test_offline_hub_id_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty hub cache
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["ask", "model=owner/no-model", f"retriever.corpus={DEMO_CORPUS}", "Q?"]) == 2
    assert stderr_lines(capsys) == [
        "selfrag ask: error: model 'owner/no-model' is a hub id, but hub downloads are off (HF_HUB_OFFLINE=1) and it "
        "is not in the local cache; download it where a hub is reachable (huggingface-cli download owner/no-model), "
        "or give a local directory or a built-in name (smollm2-135m-instruct)"
    ]


def test_os_error_from_a_library_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(*args: object, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\n" + "details\n" * 97)

    monkeypatch.setattr("selfrag.inference.ask.ask_many", unreachable)
    assert main([*ASK, "Q?"]) == 2
    assert stderr_lines(capsys) == [
        "selfrag ask: error: We couldn't connect to 'https://huggingface.co' to load the files; the hub is "
        "unreachable from here: give a local model directory or a built-in name, or download it where the hub is "
        "reachable (HF_HUB_OFFLINE=1 fails at once instead of retrying) (run with -v for details)"
    ]


def test_output_that_is_a_file_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def never(*args: object) -> None:
        raise AssertionError("the stage ran")

    monkeypatch.setattr("selfrag.data_gen.run.run", never)
    monkeypatch.setattr("selfrag.training.run.run", never)
    existing = tmp_path / "out.txt"
    existing.write_text("x")
    assert main(["generate", f"passages={DEMO_CORPUS}", f"queries={DEMO_QUERIES}", f"output={existing}"]) == 2
    assert stderr_lines(capsys) == [
        f"selfrag generate: error: output {str(existing)!r} is an existing file, not a directory; give a directory path"
    ]
    records = tmp_path / "records.jsonl"
    records.write_text("{}\n")
    assert main(["train", "model=m", f"records={records}", f"output_dir={records}"]) == 2
    assert stderr_lines(capsys) == [
        f"selfrag train: error: output_dir {str(records)!r} is an existing file, not a directory; give a directory path"
    ]


def test_an_unreachable_hub_id_is_one_line_with_the_fix() -> None:
    from selfrag.app.cli import _os_error_line

    error = OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in "
                    "the cached files.\nCheck your internet connection or see how to run the library in offline mode")
    line = _os_error_line(error)
    assert "\n" not in line and line.startswith("We couldn't connect to 'https://huggingface.co'")
    assert "give a local model directory or a built-in name" in line and "HF_HUB_OFFLINE=1" in line
    assert _os_error_line(OSError("No space left on device")) == "No space left on device"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_only_the_main_process_explains_and_the_others_wait_for_it(
    rank: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Launched as several processes, each fails alike: one line, and a quiet process does not exit first (the
    launcher stops every process the moment one exits, which silenced the main one's line)."""
    waited: list[float] = []
    monkeypatch.setattr("selfrag.app.cli.time.sleep", waited.append)
    monkeypatch.setenv("RANK", rank)
    assert main(["train", "records=r.jsonl", "model=m", f"output_dir={tmp_path}", "training.max_steps=many"]) == 2
    lines = stderr_lines(capsys)
    if rank == "0":
        assert len(lines) == 1 and lines[0].startswith("selfrag train: error:") and waited == []
    else:
        assert lines == [] and waited == [5.0]
