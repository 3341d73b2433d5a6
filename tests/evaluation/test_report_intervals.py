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


def test_the_table_shows_each_modes_latency_over_plain_rags() -> None:
    """The ratio the product is judged by (single-pass / plain RAG, p50 and p95), from the same run's latencies."""
    summaries = {
        "plain_rag": {"examples": 4, "latency_p50": 1.25, "latency_p95": 2.0},
        "single_pass": {"examples": 4, "latency_p50": 1.5, "latency_p95": 3.0},
        "no_retrieval": {"examples": 4, "latency_p50": None, "latency_p95": 1.0},
    }
    table = markdown_table(summaries)
    assert "| latency / plain RAG (p50, p95) | 1.00x, 1.00x | 1.20x, 1.50x | n/a, 0.50x |" in table
    lines = table.splitlines()
    assert lines.index("| latency / plain RAG (p50, p95) | 1.00x, 1.00x | 1.20x, 1.50x | n/a, 0.50x |") == 1 + next(
        i for i, line in enumerate(lines) if line.startswith("| latency p95"))
    assert "latency / plain RAG" not in markdown_table({"single_pass": summaries["single_pass"]})  # no baseline ran
