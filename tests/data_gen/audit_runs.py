"""A small generate run written by hand (critic rows of every type and label) for the audit tests."""

from __future__ import annotations

import json
from pathlib import Path

from selfrag import reflection as rf

PASSAGE = {"id": "p1", "title": "Paris", "text": "Paris is the capital of France."}
#: (type, teacher label, how many rows)
STRATA = (("retrieve", rf.RETRIEVAL, 3), ("retrieve", rf.NO_RETRIEVAL, 2), ("relevance", rf.RELEVANT, 4),
          ("relevance", rf.IRRELEVANT, 4), ("support", rf.FULLY_SUPPORTED, 2), ("utility", "[Utility:5]", 1))


def critic_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for kind, label, count in STRATA:
        for index in range(count):
            rows.append({
                "id": f"q-{kind}-{label}-{index}/critic-000", "query_id": f"q-{kind}-{index}", "type": kind,
                "task": kind, "instruction": f"Question {index} about {kind}?",
                "passage": None if kind == "retrieve" else PASSAGE,
                "output": "Paris." if kind in ("support", "utility") else None, "preceding": "",
                "target": label, "labeler": "gold", "model": None, "prompt_hash": None, "source": "test",
            })
    return rows


def write_run(folder: Path, rows: list[dict[str, object]] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = critic_rows() if rows is None else rows
    (folder / "critic.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (folder / "critic-heldout.jsonl").write_text("", encoding="utf-8")
    (folder / "records.jsonl").write_text("", encoding="utf-8")
    (folder / "stats.json").write_text("{}\n", encoding="utf-8")
    return folder
