"""What a quickstart model answers with ``mode=never`` (no passages): words or numbers, and the gold how often.

    python studies/answers_never.py selfrag-quickstart            # writes selfrag-quickstart/never.json

The questions: the quickstart's own test split (``splits/test.jsonl``): its no-retrieval questions (general knowledge
and arithmetic) and its answerable factual questions (about people, places, dates: SQuAD). A model trained on bare
numbers for every no-retrieval question answers "10" to them all; the aim is a word answer to a factual question.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from selfrag.evaluation.metrics import match
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import build_engine
from selfrag.inference.runtime import SelfRAG

NUMBER = re.compile(r"^[\W\d_]*\d[\W\d_]*$")  # digits and punctuation only: "10", "1,782.", "$5"


WORD = re.compile(r"[^\W\d_]{2,}")  # two letters or more


def kind(answer: str) -> str:
    """``number`` (digits and punctuation only), ``words`` (a word of two letters or more), else ``other`` ("d",
    "_", nothing)."""
    text = answer.strip()
    return "number" if NUMBER.match(text) else "words" if WORD.search(text) else "other"


def summarize(answers: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for group in ("no-retrieval", "factual"):
        mine = [a for a in answers if a["group"] == group]
        summary[group] = {"questions": len(mine),
                          **{k: sum(kind(a["answer"]) == k for a in mine) for k in ("words", "number", "other")},
                          "holds_gold": sum(a["holds_gold"] for a in mine)}
    return summary


def probe(folder: Path, batch_size: int = 8) -> dict[str, Any]:
    rows = [json.loads(line) for line in (folder / "splits" / "test.jsonl").read_text(encoding="utf-8").splitlines()]
    config = InferenceConfig(mode="never", max_tokens=48)
    runtime = SelfRAG(build_engine(config, folder / "model"), None, config)
    answers = []
    for start in range(0, len(rows), batch_size):
        batch = [row for row in rows[start : start + batch_size] if row.get("answerable", True)]
        for row, answer in zip(batch, runtime.answer_many([row["question"] for row in batch]), strict=True):
            group = "no-retrieval" if row.get("needs_retrieval") is False else "factual"
            answers.append({"group": group, "question": row["question"], "gold": row["answers"],
                            "answer": answer.answer, "kind": kind(answer.answer),
                            "holds_gold": match(answer.answer, row["answers"])})
    return {"summary": summarize(answers), "answers": answers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="a quickstart output folder (model/ and splits/test.jsonl)")
    args = parser.parse_args()
    result = probe(args.folder)
    (args.folder / "never.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(result["summary"], indent=1))
    for answer in result["answers"][:12]:
        print(f"[{answer['group']}] {answer['question']!r} -> {answer['answer']!r} (gold {answer['gold'][:1]})")


if __name__ == "__main__":
    main()
