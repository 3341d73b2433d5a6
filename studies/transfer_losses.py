"""Where single-pass loses what plain RAG answers: the passage it ranked best, and the one it answered from.

    python studies/transfer_losses.py runs/transfer-nq-s0 runs/transfer-nq-s1 runs/transfer-nq-s2 --set popqa

Reads a transfer study's answers (``studies/transfer.py --out``; nothing is run): for each answerable question that
plain RAG holds the gold for and single-pass (``--arm``, default ``sft``) does not, whether one of the given passages
holds a gold string, whether the passage with single-pass's best relevance score is one of those, and whether the
passages its answer cites are. A loss where the best-ranked passage holds no gold is a ranking loss (the relevance
token chose the wrong passage); one where it does is a writing loss (the branch of the right passage wrote a wrong
answer or abstained).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from selfrag.evaluation.metrics import match


def gold(row: Mapping[str, Any]) -> bool:
    """The study's judgement (``rl_study.gold``): answerable, not abstained, a gold string in the answer."""
    return bool(row["answerable"] and not row["abstained"] and match(row["answer"], row["gold_answers"]))


def rows(path: Path) -> dict[str, dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return {row["id"]: row for row in map(json.loads, handle)}


def seed_folders(out: Path) -> Iterator[Path]:
    yield from sorted(path for path in out.glob("seed-*") if path.is_dir())


def best_ranked(row: Mapping[str, Any]) -> str | None:
    """The passage with the highest relevance score in the first relevance step, None where none was scored."""
    for step in row.get("trace") or ():
        if step.get("step") == "relevance" and step.get("relevance"):
            scores: Mapping[str, float] = step["relevance"]
            return max(scores, key=lambda passage_id: scores[passage_id])
    return None


def loss_kind(row: Mapping[str, Any]) -> tuple[str, str, str]:
    """(what single-pass did, which passage ranked best, which it cited) for one lost question."""
    holding = {p["id"] for p in row.get("passages") or () if match(p["text"], row["gold_answers"])}
    cited = {p["id"] for p in row.get("cited") or ()}
    return (
        "abstained" if row.get("abstained") else "answered",
        "no passage holds gold" if not holding
        else "best-ranked holds gold" if best_ranked(row) in holding else "best-ranked holds none",
        "cites a gold passage" if cited & holding else "cites none",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outs", nargs="+", type=Path, help="transfer study --out folders")
    parser.add_argument("--set", default="popqa", help="question set (default popqa)")
    parser.add_argument("--arm", default="sft", help="single-pass arm folder under evals/SET (sft, sft+rl)")
    args = parser.parse_args()
    total: Counter[tuple[str, str, str]] = Counter()
    for out in args.outs:
        plain = rows(out / "plain" / args.set / "records" / "plain_rag.jsonl")
        for folder in seed_folders(out):
            mine = rows(folder / "evals" / args.set / args.arm / "records" / "single_pass.jsonl")
            lost = [row for qid, row in mine.items() if qid in plain and gold(plain[qid]) and not gold(row)]
            kinds = Counter(loss_kind(row) for row in lost)
            total.update(kinds)
            print(f"{folder}: {len(lost)} questions plain RAG holds and single-pass does not")
    print("\n| single-pass | best relevance | its citations | questions |\n| --- | --- | --- | ---: |")
    for (did, ranked, cited), count in total.most_common():
        print(f"| {did} | {ranked} | {cited} | {count} |")


if __name__ == "__main__":
    main()
