"""The evaluation table shows how far a rate can be trusted: a 95% Wilson interval under the gold and the
unsupported-claims rows (2 of 13 and 13 of 40 read very differently)."""

from __future__ import annotations

from selfrag.evaluation.report import markdown_table


def test_gold_and_unsupported_rows_carry_wilson_intervals() -> None:
    summaries = {
        "plain_rag": {"examples": 60, "answerable": 50, "unanswerable": 10, "match": 0.16, "claims_judged": 40,
                      "unsupported_claim_rate": 0.75},
        "single_pass": {"examples": 60, "answerable": 50, "unanswerable": 10, "match": 0.3, "claims_judged": 0,
                        "unsupported_claim_rate": None},
    }
    table = markdown_table(summaries, judge="overlap")
    assert "| answer contains gold (answerable) | 16.0% | 30.0% |" in table  # the rates as before
    assert "| answer contains gold: 95% Wilson interval | 8/50 [8.3, 28.5] | 15/50 [19.1, 43.8] |" in table
    assert "| unsupported claims: 95% Wilson interval | 30/40 [59.8, 85.8] | n/a |" in table
