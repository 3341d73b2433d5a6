"""A user's own questions file reads the same way in every command (issue 56, "own data").

`generate` accepted `{"question", "answerable": false}` (no answers) and `eval` refused it; `split=all` meant every
line in `generate` but a split named "all" in `eval` and `calibrate` ("holds no examples with meta.split='all'").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.corpus import load_queries
from selfrag.data_gen.queries import select_queries
from selfrag.evaluation.config import CalibrateConfig, EvalConfig
from selfrag.evaluation.data import load_examples
from selfrag.splits import EVERY_SPLIT, in_split

LINES = [
    {"id": "a", "question": "Who wrote it?", "answers": ["Ann"], "meta": {"split": "train"}},
    {"id": "b", "question": "What is the moon made of?", "answerable": False, "meta": {"split": "test"}},
    {"id": "c", "question": "Where is it?", "answer": "Rome", "meta": {"split": "dev"}},
    {"id": "d", "question": "When?", "answers": ["1900"]},
]


@pytest.fixture()
def questions(tmp_path: Path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in LINES), encoding="utf-8")
    return path


def test_an_unanswerable_line_without_answers_is_an_unanswerable_question(questions: Path) -> None:
    (example,) = load_examples(questions, split="test")
    assert example.id == "b" and not example.answerable and example.answers == ()
    assert [query.answerable for query in load_queries(questions)] == [True, False, True, True]  # as generate reads it


def test_an_answerable_line_without_answers_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "Who?"}) + "\n")
    with pytest.raises(ValueError, match=r'q.jsonl:1: no "answers"; give "answers": \["..."\] \(or "answerable"'):
        load_examples(path)


def test_split_all_is_every_line_in_eval_and_calibrate_as_in_generate(questions: Path) -> None:
    every = [example.id for example in load_examples(questions, split="all")]
    assert every == [example.id for example in load_examples(questions)] == ["a", "b", "c", "d"]
    assert [query.id for query in select_queries(load_queries(questions), "all", "0/1")] == ["a", "b", "c", "d"]
    assert [example.id for example in load_examples(questions, split="dev")] == ["c"]


def test_one_meaning_of_all() -> None:
    assert EVERY_SPLIT == "all"
    assert in_split("train", "all") and in_split(None, "all") and in_split("dev", None)
    assert in_split("dev", "dev") and not in_split("train", "dev") and not in_split(None, "dev")


@pytest.mark.parametrize("config", [EvalConfig, CalibrateConfig])
def test_help_config_says_what_all_means(config: type) -> None:
    from selfrag.config import describe

    (line,) = [line for line in describe(config) if line.startswith("split ")]
    assert "all or null: every line" in line
