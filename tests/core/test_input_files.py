"""Input files: decoding and schema errors as ``file:line: what, fix``; inputs that cannot be right are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.corpus import load_corpus, load_queries
from selfrag.errors import InputError
from selfrag.jsonl import UniqueIds, mapping_field, read_jsonl, require_fields, string_list


def error_of(call, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as caught:
        call(*args)
    return str(caught.value)


@pytest.mark.parametrize("what", ["corpus", "queries", "records"])
def test_a_byte_that_is_not_utf8_names_file_line_and_column(tmp_path: Path, what: str) -> None:
    path = tmp_path / f"{what}.jsonl"
    path.write_bytes(b'{"id": "a", "text": "fine"}\n{"id": "b", "text": "caf\xe9"}\n')
    assert error_of(lambda: list(read_jsonl(path, what))) == (
        f"{path}:2: not UTF-8 text (byte 0xe9 at column 25); "
        "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove that character"
    )


def test_corpus_and_queries_loaders_report_the_bad_byte(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b'{"id": "a", "title": "T\xff", "text": "x"}\n')
    # (The data branch checks the whole file first with its own wording; both name file:line, byte and column.)
    message = error_of(load_corpus, corpus)
    assert message.startswith(f"{corpus}:1: ") and all(part in message for part in ("0xff", "column 24", "UTF-8"))
    queries = tmp_path / "queries.jsonl"
    queries.write_bytes(b'{"question": "ok?"}\n\n{"question": "\x80"}\n')
    message = error_of(load_queries, queries)
    assert message.startswith(f"{queries}:3: ") and all(part in message for part in ("0x80", "column 15", "UTF-8"))


def test_bom_and_blank_lines_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"question": "one?"}\n\n{"question": "two?"}\n')
    assert [query.question for query in load_queries(path)] == ["one?", "two?"]


def test_a_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('["question"]\n')
    assert error_of(lambda: list(read_jsonl(path, "queries"))) == (
        f"{path}:1: expected a JSON object {{...}}, got list; each line of the queries file must be one JSON object"
    )


def test_empty_passage_text_is_refused(tmp_path: Path) -> None:
    # An empty passage with an empty answer was labelled [Relevant]...[Fully supported][Utility:5].
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "a", "title": "T", "text": "fine"}\n{"id": "b", "title": "T", "text": "   "}\n')
    assert error_of(load_corpus, path) == f"{path}:2: field 'text' is empty; give it a text or delete that line"


def test_empty_question_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": ""}\n')
    assert error_of(load_queries, path) == f"{path}:1: field 'question' is empty; give it a text or delete that line"


def test_gold_passage_ids_as_a_string_is_refused_not_split_into_characters(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "q?", "gold_passage_ids": "p12"}\n')
    assert error_of(load_queries, path) == (
        f"""{path}:1: field 'gold_passage_ids' must be a list of strings, got the string 'p12'; """
        """write "gold_passage_ids": ["p12"]"""
    )


def test_meta_as_a_string_is_refused_with_file_line(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "q?", "meta": "train"}\n')
    assert error_of(load_queries, path) == (
        f"""{path}:1: field 'meta' must be a JSON object like {{"split": "train"}}, got 'train'; fix that line"""
    )


def test_helpers_for_stage_loaders() -> None:
    assert string_list({"ids": ["a", 3]}, "ids", "f:1") == ("a", "3")
    assert string_list({}, "ids", "f:1") == ()
    assert mapping_field({"meta": None}, "meta", "f:1") == {}
    assert error_of(string_list, {"ids": [None]}, "ids", "f:1") == (
        "f:1: field 'ids' must be a list of strings, got [None]; fix that line"
    )
    assert error_of(require_fields, {"n": True}, ("n",), "f:2", int) == (
        "f:2: field 'n' must be a int, got True; fix that line"
    )


def test_duplicate_ids_name_both_lines() -> None:
    # Duplicate query ids silently dropped the second question; the loader should call UniqueIds.add per line.
    ids = UniqueIds("query id")
    ids.add("q1", "queries.jsonl:1")
    ids.add("q2", "queries.jsonl:2")
    assert error_of(ids.add, "q1", "queries.jsonl:7") == (
        "queries.jsonl:7: duplicate query id 'q1' (first at queries.jsonl:1); "
        "each query id must be unique — rename or delete one of them"
    )
