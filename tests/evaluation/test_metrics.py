"""Each metric on hand-made examples whose answers are known."""

from __future__ import annotations

from typing import Any

import pytest

from selfrag.evaluation import metrics


def test_match_is_gold_string_in_answer_after_normalisation() -> None:
    assert metrics.match("It was the Normans, in 911.", ["normans"])
    assert metrics.match("Answer: 1,000 people", ["1 000"])
    assert not metrics.match("Normandy", ["Norman"])  # whole words only
    assert not metrics.match("anything", [])
    assert not metrics.match("anything", [""])  # an empty gold never matches


@pytest.mark.parametrize(("answer", "golds", "expected"), [
    ("Kemal Atatürk", ["working through Turkish modernist Mustafa Kemal Atatürk"], 4 / 9),  # P 1, R 2/7
    ("the oil revenues", ["oil revenues were not benefitting", "the revenues"], 2 * 0.5 * 1 / 1.5),  # best gold
    ("Paris Paris", ["Paris"], 2 * 0.5 * 1 / 1.5),  # a repeated token counts once per gold occurrence
    ("The Song dynasty.", ["the Song dynasty"], 1.0),
    ("Lyon", ["Paris"], 0.0),
    ("anything", [], 0.0),
    ("", ["Paris"], 0.0),
])
def test_token_f1_is_squads(answer: str, golds: list[str], expected: float) -> None:
    assert metrics.token_f1(answer, golds) == pytest.approx(expected)


def test_exact_match_ignores_case_punctuation_articles() -> None:
    assert metrics.exact_match("The Eiffel Tower.", ["eiffel tower"])
    assert not metrics.exact_match("the Eiffel Tower in Paris", ["eiffel tower"])


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("B", "B"), ("(c) a frog", "C"), ("The answer is A.", "A"), ("It is a frog", "C"), ("dog or cat", None),
     ("", None)],
)
def test_choice_prediction(answer: str, expected: str | None) -> None:
    choices = [("A", "a dog"), ("B", "a cat"), ("C", "a frog")]
    assert metrics.choice_prediction(answer, choices) == expected


@pytest.mark.parametrize(
    ("answer", "expected"), [("True.", "true"), ("No, it is false", "false"), ("Yes", "true"), ("maybe", None)]
)
def test_claim_prediction(answer: str, expected: str | None) -> None:
    assert metrics.claim_prediction(answer) == expected


def test_auroc_known_values() -> None:
    # positives 0.35, 0.8 vs negatives 0.1, 0.4: pairs won 3 of 4
    assert metrics.auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert metrics.auroc([0.9, 0.8, 0.2], [True, True, False]) == 1.0
    assert metrics.auroc([0.2, 0.8, 0.9], [True, False, False]) == 0.0
    assert metrics.auroc([0.5, 0.5, 0.5, 0.5], [True, False, True, False]) == pytest.approx(0.5)  # ties: one half
    assert metrics.auroc([0.3, 0.6], [True, True]) is None  # one class: undefined


def test_percentile_interpolates() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert metrics.percentile(values, 50) == 3.0
    assert metrics.percentile(values, 95) == pytest.approx(4.0 + 0.8 * 6.0)
    assert metrics.percentile([], 50) is None


def test_confusion_matrix_counts_and_missing_column() -> None:
    result = metrics.confusion_matrix(["[Relevant]", "[Relevant]", "[Irrelevant]", "[Irrelevant]"],
                                      ["[Relevant]", None, "[Relevant]", "[Irrelevant]"],
                                      ["[Relevant]", "[Irrelevant]"])
    assert result["columns"] == ["[Relevant]", "[Irrelevant]", "none"]
    assert result["matrix"] == [[1, 0, 1], [1, 1, 0]]


def test_reflection_agreement_accuracy_and_auroc() -> None:
    items = [
        {"gold": "[Relevant]", "predicted": "[Relevant]", "score": 0.9},
        {"gold": "[Relevant]", "predicted": "[Irrelevant]", "score": 0.4},
        {"gold": "[Irrelevant]", "predicted": "[Irrelevant]", "score": 0.3},
        {"gold": "[Irrelevant]", "predicted": "[Irrelevant]", "score": None},
    ]
    result = metrics.reflection_agreement(items, ["[Relevant]", "[Irrelevant]"], {"[Relevant]"})
    assert result["accuracy"] == 0.75
    assert result["auroc"] == 1.0  # only scored items: 0.9, 0.4 (positive) above 0.3
    assert result["confusion"]["matrix"] == [[1, 1, 0], [0, 2, 0]]


