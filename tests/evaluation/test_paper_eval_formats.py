"""The paper's evaluation files (evaluation/paper_data.py) on small samples written from their published layouts,
and benchmarks/paper_reference.py through `selfrag eval` on a tiny "released" checkpoint (no selfrag.json, the 15
tokens in its tokenizer, no chat template: the paper's ``### Instruction:`` prompt)."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from selfrag.errors import InputError
from selfrag.evaluation.data import load_examples
from selfrag.evaluation.metrics import is_correct
from selfrag.evaluation.paper_data import PAPER_TASKS
from selfrag.jsonl import write_jsonl_atomic
from selfrag.reflection import TOKENS

ROOT = Path(__file__).resolve().parents[2]
CTXS = [{"id": "7", "title": "Normandy", "text": "Rollo founded Normandy in 911.", "score": "1.5", "hasanswer": True},
        {"id": "8", "title": "Paris", "text": "Paris is the capital of France.", "score": "1.2", "hasanswer": False}]
SAMPLES = {  # one or two lines per file, in the fields the released eval_data files carry
    "popqa": [{"id": 4222362, "question": "What is George Rankin's occupation?", "answers": ["politician",
               "political leader"], "s_wiki_title": "George Rankin", "prop": "occupation", "ctxs": CTXS},
              {"id": 1, "question": "Who founded Normandy?", "answers": ["Rollo"], "ctxs": CTXS}],
    "triviaqa": [{"question": "Who founded Normandy?", "answers": ["Rollo", "Rollo the Walker"], "ctxs": CTXS}],
    "pubhealth": [{"question": "Vitamin C cures the common cold.", "answers": ["false"], "ctxs": CTXS},
                  {"question": "Handwashing reduces infections.", "output": ["SUPPORTS"], "ctxs": CTXS}],
    "arc_challenge": [{"id": "Mercury_7175875", "question": "Which unit measures mass?",
                       "choices": {"text": ["meter", "kilogram", "liter", "second"], "label": ["1", "2", "3", "4"]},
                       "answerKey": "2", "ctxs": CTXS},
                      {"id": "Mercury_1", "question": "What is fastest?",
                       "choices": {"text": ["light", "sound", "a car"], "label": ["A", "B", "C"]},
                       "answerKey": "A", "ctxs": CTXS}],
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("eval_data")
    for task, rows in SAMPLES.items():
        write_jsonl_atomic(folder / PAPER_TASKS[task].file, rows)
    return folder


def test_open_qa_sets_use_the_question_alone_and_the_papers_match(data_dir: Path) -> None:
    for task in ("popqa", "triviaqa"):
        example = load_examples(data_dir / PAPER_TASKS[task].file, task)[0]
        assert example.prompt == example.question and example.kind == "qa" and example.metric == "match"
        assert [p.title for p in example.ctxs] == ["Normandy", "Paris"]
    record = {"kind": "qa", "answer": "He was a Canadian politician.", "gold_answers": ["politician"],
              "metric": "match"}
    assert is_correct(record) and not is_correct({**record, "metric": "exact"})


def test_pubhealth_is_a_claim_with_the_papers_fever_instruction(data_dir: Path) -> None:
    first, second = load_examples(data_dir / PAPER_TASKS["pubhealth"].file, "pubhealth")
    assert first.kind == "claim" and first.answers == ("false",) and second.answers == ("true",)
    assert first.prompt == ("Is the following statement correct or not? Say true if it's correct; otherwise say "
                            "false.\n\n## Input:\n\nVitamin C cures the common cold.")


def test_arc_reads_numeric_labels_as_letters_and_lists_the_choices_as_the_paper(data_dir: Path) -> None:
    numeric, lettered = load_examples(data_dir / PAPER_TASKS["arc_challenge"].file, "arc_challenge")
    assert numeric.answer_key == "B" and [label for label, _ in numeric.choices] == ["A", "B", "C", "D"]
    assert numeric.prompt == ("Given four answer candidates, A, B, C and D, choose the best answer choice.\n\n"
                              "### Input:\nWhich unit measures mass?\nA: meter\nB: kilogram\nC: liter\nD: second")
    assert lettered.prompt.endswith("\nC: a car\nD: ")  # three choices: the paper pads D
    assert is_correct({"kind": "choice", "answer": "B", "gold_answers": [], "answer_key": "B",
                       "choices": [list(c) for c in numeric.choices]})


def test_a_pubhealth_line_without_a_verdict_names_the_line_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "claims.jsonl"
    write_jsonl_atomic(path, [{"question": "x", "answers": ["maybe"]}])
    with pytest.raises(InputError, match=r"claims.jsonl:1: no verdict.*\"true\""):
        load_examples(path, "pubhealth")


@pytest.fixture(scope="module")
def released(tmp_path_factory, tiny_tokenizer, tiny_model_builder) -> Path:  # type: ignore[no-untyped-def]
    """Like selfrag/selfrag_llama2_7b: the 15 tokens added to the vocabulary, no chat template, no selfrag.json."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.add_tokens(list(TOKENS), special_tokens=True)
    tokenizer.chat_template = None
    folder = tmp_path_factory.mktemp("selfrag_tiny_released")
    tiny_model_builder(len(tokenizer)).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def test_the_reference_command_runs_every_set_for_each_model(data_dir, released, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("paper_reference", ROOT / "benchmarks" / "paper_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["paper_reference"] = module
    spec.loader.exec_module(module)
    out = tmp_path / "reference"
    assert module.main(["--data-dir", str(data_dir), "--model", str(released), "--limit", "1",
                        "--output", str(out)]) == 0
    report = json.loads((out / "reference.json").read_text())
    assert [row["task"] for row in report["rows"]] == list(PAPER_TASKS)
    assert all(isinstance(row[str(released)], float) for row in report["rows"])
    assert "| popqa | 54.9 |" in capsys.readouterr().out
    config = (out / module.slug(str(released)) / "arc_challenge" / "config.yaml").read_text()
    assert "format: arc_challenge" in config and "threshold: 0.2" in config and "top_k: 5" in config
    answers = [json.loads(line) for line in (out / module.slug(str(released)) / "popqa" / "records" /
                                             "single_pass.jsonl").read_text().splitlines()]
    assert answers and answers[0]["metric"] == "match"
    # a missing file is one line naming it
    assert module.main(["--data-dir", str(tmp_path), "--model", str(released), "--output", str(out)]) == 2
    assert "popqa_longtail_w_gs.jsonl" in capsys.readouterr().err
