"""``selfrag train form=rag``: the fine-tuned RAG baseline -- the same records, reflection tokens stripped, one
plain-RAG example per question, the same prompt `selfrag eval`'s plain_rag and ft_rag modes ask."""

from __future__ import annotations

from pathlib import Path

from test_train_run import make_config

from selfrag import reflection as rf
from selfrag.artifacts import load_trained_questions, question_key
from selfrag.evaluation.data import Example
from selfrag.evaluation.modes import _plain_prompt
from selfrag.jsonl import write_jsonl_atomic
from selfrag.training.rag_form import ABSTAIN_TEXT, rag_records
from selfrag.trajectory import Label, Passage, Record, Segment


def gold(value: str) -> Label:
    return Label(value, "gold")


GOLD = Passage("p-gold", "Normandy", "Normandy is where the Normans lived.")
HARD = Passage("p-hard", "Normandy", "Normandy has cows.")
EASY = Passage("p-easy", "Paris", "Paris is a city.")


def evidence(query: str, record: str, passage: Passage, relevant: bool, text: str, untrained: bool = False,
             support: str | None = None) -> Record:
    relevance = rf.RELEVANT if relevant else rf.IRRELEVANT
    verdict = support or (rf.FULLY_SUPPORTED if relevant else rf.NO_SUPPORT)
    segment = Segment(text, gold(rf.RETRIEVAL), passage, gold(relevance), gold(verdict))
    meta = {"query_id": query, **({"untrained_text": True} if untrained else {})}
    return Record(f"{query}/{record}", f"Question {query}?", (segment,), gold(rf.UTILITY_TOKENS[4]), meta=meta)


def question_records() -> list[Record]:
    """An answerable question (gold, hard and easy negatives, a support negative), an unanswerable one, a question
    answered without retrieval, and one whose only relevant record carries an unsupported response."""
    return [
        evidence("q1", "gold", GOLD, True, "The Normans lived in Normandy."),
        evidence("q1", "hard-0", HARD, False, ABSTAIN_TEXT, untrained=True),
        evidence("q1", "easy-0", EASY, False, ABSTAIN_TEXT, untrained=True),
        evidence("q1", "wrong-0", GOLD, True, "The Normans lived in Paris.", untrained=True, support=rf.NO_SUPPORT),
        evidence("q2", "hard-0", HARD, False, ABSTAIN_TEXT, untrained=True),
        Record("q3/gold", "What is two plus two?", (Segment("Four.", gold(rf.NO_RETRIEVAL)),),
               gold(rf.UTILITY_TOKENS[4]), meta={"query_id": "q3"}),
        evidence("q4", "gold", EASY, True, "Paris is lovely.", support=rf.NO_SUPPORT),
    ]


def test_each_question_becomes_one_plain_rag_example_without_reflection_tokens() -> None:
    converted = {record.meta["query_id"]: record for record in rag_records(question_records(), seed=0)}
    assert sorted(converted) == ["q1", "q2", "q3"]  # q4 has a relevant passage but no answer to train: left out
    answerable = converted["q1"]
    assert answerable.render() == "The Normans lived in Normandy."  # the gold answer, not the support negative's
    for passage in (GOLD, HARD, EASY):  # every passage of the question's records, each once
        assert answerable.instruction.count(passage.text) == 1
    assert converted["q2"].render() == ABSTAIN_TEXT  # no passage holds the answer: the abstain sentence
    assert converted["q3"].instruction == "What is two plus two?\nAnswer in one short sentence."
    assert converted["q3"].render() == "Four."
    for record in converted.values():
        assert not any(token in record.render() + record.instruction for token in rf.TOKENS)
        assert record.meta["form"] == "rag" and record.segments[0].retrieve is None
    assert converted["q1"].meta["question"] == "Question q1?"


def test_the_prompt_is_the_one_eval_asks_over_the_same_passages() -> None:
    answerable = rag_records(question_records(), seed=3)[0]
    order = sorted((GOLD, HARD, EASY), key=lambda passage: answerable.instruction.index(passage.text))
    example = Example(id="q1", question="Question q1?", answers=("Normandy",))
    assert _plain_prompt(example, order, ABSTAIN_TEXT, rag=True) == answerable.instruction


def test_the_passage_order_is_seeded() -> None:
    records = question_records()
    assert rag_records(records, seed=0) == rag_records(records, seed=0)
    orders = {rag_records(records, seed=seed)[0].instruction for seed in range(8)}
    assert len(orders) > 1  # the gold passage is not always in the same place


def test_form_rag_trains_the_answers_and_lists_the_questions(tiny_base_dir: Path, tmp_path: Path) -> None:
    from selfrag.training.run import run

    records = question_records()
    path = tmp_path / "records.jsonl"
    write_jsonl_atomic(path, [record.to_json() for record in records])
    config = make_config(tiny_base_dir, path, tmp_path / "rag", max_steps=6, eval_fraction=0.0, batch_size=2)
    config.form = "rag"
    result = run(config)
    losses = [entry["loss"] for entry in result.losses]
    assert losses[-1] < losses[0], losses
    assert result.train_examples == 3  # one example per question
    trained = load_trained_questions(tmp_path / "rag")
    assert trained == {question_key(q) for q in ("Question q1?", "Question q2?", "What is two plus two?")}
    assert (tmp_path / "rag" / "config.yaml").read_text(encoding="utf-8").count("form: rag") == 1
