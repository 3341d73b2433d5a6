"""A recipe's corpus goes with its data: `calibrate --config calibrate-demo.yaml model=M data=my.jsonl` searched the
demo corpus for the user's questions without a word; a missing dev file now says how to make one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.data_gen import DEMO_CORPUS

REPO = Path(__file__).parents[2]


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and " INFO " not in line]
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def _questions(tmp_path: Path, gold: str = "velm-1", split: str | None = "dev") -> Path:
    data = tmp_path / "questions.jsonl"
    row = {"question": "When does the Velm tide turn?", "answers": ["twice a day"], "gold_passage_ids": [gold],
           **({"meta": {"split": split}} if split else {})}
    data.write_text(json.dumps(row) + "\n")
    return data


def test_calibrate_demo_recipe_requires_a_corpus_for_data_without_ctxs(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line(capsys, ["calibrate", "--config", str(REPO / "configs/eval/calibrate-demo.yaml"),
                              f"model={tmp_path}", f"data={_questions(tmp_path)}"])
    assert "have no ctxs and no retriever is set; pass retriever.corpus=FILE" in line


def test_a_recipe_corpus_is_not_kept_for_other_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line(capsys, ["eval", "--config", str(REPO / "configs/eval/demo.yaml"), f"model={tmp_path}",
                              f"data={_questions(tmp_path)}", f"output_dir={tmp_path / 'out'}"])
    assert "but its corpus (data_gen/demo/corpus.jsonl) goes with that data; pass retriever.corpus=YOUR_CORPUS" in line


def test_a_corpus_without_any_gold_passage_of_the_data_is_refused(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line(capsys, ["calibrate", f"model={tmp_path}", f"data={_questions(tmp_path)}",
                              f"retriever.corpus={DEMO_CORPUS}"])
    assert "holds none of the 1 gold passage ids of the data (e.g. 'velm-1')" in line


def test_a_missing_dev_file_says_how_to_make_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line(capsys, ["calibrate", f"model={tmp_path}", f"data={tmp_path / 'dev.jsonl'}",
                              f"retriever.corpus={DEMO_CORPUS}"])
    assert "calibration needs held-out dev questions" in line and '"meta": {"split": "dev"}' in line
    line = _one_line(capsys, ["calibrate", f"model={tmp_path}", f"data={_questions(tmp_path, split='train')}",
                              f"retriever.corpus={DEMO_CORPUS}", "split=dev"])
    assert "meta.split='dev'" in line and "docs/own-data.md" in line


def test_generate_over_the_demo_recipe_needs_the_queries_corpus(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line(capsys, ["generate", "--config", str(REPO / "configs/data_gen/squad-demo.yaml"),
                              f"queries={_questions(tmp_path, split='train')}", f"output={tmp_path / 'out'}"])
    assert "queries= replaces the queries of" in line and "pass passages=YOUR_CORPUS too" in line
