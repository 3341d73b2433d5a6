"""studies/transfer_losses.py sorts each question single-pass loses to plain RAG by the passage it ranked best."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transfer_losses

PASSAGES = [{"id": "a", "text": "Ann Lee is a painter."}, {"id": "b", "text": "Bob Lee was born in 1900."}]


def row(qid: str, answer: str, *, scores: dict[str, float] | None = None, cited: tuple[str, ...] = (),
        abstained: bool = False) -> dict[str, Any]:
    trace = [{"step": "relevance", "relevance": scores}] if scores else []
    return {"id": qid, "answerable": True, "abstained": abstained, "answer": answer, "gold_answers": ["painter"],
            "passages": PASSAGES, "cited": [p for p in PASSAGES if p["id"] in cited], "trace": trace}


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.mkdir(parents=True)
    (path / ("plain_rag.jsonl" if "plain" in str(path) else "single_pass.jsonl")).write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_losses_are_ranking_or_writing_and_wins_are_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "study"
    write(out / "plain" / "popqa" / "records", [row(q, "Ann Lee is a painter.") for q in ("q1", "q2", "q3", "q4")]
          + [row("q5", "The sources do not say.", abstained=True)])
    write(out / "seed-0" / "evals" / "popqa" / "sft" / "records", [
        row("q1", "Bob Lee was born in 1900.", scores={"a": 0.2, "b": 0.9}, cited=("b",)),  # ranked the wrong one
        row("q2", "Ann Lee was born in Leeds.", scores={"a": 0.9, "b": 0.1}, cited=("a",)),  # right one, wrong words
        row("q3", "The sources do not say.", scores={"a": 0.9, "b": 0.1}, abstained=True),
        row("q4", "A painter.", scores={"a": 0.9, "b": 0.1}, cited=("a",)),  # held: not a loss
        row("q5", "Bob.", scores={"a": 0.1, "b": 0.9}),  # plain RAG did not hold it: not a loss
    ])
    monkeypatch.setattr("sys.argv", ["transfer_losses.py", str(out), "--set", "popqa"])
    transfer_losses.main()
    printed = capsys.readouterr().out
    assert "3 questions plain RAG holds and single-pass does not" in printed
    assert "| answered | best-ranked holds none | cites none | 1 |" in printed
    assert "| answered | best-ranked holds gold | cites a gold passage | 1 |" in printed
    assert "| abstained | best-ranked holds gold | cites none | 1 |" in printed
