"""Commands that write one file refuse a file they did not write, as output folders are refused (issue 56).

`echo '{"my":"data"}' > t.jsonl; selfrag paper-data import good.jsonl t.jsonl` said "imported 9 records" and the
file's content was gone; `python -m selfrag.app.distill ... OUT.jsonl` did the same to OUT.jsonl and OUT.base.jsonl.
A rerun onto the command's own earlier output writes it again whole (from its inputs: nothing old is mixed in).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.app import distill
from selfrag.app.cli import main
from selfrag.errors import InputError
from selfrag.fsutil import claim_output_file, mark_output_file

SAMPLE = Path(__file__).resolve().parents[1] / "assets" / "paper_train_sample.jsonl"
MINE = '{"my": "data"}\n'


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_paper_data_import_keeps_a_file_of_the_users(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "t.jsonl"
    target.write_text(MINE)
    assert main(["paper-data", "import", str(SAMPLE), str(target)]) == 2
    line = error_line(capsys)
    assert "is an existing file that `selfrag paper-data import` did not write" in line
    assert "give a new path, or delete the file" in line
    assert target.read_text() == MINE


def test_paper_data_rerun_rewrites_its_own_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "records.jsonl"
    assert main(["paper-data", "import", str(SAMPLE), str(target)]) == 0
    first = target.read_bytes()
    assert main(["paper-data", "import", str(SAMPLE), str(target)]) == 0  # the same command again: written again
    assert target.read_bytes() == first and "imported 9 records" in capsys.readouterr().out


def test_paper_data_export_keeps_the_imports_output_and_an_edited_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records, back = tmp_path / "records.jsonl", tmp_path / "paper.jsonl"
    assert main(["paper-data", "import", str(SAMPLE), str(records)]) == 0
    imported = records.read_bytes()
    assert main(["paper-data", "export", str(SAMPLE), str(records)]) == 2  # another command's output
    assert "(it is the output of `selfrag paper-data import`)" in error_line(capsys)
    assert records.read_bytes() == imported
    assert main(["paper-data", "export", str(records), str(back)]) == 0
    with back.open("a") as handle:
        handle.write(MINE)  # the user added a line to the export: now it holds their work
    assert main(["paper-data", "export", str(records), str(back)]) == 2
    assert "was written by `selfrag paper-data export` but changed since" in error_line(capsys)
    assert back.read_text().endswith(MINE)


def test_claim_output_file_refuses_a_directory_and_an_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory; give a file path"):
        claim_output_file(tmp_path, "selfrag x")
    source = tmp_path / "in.jsonl"
    source.write_text(MINE)
    mark_output_file(source, "selfrag x")  # even its own earlier output is never its input
    with pytest.raises(InputError, match="is also an input"):
        claim_output_file(source, "selfrag x", inputs=[source])


@pytest.fixture()
def distill_inputs(tmp_path: Path) -> tuple[Path, Path]:
    queries, corpus = tmp_path / "q.jsonl", tmp_path / "c.jsonl"
    queries.write_text(json.dumps({"id": "q1", "question": "What is the capital of France?", "answers": ["Paris"],
                                   "gold_passage_ids": ["p1"]}) + "\n")
    corpus.write_text(json.dumps({"id": "p1", "title": "France", "text": "Its capital is Paris."}) + "\n")
    return queries, corpus


@pytest.mark.parametrize("which", ["answers.jsonl", "answers.base.jsonl"])
def test_distill_keeps_a_file_of_the_users(which: str, tmp_path: Path, distill_inputs: tuple[Path, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / which).write_text(MINE)
    argv = [*map(str, distill_inputs), str(tmp_path / "answers.jsonl"), "--split", "all", "--form", "template"]
    assert distill.main(argv) == 2
    line = error_line(capsys)
    assert line.startswith("python -m selfrag.app.distill: error: output") and "did not write" in line, line
    assert (tmp_path / which).read_text() == MINE
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted({"q.jsonl", "c.jsonl", which})


def test_distill_rerun_rewrites_its_own_output(tmp_path: Path, distill_inputs: tuple[Path, Path]) -> None:
    argv = [*map(str, distill_inputs), str(tmp_path / "answers.jsonl"), "--split", "all", "--form", "template"]
    assert distill.main(argv) == 0
    first = (tmp_path / "answers.jsonl").read_text()
    assert json.loads(first) == {"id": "q1", "output": "The capital of France is Paris.", "how": "template"}
    assert distill.main(argv) == 0
    assert (tmp_path / "answers.jsonl").read_text() == first
