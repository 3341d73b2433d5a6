"""Critic rows of the gold path: exactly the decisions the gold rule implies, in the teacher path's schema."""

from __future__ import annotations

from typing import Any

from test_gold_rule import BY_ID, FOUNDED, FRANCE, LOUVRE, ROME, UNANSWERABLE, evidence

from selfrag import reflection as rf
from selfrag.corpus import Query
from selfrag.data_gen.assembly import Outcome, critic_row
from selfrag.data_gen.distractors import Evidence, NegativeMix
from selfrag.data_gen.gold import ABSTAIN_TEXT, GoldLabeler
from selfrag.data_gen.gold_outputs import critic_rows, render_critic
from selfrag.data_gen.labelers import LabelItem
from selfrag.trajectory import Label, Passage, Record, Segment


def summary(rows: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None, str]]:
    """(task, passage id, output, target) of each row, in order."""
    return [(r["task"], r["passage"] and r["passage"]["id"], r["output"], r["target"]) for r in rows]


def gold_label(value: str) -> Label:
    return Label(value, "gold")


def supported_segment(text: str, passage: Passage) -> Segment:
    """``text`` after a gold [Retrieval] of ``passage``, judged [Relevant] and [Fully supported]."""
    return Segment(text, gold_label(rf.RETRIEVAL), passage, gold_label(rf.RELEVANT), gold_label(rf.FULLY_SUPPORTED))


def test_unanswerable_own_paragraph_is_irrelevant_and_nothing_is_supported() -> None:
    (found,) = evidence([UNANSWERABLE], NegativeMix(retrieved=1)).values()
    records = GoldLabeler(BY_ID).label(UNANSWERABLE, found)
    (distractor,) = found.distractors
    assert summary(critic_rows(records)) == [
        # q-none/distractor-0 comes first (records are taken in id order)
        ("retrieve", None, None, rf.RETRIEVAL),
        ("relevance", distractor.id, None, rf.IRRELEVANT),
        ("support", distractor.id, ABSTAIN_TEXT, rf.NO_SUPPORT),
        ("utility", None, ABSTAIN_TEXT, rf.UTILITY_TOKENS[0]),
        # q-none/own-passage: its retrieve and utility decisions are the same as above, written once
        ("relevance", "paris-0-0", None, rf.IRRELEVANT),
        ("support", "paris-0-0", ABSTAIN_TEXT, rf.NO_SUPPORT),
    ]


def test_answerable_with_a_support_negative() -> None:
    found = evidence([FRANCE, ROME, LOUVRE, FOUNDED], NegativeMix(retrieved=1, support=1))
    records = GoldLabeler(BY_ID).label(FRANCE, found["q-france"])
    assert [r.id for r in records] == ["q-france/gold", "q-france/support-negative-0", "q-france/distractor-0"]
    distractor = found["q-france"].distractors[0].id
    rows = critic_rows(records)
    assert summary(rows) == [
        ("retrieve", None, None, rf.RETRIEVAL),
        ("relevance", distractor, None, rf.IRRELEVANT),
        ("support", distractor, ABSTAIN_TEXT, rf.NO_SUPPORT),
        ("utility", None, ABSTAIN_TEXT, rf.UTILITY_TOKENS[0]),
        ("relevance", "paris-0-0", None, rf.RELEVANT),
        ("support", "paris-0-0", "Paris", rf.FULLY_SUPPORTED),
        ("utility", None, "Paris", rf.UTILITY_TOKENS[-1]),
        # the support negative: the same relevant passage, another question's answer -> no support
        ("support", "paris-0-0", "Romulus", rf.NO_SUPPORT),
        ("utility", None, "Romulus", rf.UTILITY_TOKENS[0]),
    ]
    assert [row["id"] for row in rows] == [f"q-france/critic-{n:03d}" for n in range(9)]
    assert {row["type"] for row in rows} == {"retrieve", "relevance", "support", "utility"}
    assert all(row["labeler"] == "gold" and row["model"] is None and row["prompt_hash"] is None for row in rows)
    assert all(row["instruction"] == FRANCE.question and row["query_id"] == "q-france" for row in rows)


def test_no_retrieval_gives_a_retrieve_and_a_utility_row() -> None:
    math = Query("q-math", "What is six times seven?", ("42",), needs_retrieval=False, meta={"source": "hand"})
    rows = critic_rows(GoldLabeler(BY_ID).label(math, Evidence(())))
    assert summary(rows) == [("retrieve", None, None, rf.NO_RETRIEVAL), ("utility", None, "42", "[Utility:5]")]
    assert rows[0]["source"] == "hand"


def test_rows_have_the_teacher_paths_schema() -> None:
    passage = BY_ID["paris-0-0"]
    teacher = critic_row(
        Outcome("q", "hand"), LabelItem("support", "Q?", passage, "Paris", ""), Label(rf.FULLY_SUPPORTED, "llm")
    )
    record = Record("q/gold", "Q?", (supported_segment("Paris", passage),), gold_label("[Utility:5]"), "hand",
                    {"query_id": "q"})
    gold = next(row for row in critic_rows([record]) if row["task"] == "support")
    assert list(gold) == list(teacher)
    assert {k: v for k, v in gold.items() if k not in ("id", "labeler")} == {
        k: v for k, v in teacher.items() if k not in ("id", "labeler")
    }


def test_later_segments_are_sentence_decisions_against_the_evidence_so_far() -> None:
    passage = Passage("p", "Paris", "Paris is the capital of France. It lies on the Seine.")
    record = Record(
        "q/x",
        "Tell me about Paris.",
        (
            supported_segment("Paris is the capital.", passage),
            Segment(" It lies on the Seine.", gold_label(rf.CONTINUE_EVIDENCE), support=gold_label(rf.FULLY_SUPPORTED)),
        ),
        gold_label("[Utility:5]"),
        meta={"query_id": "q"},
    )
    rows = critic_rows([record])
    sentence = rows[3]
    assert (sentence["task"], sentence["type"], sentence["passage"]["id"]) == ("retrieve_sentence", "retrieve", "p")
    assert (sentence["output"], sentence["preceding"]) == ("It lies on the Seine.", "Paris is the capital.")
    assert summary(rows)[4:] == [
        ("support", "p", "It lies on the Seine.", rf.FULLY_SUPPORTED),
        ("utility", None, "Paris is the capital. It lies on the Seine.", "[Utility:5]"),
    ]


def test_rendering_does_not_depend_on_record_order() -> None:
    found = evidence([FRANCE, ROME, LOUVRE, FOUNDED], NegativeMix(retrieved=1, support=1))
    rows = [r.to_json() for q in (FRANCE, ROME) for r in GoldLabeler(BY_ID).label(q, found[q.id])]
    assert render_critic(rows) == render_critic(list(reversed(rows)))
    assert [row["query_id"] for row in render_critic(rows)][0] == "q-france"