def record(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": "qa", "gold_answers": ["Paris"], "choices": [], "answer_key": None, "answerable": True,
        "needs_retrieval": True, "answer": "Paris", "abstained": False, "retrieved": True, "retrieval_rounds": 1,
        "engine_calls": 2, "prompt_tokens": 100, "generated_tokens": 10, "seconds": 1.0, "claims": [],
    }
    return base | fields


def test_summarize_known_rates() -> None:
    records = [
        record(answer="It is Paris.", claims=[{"supported": True}, {"supported": False}]),  # match, not exact
        record(answer="Paris", seconds=3.0, claims=[{"supported": True}]),  # match and exact
        record(answer="The sources do not say.", abstained=True, seconds=2.0,
               claims=[{"supported": False}]),  # a false abstain; its claims are not counted
        record(answerable=False, gold_answers=[], answer="The sources do not say.", abstained=True,
               retrieval_rounds=2, seconds=4.0),
        record(answerable=False, gold_answers=[], answer="Lyon", needs_retrieval=None, retrieved=False,
               retrieval_rounds=0, engine_calls=1, claims=[{"supported": None}]),  # unjudged: no passage
    ]
    summary = metrics.summarize(records)
    assert summary["match"] == pytest.approx(2 / 3)
    assert summary["accuracy"] == pytest.approx(1 / 3)
    assert summary["f1"] == pytest.approx((0.5 + 1 + 0) / 3)  # "it is paris": P 1/3, R 1; the abstention: 0
    assert summary["unsupported_claim_rate"] == pytest.approx(1 / 3) and summary["claims_judged"] == 3
    assert summary["false_abstain_rate"] == pytest.approx(1 / 3)
    assert summary["abstain_rate_unanswerable"] == 0.5
    assert summary["retrieval_rate"] == 0.8
    assert summary["retrieve_decision_accuracy"] == 1.0  # 4 decided, all retrieved as needed
    assert summary["re_retrieval_rate"] == 0.2
    assert summary["engine_calls_per_query"] == pytest.approx(9 / 5)
    assert summary["latency_p50"] == 2.0 and summary["latency_p95"] == pytest.approx(3.8)


def test_an_unanswerable_question_answered_without_a_flag_is_counted() -> None:
    """The runtime cannot know answerability: "1963" on a [Fully supported] verdict ships unflagged. eval knows it, and
    says how often; an abstention or a low_confidence flag is not counted."""
    unanswerable = {"answerable": False, "gold_answers": []}
    records = [record(**unanswerable, answer="1963", low_confidence=False),
               record(**unanswerable, answer="1963", low_confidence=True),
               record(**unanswerable, answer="The sources do not say.", abstained=True),
               record(**unanswerable, answer="Lyon"),  # plain RAG: no flag at all
               record()]
    summary = metrics.summarize(records)
    assert summary["unflagged_rate_unanswerable"] == pytest.approx(2 / 4)
    assert summary["abstain_rate_unanswerable"] == pytest.approx(1 / 4)
    assert metrics.summarize([record()])["unflagged_rate_unanswerable"] is None


def test_summarize_closed_set_and_claims() -> None:
    records = [
        record(kind="choice", gold_answers=["a frog", "C"], choices=[["A", "a dog"], ["C", "a frog"]],
               answer_key="C", answer="C."),
        record(kind="choice", gold_answers=["a frog", "C"], choices=[["A", "a dog"], ["C", "a frog"]],
               answer_key="C", answer="A"),
        record(kind="claim", gold_answers=["false"], answer="False, it is not."),
    ]
    assert metrics.summarize(records)["accuracy"] == pytest.approx(2 / 3)


def test_rates_over_nothing_are_none() -> None:
    summary = metrics.summarize([record()])
    assert summary["abstain_rate_unanswerable"] is None and summary["unsupported_claim_rate"] is None
