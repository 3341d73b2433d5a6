from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.corpus import load_corpus, load_queries
from selfrag.errors import InputError
from selfrag.jsonl import JsonlAppender, read_jsonl


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "a", "title": "", "text": "x"}\n\n{"id": "b", "text": \n')
    with pytest.raises(InputError, match=rf"{path}:3: not valid JSON"):
        load_corpus(path)


def test_missing_files_and_fields(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="corpus file .* not found"):
        load_corpus(tmp_path / "none.jsonl")
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "ok?"}\n{"query": "wrong key"}\n')
    with pytest.raises(InputError, match=r"q.jsonl:2: field 'question' is missing; add \"question\" \(str\)"):
        load_queries(path)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(InputError, match="duplicate passage id 'a'"):
        load_corpus(dup)


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
