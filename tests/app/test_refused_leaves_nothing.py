"""A command refused on its inputs leaves no output folder behind (issue 56): `selfrag generate` with a wrong gold
passage id said so in one line and left `out/` holding only its owner file and fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.artifacts import save_trained_questions
from selfrag.errors import InputError
from selfrag.fsutil import OWNER_FILE, left_clean_if_refused


@pytest.fixture()
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    corpus, queries = tmp_path / "c.jsonl", tmp_path / "q.jsonl"
    corpus.write_text(json.dumps({"id": "p1", "title": "T", "text": "Paris is in France."}) + "\n")
    queries.write_text(json.dumps({"id": "q1", "question": "Where is Paris?", "answers": ["France"],
                                   "gold_passage_ids": ["p9"]}) + "\n")  # no passage p9: refused
    return corpus, queries


def test_a_refused_generate_leaves_no_folder(tmp_path: Path, inputs: tuple[Path, Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    corpus, queries = inputs
    output = tmp_path / "runs" / "data"  # runs/ is made by the command too
    assert main(["generate", f"passages={corpus}", f"queries={queries}", f"output={output}", "split=all"]) == 2
    assert "gold_passage_ids names 'p9'" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.jsonl", "q.jsonl"]


def test_a_refused_generate_into_an_empty_folder_of_the_users_keeps_the_folder(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    corpus, queries = inputs
    output = tmp_path / "mine"
    output.mkdir()
    assert main(["generate", f"passages={corpus}", f"queries={queries}", f"output={output}", "split=all"]) == 2
    assert output.is_dir() and list(output.iterdir()) == []


def test_a_refused_eval_leaves_no_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "Where is Paris?", "answers": ["France"]}) + "\n")
    model = tmp_path / "model"
    model.mkdir()
    save_trained_questions(model, ["Where is Paris?"])
    for command in ("eval", "calibrate"):
        output = tmp_path / f"{command}-out"
        assert main([command, f"data={data}", f"model={model}", f"output_dir={output}"]) == 2
        assert "trained-questions.json" in capsys.readouterr().err
        assert not output.exists(), command


def test_work_and_a_folder_of_an_earlier_run_are_kept(tmp_path: Path) -> None:
    output = tmp_path / "out"
    with pytest.raises(InputError), left_clean_if_refused(output, bookkeeping=("fingerprint.json",)):
        output.mkdir()
        (output / OWNER_FILE).write_text("{}")
        (output / "records.jsonl").write_text("{}\n")  # work: kept for a rerun
        raise InputError("refused")
    assert sorted(path.name for path in output.iterdir()) == [OWNER_FILE, "records.jsonl"]
    (output / "records.jsonl").unlink()
    with pytest.raises(InputError), left_clean_if_refused(output):  # not new: never removed
        raise InputError("refused")
    assert output.is_dir()
    with pytest.raises(RuntimeError), left_clean_if_refused(tmp_path / "bug"):  # a bug is not a refusal
        (tmp_path / "bug").mkdir()
        raise RuntimeError("bug")
    assert (tmp_path / "bug").is_dir()
