"""The answers study's table: each arm's quickstart folder read into one row (studies/answers/arms.yaml).

    python studies/answers_table.py > studies/answers/table.md

Each arm is ``selfrag quickstart output_dir=<folder> data_recipe=<its data recipe> [overrides]`` (the command is in
the arms file); this reads the folder's ``report.json`` (the evaluation, its reflection agreement, the well-formed
share) and ``never.json`` (``python studies/answers_never.py <folder>``), and prints a markdown table with 95% Wilson
intervals on the gold and unsupported-claims rates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from selfrag.agreement import wilson_interval

sys.path.insert(0, str(Path(__file__).parent))
from answers_never import summarize  # noqa: E402

ARMS = Path(__file__).parent / "answers" / "arms.yaml"


def share(rate: float | None, count: int) -> str:
    if rate is None or not count:
        return "n/a"
    k = round(rate * count)
    low, high = wilson_interval(k, count) or (0.0, 1.0)
    return f"{k}/{count} = {100 * rate:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def row(arm: dict[str, Any]) -> str:
    folder = Path(arm["folder"])
    report = json.loads((folder / "report.json").read_text(encoding="utf-8")) if (folder / "report.json").is_file() \
        else None
    if report is None:
        return f"| {arm['name']} | {arm['what']} | not run: {arm.get('status', 'no report.json in ' + str(folder))} |"
    modes = report["eval"]["modes"]
    sp, rag = modes["single_pass"], modes["plain_rag"]
    reflection = report["eval"].get("reflection") or {}

    def auroc(kind: str) -> str:
        value = (reflection.get(kind) or {}).get("auroc")
        return "n/a" if value is None else f"{value:.3f}"

    never = folder / "never.json"
    words = "n/a"
    if never.is_file():
        summary = summarize(json.loads(never.read_text(encoding="utf-8"))["answers"])
        words = "; ".join(f"{group}: {s['words']}/{s['questions']} words, {s['number']} numbers, {s['other']} other "
                          f"(a letter, nothing), {s['holds_gold']} hold the gold" for group, s in summary.items())
    cells = [
        arm["name"], arm["what"], str(arm.get("steps", "")), arm.get("timing", ""),
        share(sp["match"], sp["answerable"]), share(rag["match"], rag["answerable"]),
        share(sp["unsupported_claim_rate"], sp.get("claims_judged", 0)),
        share(rag["unsupported_claim_rate"], rag.get("claims_judged", 0)),
        f"{100 * (sp['false_abstain_rate'] or 0):.1f}%",
        f"{100 * (sp.get('f1') or 0):.1f} / {100 * (rag.get('f1') or 0):.1f}",
        auroc("relevance"), auroc("support"), f"{100 * (report['well_formed']['share'] or 0):.1f}%",
        arm.get("judgement", "not measured"), words,
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| arm | what | steps | training (wall; load average) | single-pass: answer holds gold [95%] | plain RAG: "
    "answer holds gold [95%] | single-pass: unsupported claims [95%] | plain RAG: unsupported claims [95%] | "
    "single-pass false abstains | token F1 single-pass / plain RAG | relevance AUROC (test passages) | support "
    "AUROC (test) | well-formed | judgement (study items: easy / random same-article / closest) | mode=never |\n"
    "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
)


def main() -> None:
    arms = yaml.safe_load(ARMS.read_text(encoding="utf-8"))["arms"]
    print(HEADER)
    for arm in arms:
        print(row(arm))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
