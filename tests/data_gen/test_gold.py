"""The gold labeler's records for each kind of query, and the distractor rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag import reflection as rf
from selfrag.corpus import Query, load_corpus, load_queries
from selfrag.data_gen.distractors import Evidence, find_evidence, is_distractor
from selfrag.data_gen.gold import ABSTAIN_TEXT, GoldLabeler
from selfrag.errors import InputError
from selfrag.retrieval import BM25Retriever
from selfrag.trajectory import parse_trajectory


@pytest.fixture
def setup(tiny_data: tuple[Path, Path]):  # type: ignore[no-untyped-def]
    passages = load_corpus(tiny_data[0])
    by_id = {p.id: p for p in passages}
    queries = {q.id: q for q in load_queries(tiny_data[1])}
    return by_id, queries, BM25Retriever(passages)


def label(setup, query_id: str, distractors: int = 2):  # type: ignore[no-untyped-def]
    by_id, queries, retriever = setup
    query = queries[query_id]
    (evidence,) = find_evidence([query], retriever, by_id, distractors)
    return GoldLabeler(by_id).label(query, evidence), evidence


def test_answerable(setup) -> None:  # type: ignore[no-untyped-def]
    records, evidence = label(setup, "q-answerable")
    assert [r.id for r in records] == ["q-answerable/gold", "q-answerable/distractor-0", "q-answerable/distractor-1"]
    assert records[0].render() == (
        "[Retrieval]<paragraph>Paris\nParis is the capital of France. It lies on the Seine.</paragraph>"
        "[Relevant]Paris[Fully supported][Utility:5]"
    )
    for record, passage in zip(records[1:], evidence.distractors, strict=True):
        assert record.render() == (
            f"[Retrieval]<paragraph>{passage.render()}</paragraph>[Irrelevant]{ABSTAIN_TEXT}"
            "[No support / Contradictory][Utility:1]"
        )
    # The quiz passage ranks high but names the answer (in capitals): never a distractor.
    assert {p.id for p in evidence.distractors}.isdisjoint({"paris-0-0", "paris-0-1", "quiz-0-0"})
    for record in records:
        assert record.instruction == "What is the capital of France?"
        assert record.meta["query_id"] == "q-answerable"
        labels = [record.utility] + [getattr(record.segments[0], s) for s in ("retrieve", "relevance", "support")]
        assert all(lbl is not None and lbl.labeler == "gold" and lbl.model is None for lbl in labels)


def test_unanswerable_uses_its_best_own_passage(setup) -> None:  # type: ignore[no-untyped-def]
    records, evidence = label(setup, "q-unanswerable", distractors=1)
    assert [r.id for r in records] == ["q-unanswerable/own-passage", "q-unanswerable/distractor-0"]
    assert evidence.own is not None and evidence.own.id == "paris-0-1"  # the Eiffel Tower passage
    assert records[0].render() == (
        "[Retrieval]<paragraph>Paris\nThe Eiffel Tower in the capital was built in 1889 for a fair.</paragraph>"
        f"[Irrelevant]{ABSTAIN_TEXT}[No support / Contradictory][Utility:1]"
    )
    # no relevant passage exists for an unanswerable question, and its abstain sentence is not trained
    assert records[0].meta["untrained_text"] is True
    assert records[1].segments[0].relevance.value == rf.IRRELEVANT  # type: ignore[union-attr]
    assert not evidence.distractors[0].id.startswith("paris")


def test_no_retrieval(setup) -> None:  # type: ignore[no-untyped-def]
    by_id, queries, _ = setup
    (record,) = GoldLabeler(by_id).label(queries["q-math"], Evidence(()))
    assert record.id == "q-math/no-retrieval"
    assert record.render() == "[No Retrieval]42[Utility:5]"


def test_every_record_parses_well_formed(setup) -> None:  # type: ignore[no-untyped-def]
    for query_id in ("q-answerable", "q-unanswerable", "q-rome"):
        for record in label(setup, query_id)[0]:
            assert parse_trajectory(record.render()).well_formed


def test_distractors_never_contain_an_answer(setup) -> None:  # type: ignore[no-untyped-def]
    by_id, queries, retriever = setup
    found = find_evidence(list(queries.values()), retriever, by_id, distractors=len(by_id))
    for query, evidence in zip(queries.values(), found, strict=True):
        for passage in evidence.distractors:
            text = passage.render().lower()
            assert not any(answer.lower() in text for answer in query.answers)
            assert passage.id not in query.meta.get("own_passage_ids", [])


def test_is_distractor_rule(setup) -> None:  # type: ignore[no-untyped-def]
    by_id, queries, _ = setup
    query = queries["q-answerable"]
    assert not is_distractor(query, by_id["paris-0-1"])  # own paragraph
    assert not is_distractor(query, by_id["quiz-0-0"])  # names the answer
    assert is_distractor(query, by_id["rome-0-0"])


def test_custom_abstain_text_and_missing_gold(setup) -> None:  # type: ignore[no-untyped-def]
    by_id, queries, retriever = setup
    (evidence,) = find_evidence([queries["q-unanswerable"]], retriever, by_id, 1)
    records = GoldLabeler(by_id, abstain_text="Unknown.").label(queries["q-unanswerable"], evidence)
    assert all(r.segments[0].text == "Unknown." for r in records)
    broken = Query("q-x", "Where?", answers=("x",), gold_passage_ids=("nowhere-0-0",), needs_retrieval=True)
    with pytest.raises(InputError, match="nowhere-0-0"):
        GoldLabeler(by_id).label(broken, Evidence(()))
    assert GoldLabeler(by_id).problem(Query("q-y", "Why?", answers=())) == "answerable without answers"


def test_a_long_form_output_gives_one_segment_per_sentence(setup) -> None:  # type: ignore[no-untyped-def]
    """form=long needs multi-sentence training data: a query's long-form `output` is written sentence by sentence,
    each on the gold passage that shares most words with it ([Continue to Use Evidence] on the same passage). The gold
    labeler used to write one segment per record whatever the answer."""
    by_id, _, _ = setup
    paris, eiffel = by_id["paris-0-0"], by_id["paris-0-1"]
    query = Query("q-long", "Tell me about Paris.", answers=("Paris",), gold_passage_ids=(paris.id, eiffel.id),
                  output="Paris is the capital of France. It lies on the Seine. The Eiffel Tower was built in 1889.")
    (record, *_) = GoldLabeler(by_id).label(query, Evidence(()))
    assert record.id == "q-long/gold" and len(record.segments) == 3
    assert record.render() == (
        f"[Retrieval]<paragraph>{paris.render()}</paragraph>[Relevant]Paris is the capital of France.[Fully supported]"
        "[Continue to Use Evidence] It lies on the Seine.[Fully supported]"
        f"[Retrieval]<paragraph>{eiffel.render()}</paragraph>[Relevant] The Eiffel Tower was built in 1889."
        "[Fully supported][Utility:5]"
    )
    parsed = parse_trajectory(record.render())
    assert parsed.well_formed and len(parsed.segments) == 3
    no_retrieval = Query("q-long-nr", "Say hello.", answers=("Hello",), needs_retrieval=False,
                         output="Hello! How are you?")
    (chat,) = GoldLabeler(by_id).label(no_retrieval, Evidence(()))
    assert chat.render() == "[No Retrieval]Hello![No Retrieval] How are you?[Utility:5]"


