from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from selfrag.corpus import load_corpus, load_queries
from selfrag.errors import InputError
from selfrag.jsonl import JsonlAppender, read_jsonl


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "a", "title": "", "text": "x"}\n\n{"id": "b", "text": \n')
    with pytest.raises(InputError, match=rf"{path}:3: not valid JSON"):
        load_corpus(path)


@pytest.mark.parametrize("newline", ["\n", ""])
def test_a_line_cut_short_names_its_real_column(tmp_path: Path, newline: str) -> None:
    # was "at column 1": the parser points past the newline, at a line that is not there (issue 44)
    path = tmp_path / "queries.jsonl"
    cut = '{"id": "q2", "question": "What is the capital of France and why is it so large and populous?", "answ'
    path.write_text('{"question": "ok?"}\n' + cut + newline)
    with pytest.raises(InputError) as error:
        list(read_jsonl(path))
    assert str(error.value).startswith(f"{path}:2: not valid JSON (the line ends at column {len(cut) + 1} before "
                                       "its JSON does: cut short, as by a killed write)"), str(error.value)
    path.write_text('{"question": "ok?", "x": tru}\n')
    with pytest.raises(InputError, match=r"queries.jsonl:1: not valid JSON \(Expecting value at column 26\)"):
        list(read_jsonl(path))


def test_a_missing_corpus_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="corpus file .* not found"):
        load_corpus(tmp_path / "none.jsonl")


@pytest.mark.parametrize(
    ("loader", "content", "expected"),
    [
        (load_queries, '{"question": "ok?"}\n{"query": "wrong key"}\n',
         ":2: field 'question' is missing; add \"question\" (str)"),
        (load_queries, '{"id": "1", "question": "A?"}\n{"id": "1", "question": "B?"}\n',
         ":2: duplicate query id '1' (first on line 1)"),
        (load_queries, '{"question": ""}\n', ":1: field 'question' is empty"),
        (load_queries, '{"question": "Q?", "output": 3}\n', ":1: field 'output' must be a non-empty string"),
        (load_corpus, '{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', ":2: duplicate passage id 'a'"),
        (load_corpus, '{"id": "a", "text": "x"}\n{"id": "b", "text": "  "}\n', ":2: field 'text' is empty"),
    ],
)
def test_a_wrong_line_is_named_by_file_and_line(tmp_path: Path, loader: Any, content: str, expected: str) -> None:
    path = tmp_path / "input.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=re.escape(f"{path}{expected}")):
        loader(path)


def test_folder_corpus(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "one.md").write_text("# One\nbody\n")
    (tmp_path / "docs" / "skip.bin").write_bytes(b"\0")
    passages = load_corpus(tmp_path / "docs")
    assert [(p.id, p.title, p.text) for p in passages] == [("one.md", "One", "body")]  # the heading is the title


def test_appender_resumes_after_a_killed_write(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with JsonlAppender(path) as out:
        out.write([{"id": 1}, {"id": 2}])
    with path.open("a") as handle:
        handle.write('{"id": 3, "tr')  # killed mid-line
    with JsonlAppender(path) as out:
        out.write([{"id": 3}])
    assert [row["id"] for _, row in read_jsonl(path)] == [1, 2, 3]


# --- DPR's psgs_w100.tsv form --------------------------------------------------------------------------------

DPR_TSV = (
    'id\ttext\ttitle\n'
    '1\t"Aaron Aaron ( or ; ""Ahärôn"") is a prophet, high priest, and the brother of Moses."\tAaron\n'
    '2\tSo Aaron went with his brother to speak to the people.\tAaron\n'
    '3\t"The Hebrew name is ""Aharon""; its meaning, ""mountain of strength"", is disputed."\t"Aaron, name"\n'
)


def test_dpr_tsv_corpus_reads_as_dpr_writes_it(tmp_path: Path) -> None:


    path = tmp_path / "psgs_w100.tsv"
    path.write_text(DPR_TSV, encoding="utf-8")
    passages = load_corpus(path)
    assert [p.id for p in passages] == ["1", "2", "3"]
    assert passages[0].text == 'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest, and the brother of Moses.'
    assert passages[0].title == "Aaron" and passages[2].title == "Aaron, name"
    assert passages[2].text.startswith('The Hebrew name is "Aharon"; its meaning, "mountain of strength"')


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("id\ttext\n1\tAaron\n", r"psgs_w100.tsv:1: the header must name the columns id, text and title"),
        ("id\ttext\ttitle\n1\tone\tA\n2\ttwo\n", r"psgs_w100.tsv:3: 2 tab-separated fields, expected 3"),
        ("id\ttext\ttitle\n1\tone\tA\n1\ttwo\tB\n", r"psgs_w100.tsv:3: duplicate passage id '1'"),
        ("id\ttext\ttitle\n", r"holds no passages"),
    ],
)
def test_dpr_tsv_mistakes_name_the_line(tmp_path: Path, content: str, expected: str) -> None:



    path = tmp_path / "psgs_w100.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=expected):
        load_corpus(path)
