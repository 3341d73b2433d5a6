"""Gold sources: each converter on a hand-made example keeps the data set's evidence as the gold passages."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from selfrag.corpus import load_corpus, load_queries
from selfrag.data_gen.converters import convert
from selfrag.errors import InputError

SLICES = Path(__file__).resolve().parents[2] / "data_gen" / "slices"


def test_hotpotqa_supporting_facts_are_gold(tmp_path: Path) -> None:
    row = {
        "id": "h1",
        "question": "Were A and B both painters?",
        "answer": "yes",
        "type": "comparison",
        "level": "easy",
        "supporting_facts": {"title": ["A", "B"], "sent_id": [0, 0]},
        "context": {
            "title": ["A", "C", "B"],
            "sentences": [["A was a painter.", " Born 1900."], ["C is a town."], ["B painted."]],
        },
    }
    (tmp_path / "h.json").write_text(json.dumps([row]))
    convert("hotpotqa", tmp_path / "h.json", tmp_path / "out")
    (query,) = load_queries(tmp_path / "out" / "queries.jsonl")
    passages = {p.id: p for p in load_corpus(tmp_path / "out" / "corpus.jsonl")}
    assert query.gold_passage_ids == ("hotpotqa-h1/0", "hotpotqa-h1/2") and query.answers == ("yes",)
    assert passages["hotpotqa-h1/0"].text == "A was a painter. Born 1900." and passages["hotpotqa-h1/1"].title == "C"
    assert query.meta["own_passage_ids"] == ["hotpotqa-h1/0", "hotpotqa-h1/1", "hotpotqa-h1/2"]
    assert query.meta["source"] == "hotpotqa" and query.meta["split"] in ("train", "test")


def test_nq_open_oracle_passage_is_gold(tmp_path: Path) -> None:
    row = {"question": "who?", "answers": ["X"], "ctxs": [{"title": "T", "text": "X did it.", "isgold": True}]}
    with gzip.open(tmp_path / "nq.jsonl.gz", "wt") as handle:
        handle.write(json.dumps(row) + "\n")
    convert("nq-open", tmp_path / "nq.jsonl.gz", tmp_path / "out")
    (query,) = load_queries(tmp_path / "out" / "queries.jsonl")
    assert query.gold_passage_ids == ("nq-0/0",) and query.needs_retrieval is True


def test_skip_leaves_out_the_first_questions_and_only_their_passages(tmp_path: Path) -> None:
    rows = [{"question": f"q{n}?", "answers": [f"A{n}"],
             "ctxs": [{"title": "T", "text": f"A{n} did it.", "isgold": True}]} for n in range(12)]
    with gzip.open(tmp_path / "nq.jsonl.gz", "wt") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    assert convert("nq-open", tmp_path / "nq.jsonl.gz", tmp_path / "out", limit=3, skip=10) == (2, 2)
    queries = load_queries(tmp_path / "out" / "queries.jsonl")
    passages = load_corpus(tmp_path / "out" / "corpus.jsonl")
    # the ids keep the file's own numbering, so a second slice never collides with the first
    assert [q.id for q in queries] == ["nq-10", "nq-11"] and [p.id for p in passages] == ["nq-10/0", "nq-11/0"]
    assert convert("nq-open", tmp_path / "nq.jsonl.gz", tmp_path / "more", limit=2, skip=1) == (2, 2)
    assert [q.question for q in load_queries(tmp_path / "more" / "queries.jsonl")] == ["q1?", "q2?"]
    with pytest.raises(InputError, match="--skip must be >= 0"):
        convert("nq-open", tmp_path / "nq.jsonl.gz", tmp_path / "bad", skip=-1)


def test_retrievalqa_answer_bearing_context_is_gold_and_none_means_unanswerable(tmp_path: Path) -> None:
    rows = [
        {
            "question_id": "r1",
            "question": "Q1?",
            "ground_truth": "['15%']",
            "data_source": "realtimeqa",
            "context": "[{'title': 'a', 'text': 'Only 1.4% here.'}, {'title': 'b', 'text': 'About 15% of couples.'}]",
        },
        {
            "question_id": "r2",
            "question": "Q2?",
            "ground_truth": ["none"],
            "data_source": "toolqa",
            "context": ["a plain string passage", {"title": "only a title"}],
        },
    ]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    convert("retrievalqa", tmp_path / "r.jsonl", tmp_path / "out")
    first, second = load_queries(tmp_path / "out" / "queries.jsonl")
    assert first.gold_passage_ids == ("retrievalqa-r1/1",) and first.answerable and first.needs_retrieval
    assert second.gold_passage_ids == () and not second.answerable
    assert [p.id for p in load_corpus(tmp_path / "out" / "corpus.jsonl")] == [
        "retrievalqa-r1/0",
        "retrievalqa-r1/1",
        "retrievalqa-r2/0",
    ]


def test_retrievalqa_parametric_knowledge_label_means_no_retrieval(tmp_path: Path) -> None:
    """The full retrievalqa.jsonl labels each question; the gpt4 subset (no field) keeps needs_retrieval: true."""
    rows = [
        {
            "question_id": "p1",
            "question": "Capital of France?",
            "ground_truth": ["Paris"],
            "data_source": "popqa",
            "context": [{"title": "Paris", "text": "Paris is the capital."}],
            "param_knowledge_answerable": 1,
        },
        {
            "question_id": "p2",
            "question": "Who won?",
            "ground_truth": ["Ann"],
            "data_source": "realtimeqa",
            "context": [{"title": "News", "text": "Ann won the race."}],
            "param_knowledge_answerable": 0,
        },
        {"question_id": "p3", "question": "Q3?", "ground_truth": ["x"], "context": []},
    ]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    convert("retrievalqa", tmp_path / "r.jsonl", tmp_path / "out")
    parametric, retrieval, plain = load_queries(tmp_path / "out" / "queries.jsonl")
    assert parametric.needs_retrieval is False and parametric.answerable and parametric.answers == ("Paris",)
    assert retrieval.needs_retrieval is True and retrieval.gold_passage_ids == ("retrievalqa-p2/0",)
    assert plain.needs_retrieval is True and not plain.answerable
    rows[1]["param_knowledge_answerable"] = "yes"
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(InputError, match=r"r.jsonl:2: field 'param_knowledge_answerable' must be 0 or 1, got 'yes'"):
        convert("retrievalqa", tmp_path / "r.jsonl", tmp_path / "out")


def test_shipped_retrievalqa_source_has_no_parametric_label() -> None:
    """retrievalqa_gpt4.jsonl (the slice's source) is need-retrieval only: every slice question retrieves."""
    assert all(q.needs_retrieval is True for q in load_queries(SLICES / "retrievalqa" / "queries.jsonl"))


def test_begin_attribution_becomes_the_support_label(tmp_path: Path) -> None:
    header = "model_name\tdata_source\tknowledge\tmessage\tresponse\tbegin_label\n"
    lines = [
        "t5\twow\tK one.\tM one?\tR one.\tFully attributable\n",
        "gpt2\twow\tK two.\tM two?\tR two.\tNot fully attributable\n",
        "gpt2\twow\tK three.\tM three?\tHello!\tGeneric\n",
    ]
    (tmp_path / "b.tsv").write_text(header + "".join(lines))
    convert("begin", tmp_path / "b.tsv", tmp_path / "out")
    first, second = load_queries(tmp_path / "out" / "queries.jsonl")
    assert (first.question, first.output, first.meta["support"]) == ("M one?", "R one.", "[Fully supported]")
    assert second.meta["support"] == "[No support / Contradictory]" and len(first.gold_passage_ids) == 1


def test_unknown_source_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown source 'squad'"):
        convert("squad", tmp_path / "x", tmp_path / "out")
    with pytest.raises(InputError, match="PROVENANCE"):
        convert("begin", tmp_path / "missing.tsv", tmp_path / "out")


@pytest.mark.parametrize("name", ["hotpotqa", "nq-open", "nq-open-more", "retrievalqa", "begin"])
def test_shipped_slices_load(name: str) -> None:
    queries = load_queries(SLICES / name / "queries.jsonl")
    passages = {p.id for p in load_corpus(SLICES / name / "corpus.jsonl")}
    assert len(queries) >= 40
    assert all(set(q.gold_passage_ids) <= passages for q in queries)
