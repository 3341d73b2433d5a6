"""The evaluation data formats: what parses, and the file:line message of each mistake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from selfrag.errors import InputError
from selfrag.evaluation.data import (
    load_examples,
    load_reflection_labels,
    records_to_label_rows,
)
from selfrag.trajectory import Label, Passage, Record, Segment


def write(tmp_path: Path, *rows: Any, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_qa_with_and_without_ctxs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"question": "Capital of France?", "answers": ["Paris"], "ctxs": [{"title": "Paris", "text": "Paris is."}]},
        {"id": "q2", "question": "Unknowable?", "answers": [], "answerable": False},
        {"question": "2+2?", "answer": "4", "needs_retrieval": False},
    )
    first, second, third = load_examples(path)
    assert first.kind == "qa" and first.answers == ("Paris",) and first.ctxs[0].title == "Paris"
    assert first.id == "data-1" and second.id == "q2" and not second.answerable
    assert third.answers == ("4",) and third.needs_retrieval is False and third.ctxs == ()


def test_split_keeps_only_that_split(tmp_path: Path) -> None:
    path = write(tmp_path, {"question": "a?", "answers": ["a"], "meta": {"split": "train"}},
                 {"question": "b?", "answers": ["b"], "meta": {"split": "test"}})
    assert [e.question for e in load_examples(path, split="test")] == ["b?"]
    with pytest.raises(InputError, match="meta.split='dev'"):
        load_examples(path, split="dev")


def test_closed_set_arc_style(tmp_path: Path) -> None:
    path = write(tmp_path, {"question": "Which is an amphibian?",
                            "choices": {"text": ["dog", "frog"], "label": ["A", "B"]}, "answerKey": "B"})
    (example,) = load_examples(path)
    assert example.kind == "choice" and example.answer_key == "B" and example.answers == ("frog", "B")
    assert "A. dog\nB. frog" in example.prompt


def test_claims(tmp_path: Path) -> None:
    path = write(tmp_path, {"claim": "Paris is in France.", "label": True},
                 {"claim": "Lyon is a river.", "label": "false"})
    first, second = load_examples(path)
    assert first.kind == "claim" and first.answers == ("true",) and "Paris is in France." in first.question
    assert second.answers == ("false",)


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({"answers": ["x"]}, "field 'question' must be a non-empty string"),
        ({"question": "q?"}, 'no "answers"'),
        ({"question": "q?", "answers": "Paris"}, "field 'answers' must be a list of strings"),
        ({"question": "q?", "answers": []}, '"answers" is empty'),
        ({"question": "q?", "answers": ["a"], "answerable": "yes"}, "'answerable' must be true or false"),
        ({"question": "q?", "answers": ["a"], "ctxs": [{"title": "t"}]}, "ctxs[0] must be an object with a string"),
        ({"question": "q?", "answers": ["a"], "ctxs": "text"}, "'ctxs' must be a list"),
        ({"question": "q?", "choices": ["a", "b"], "answerKey": "A"}, '"choices" must be {"text"'),
        ({"question": "q?", "choices": {"text": ["a", "b"], "label": ["A"]}, "answerKey": "A"}, "2 texts and 1 labels"),
        ({"question": "q?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "E"},
         "answerKey 'E' is not one of the choice labels"),
        ({"claim": "x", "label": "maybe"}, 'field "label" must be true or false'),
    ],
)
def test_format_errors_name_file_and_line(tmp_path: Path, row: dict[str, Any], fragment: str) -> None:
    ok = {"question": "fine?", "answers": ["yes"]} if "claim" not in row and "choices" not in row else row
    path = write(tmp_path, *([ok, row] if ok is not row else [row, row]))
    line = 2 if ok is not row else 1
    with pytest.raises(InputError) as error:
        load_examples(path, data_format="auto" if ok is row else "qa" if "choices" not in row else "choice")
    assert f"{path}:{line}:" in str(error.value) and fragment in str(error.value)


def test_bad_json_and_duplicates_and_empty(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"data.jsonl:2: not valid JSON"):
        load_examples(write(tmp_path, {"question": "a?", "answers": ["a"]}, '{"question": '))
    with pytest.raises(InputError, match=r"data.jsonl:2: duplicate id 'x' \(first on line 1\)"):
        load_examples(write(tmp_path, {"id": "x", "question": "a?", "answers": ["a"]},
                            {"id": "x", "question": "b?", "answers": ["b"]}))
    with pytest.raises(InputError, match="holds no examples"):
        load_examples(write(tmp_path, ""))
    with pytest.raises(InputError, match="not found"):
        load_examples(tmp_path / "missing.jsonl")


def test_reflection_labels_any_subset(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"question": "q?", "passage": {"title": "T", "text": "x"}, "answer": "a",
         "labels": {"relevance": "[Relevant]", "support": "Fully supported", "utility": "Utility:5"}},
        {"question": "2+2?", "labels": {"retrieve": "[No Retrieval]"}},
    )
    first, second = load_reflection_labels(path)
    assert first.labels == {"relevance": "[Relevant]", "support": "[Fully supported]", "utility": "[Utility:5]"}
    assert second.passage is None and second.labels == {"retrieve": "[No Retrieval]"}


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({"question": "q?", "labels": {"relevancy": "[Relevant]"}}, "unknown label type 'relevancy'"),
        ({"question": "q?", "passage": {"text": "x"}, "labels": {"relevance": "[Fully supported]"}},
         "labels.relevance must be one of ['[Relevant]', '[Irrelevant]']"),
        ({"question": "q?", "labels": {"relevance": "[Relevant]"}}, 'add "passage"'),
        ({"question": "q?", "passage": {"text": "x"}, "labels": {"support": "[Fully supported]"}}, 'add "answer"'),
        ({"question": "q?", "labels": {}}, 'field "labels" must map'),
        ({"question": "q?", "passage": "x", "labels": {"retrieve": "[Retrieval]"}}, 'field "passage" must be'),
    ],
)
def test_reflection_label_errors(tmp_path: Path, row: dict[str, Any], fragment: str) -> None:
    path = write(tmp_path, row)
    with pytest.raises(InputError) as error:
        load_reflection_labels(path)
    assert f"{path}:1:" in str(error.value) and fragment in str(error.value)


def test_records_to_label_rows() -> None:
    gold = Label("[Relevant]", "gold")
    record = Record(
        id="r1", instruction="Who?",
        segments=(Segment("Rollo.", Label("[Retrieval]", "gold"), Passage("p", "T", "Rollo led."), gold,
                          Label("[Fully supported]", "gold")),),
        utility=Label("[Utility:5]", "gold"),
    )
    (row,) = records_to_label_rows([record])
    assert row["labels"] == {"retrieve": "[Retrieval]", "relevance": "[Relevant]", "support": "[Fully supported]",
                             "utility": "[Utility:5]"}
    assert row["passage"]["text"] == "Rollo led." and row["answer"] == "Rollo."


