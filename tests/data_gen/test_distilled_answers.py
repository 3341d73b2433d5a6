"""Self-distilled answers (the data recipe's ``answers``) and further query files (``more_queries``): the gold
labeler trains each listed question's whole-sentence answer instead of its bare span, and the demo's word-answer
no-retrieval questions join the training data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from selfrag import reflection as rf
from selfrag.app.distill import fallback, keep_base
from selfrag.config import load_config
from selfrag.corpus import Query, load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_DIR, DEMO_QUERIES
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.run import run
from selfrag.errors import ConfigError, InputError
from selfrag.trajectory import Passage, Record

GENERAL = DEMO_DIR / "general-knowledge.jsonl"


def _config(output: Path, **extra: object) -> GenerateConfig:
    overrides = [f"{key}={value}" for key, value in extra.items()]
    return load_config(GenerateConfig, None, overrides, passages=str(DEMO_CORPUS), queries=str(DEMO_QUERIES),
                       output=str(output))


def _answer_text(record: Record) -> str:
    return "".join(segment.text for segment in record.segments)


def test_keep_base_cuts_at_the_sentence_holding_the_gold_and_refuses_abstentions() -> None:
    assert keep_base("Paris is the capital. It is in France.", ["Paris"], "The sources do not say.") == (
        "Paris is the capital.")
    assert keep_base("It is big. The capital is Paris. More text.", ["paris"], "No idea.") == (
        "It is big. The capital is Paris.")
    assert keep_base("The capital is Lyon.", ["Paris"], "No idea.") is None
    assert keep_base("The sources do not say. Paris.", ["Paris"], "The sources do not say.") is None
    assert keep_base("", ["Paris"], "No idea.") is None


def test_fallback_is_the_gold_passage_sentence_around_the_span_else_the_span() -> None:
    query = Query(id="q", question="Who?", answers=("Kublai Khan",), gold_passage_ids=("p",))
    gold = Passage(id="p", title="Yuan", text="The dynasty began in 1271. It was founded by Kublai Khan. It ended.")
    assert fallback(query, gold) == ("It was founded by Kublai Khan.", "sentence")
    assert fallback(query, None) == ("Kublai Khan.", "span")


def test_answers_replace_the_span_and_more_queries_join_after_the_limit(tmp_path: Path) -> None:
    train = [q for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "train"][:30]
    answerable = [q for q in train if q.answerable and q.needs_retrieval is not False]
    answers = tmp_path / "answers.jsonl"
    listed = {q.id: f"The answer is {q.answers[0]}, as the passage says." for q in answerable[:5]}
    answers.write_text("".join(json.dumps({"id": k, "output": v}) + "\n" for k, v in listed.items()))

    result = run(_config(tmp_path / "out", limit=30, answers=answers, more_queries=f"[{GENERAL}]", heldout=0))
    records = [Record.from_json(json.loads(line)) for line in result.records_path.read_text().splitlines()]
    golds = {r.meta["query_id"]: r for r in records if r.meta["kind"] == "gold"}
    for query_id, text in listed.items():  # the listed answer is trained, on the gold passage, fully supported
        assert _answer_text(golds[query_id]) == text
        assert golds[query_id].segments[0].relevance.value == rf.RELEVANT  # type: ignore[union-attr]
        assert golds[query_id].segments[-1].support.value == rf.FULLY_SUPPORTED  # type: ignore[union-attr]
    negatives = {r.meta["query_id"]: r for r in records if r.meta["kind"] == "support-negative"}
    for query_id, text in listed.items():  # the wrong answer sits in the trained sentence, not alone
        if query_id in negatives:
            wrong = _answer_text(negatives[query_id])
            assert wrong != text and wrong.startswith("The answer is ") and wrong.endswith(", as the passage says.")
    unlisted = next(q for q in answerable[5:])
    assert _answer_text(golds[unlisted.id]) == unlisted.answers[0]  # not listed: the span, as before
    general = load_queries(GENERAL)
    no_retrieval = {r.meta["query_id"]: r for r in records if r.meta["kind"] == "no-retrieval"}
    assert {q.id for q in general} <= set(no_retrieval)  # every further question, after the 30 selected
    assert result.stats["run"]["queries_selected"] == 30 + len(general)


def test_a_bad_answers_line_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    answers = tmp_path / "answers.jsonl"
    answers.write_text('{"id": "a", "output": "fine"}\n{"id": "b", "output": ""}\n')
    with pytest.raises(InputError, match=r"answers\.jsonl:2: an answers line needs a string 'id' and a non-empty"):
        run(_config(tmp_path / "out", limit=5, answers=answers))


def test_answers_are_refused_with_the_teacher_labeler(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="more_queries, answers and more_answers are read by labeler=gold only"):
        load_config(GenerateConfig, None, ["labeler=llm", "teacher.model=m", f"answers={tmp_path / 'a.jsonl'}"],
                    queries=str(DEMO_QUERIES), passages=str(DEMO_CORPUS), output=str(tmp_path / "o"))


_NUMBER = re.compile(r"^[\d.,\s]+$")


def test_the_word_answer_questions_are_no_retrieval_training_questions_with_word_answers() -> None:
    general = load_queries(GENERAL)
    assert len(general) >= 60 and len({q.id for q in general}) == len(general)
    demo = load_queries(DEMO_QUERIES)
    assert not {q.id for q in general} & {q.id for q in demo}
    # none repeats a held-out (test) question, so mode=never on the test questions stays a held-out measurement
    held_out = {q.question.lower() for q in demo if q.meta.get("split") == "test"}
    for query in general:
        assert query.needs_retrieval is False and query.answerable and query.meta["split"] == "train"
        assert query.question.lower() not in held_out
        assert not _NUMBER.match(query.answers[0]), query


def test_a_support_negative_keeps_the_answer_sentence_with_the_wrong_answer_in_the_span() -> None:
    from selfrag.data_gen.gold import swapped_answer

    query = Query(id="q", question="Who?", answers=("Kublai Khan",), output="It was founded by Kublai Khan.")
    assert swapped_answer(query, "Genghis Khan") == "It was founded by Genghis Khan."
    assert swapped_answer(Query(id="q", question="Who?", answers=("Kublai Khan",)), "Ögedei") == "Ögedei"
    assert swapped_answer(Query(id="q", question="Who?", answers=("X",), output="No span here."), "Y") == "Y"
