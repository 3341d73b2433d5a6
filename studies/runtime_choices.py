"""The runtime's choices on one trained model: how branches are ranked, how long an answer may be, how many passages
branch, whether weak branches are pruned — each measured on the quickstart's own test questions (issue #33, item 3).

    python studies/runtime_choices.py selfrag-quickstart                  # every arm; table to stdout
    python studies/runtime_choices.py selfrag-quickstart --arms default,top1 --out studies/answers/runtime-table.md

Each arm is ``selfrag eval`` of the single-pass mode with the quickstart's own evaluation settings
(``<folder>/eval/config.yaml``: its test split, corpus, top-k retrieval, the overlap judge, the model's calibration)
and one change. Answers go to ``<folder>/runtime/<arm>/`` (kept: a rerun of an arm with the same settings reuses them,
as ``selfrag eval`` does). Plain RAG on the same questions is read from the quickstart's own evaluation.

Besides each arm's rates with 95% Wilson intervals, the table counts the answerable questions where the arm holds the
gold and the default does not (``+``) and the other way round (``-``): on 50 questions the paired count says more
than two overlapping intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from selfrag.agreement import wilson_interval

#: arm -> (what changes, EvalConfig keys merged over the quickstart's)
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": ("the quickstart's runtime: weights relevance 1, support 1, utility 0.5, retrieval 0.5 (runtime 8; "
                "before, 0); top 3; 96 tokens; pruning", {}),
    "rank-relevance": ("branches ranked by P([Relevant]) alone", {"inference": {"weights": {
        "relevance": 1.0, "support": 0.0, "utility": 0.0, "retrieval": 0.0}}}),
    "rank-support": ("ranked by the support verdict alone", {"inference": {"weights": {
        "relevance": 0.0, "support": 1.0, "utility": 0.0, "retrieval": 0.0}}}),
    "rank-utility": ("ranked by the utility verdict alone", {"inference": {"weights": {
        "relevance": 0.0, "support": 0.0, "utility": 1.0, "retrieval": 0.0}}}),
    "rank-retrieval": ("ranked by the retriever's order alone among the branches the policy would ship",
                       {"inference": {"weights": {"relevance": 0.0, "support": 0.0, "utility": 0.0,
                                                  "retrieval": 1.0}}}),
    "rank-paper": ("the paper's short-form weights: relevance 1, support 1, utility 0.5, no retrieval term, no "
                   "pruning", {"inference": {"pruning": {"enabled": False}, "weights": {"retrieval": 0.0}}}),
    "together": ("the passages judged [Relevant] read in one paragraph and answered once (read=together)",
                 {"inference": {"read": "together"}}),
    "flag": ("an unsupported best answer is kept and flagged low-confidence instead of abstaining "
             "(on_unsupported=flag): how much of the gap is abstention", {"inference": {"on_unsupported": "flag"}}),
    "tokens48": ("answers cut at 48 new tokens instead of 96", {"inference": {"max_tokens": 48}}),
    "top1": ("one branch: the retriever's first passage only", {"inference": {"top_k": 1}}),
    "top5": ("five branches", {"inference": {"top_k": 5}}),
}


def merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in change.items():
        out[key] = merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def share(k: int, n: int) -> str:
    if not n:
        return "n/a"
    low, high = wilson_interval(k, n) or (0.0, 1.0)
    return f"{k}/{n} = {100 * k / n:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def records(folder: Path, mode: str) -> list[dict[str, Any]]:
    path = folder / "records" / f"{mode}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def holds_gold(rows: list[dict[str, Any]]) -> dict[str, bool]:
    from selfrag.evaluation.metrics import match

    return {r["id"]: (not r["abstained"]) and match(r["answer"], r["gold_answers"]) for r in rows if r["answerable"]}


def quickstart_eval(folder: Path) -> dict[str, Any]:
    """The quickstart's evaluation settings (``<folder>/eval/config.yaml``), in today's spelling."""
    import yaml

    from selfrag.inference.config import FORMER_TOP_LEVEL

    base: dict[str, Any] = yaml.safe_load((folder / "eval" / "config.yaml").read_text(encoding="utf-8"))
    if "corpus" in base:  # a quickstart before the one retriever spelling wrote a top-level corpus
        base["retriever"] = {**(base.get("retriever") or {}), "corpus": base.pop("corpus")}
    for key in FORMER_TOP_LEVEL:  # ... and before the inference section, the runtime's top_k, max_tokens, engine
        if key in base:
            base["inference"] = {**(base.get("inference") or {}), key: base.pop(key)}
    return base


def run_arm(folder: Path, name: str, change: dict[str, Any]) -> Path:
    from selfrag.config import from_dict
    from selfrag.evaluation.config import EvalConfig
    from selfrag.evaluation.run import run

    settings = merge(quickstart_eval(folder), change)
    settings.update(modes=["single_pass"], output_dir=str(folder / "runtime" / name), plots=False, show=0)
    run(from_dict(EvalConfig, settings))
    return folder / "runtime" / name


def row(name: str, what: str, out: Path, default: dict[str, bool] | None) -> str:
    from selfrag.evaluation.metrics import summarize

    rows = records(out, "single_pass")
    s = summarize(rows)
    gold = holds_gold(rows)
    k = sum(gold.values())
    judged = [c for r in rows if not r["abstained"] for c in r.get("claims", []) if c["supported"] is not None]
    unsupported = sum(not c["supported"] for c in judged)
    abstained = sum(r["abstained"] for r in rows if r["answerable"])
    unanswerable = [r for r in rows if not r["answerable"]]
    paired = "" if default is None else (f"+{sum(v and not default.get(q, False) for q, v in gold.items())} / "
                                         f"-{sum(default.get(q, False) and not v for q, v in gold.items())}")
    cells = [name, what, share(k, len(gold)), paired or "—", share(unsupported, len(judged)),
             share(abstained, len(gold)), share(sum(r["abstained"] for r in unanswerable), len(unanswerable)),
             f"{100 * (s.get('f1') or 0):.1f}", f"{s['generated_tokens_per_query'] or 0:.0f}",
             f"{s['latency_p50'] or 0:.2f}"]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| arm | what | answer holds gold [95%] | paired vs default (+ / -) | unsupported claims [95%] | "
          "false abstains | abstains on unanswerable | token F1 | generated tokens / q | p50 s |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a finished quickstart folder (selfrag quickstart output_dir)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    names = [name.strip() for name in args.arms.split(",") if name.strip()]
    unknown = [name for name in names if name not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; choose from {list(ARMS)}")
    if not (args.folder / "eval" / "config.yaml").is_file():
        raise SystemExit(f"{args.folder}/eval/config.yaml not found: run `selfrag quickstart output_dir={args.folder}`")
    if "default" not in names:
        names.insert(0, "default")
    outs = {name: run_arm(args.folder, name, ARMS[name][1]) for name in names}
    default = holds_gold(records(outs["default"], "single_pass"))
    lines = [HEADER] + [row(name, ARMS[name][0], outs[name], None if name == "default" else default)
                        for name in names]
    plain = records(args.folder / "eval", "plain_rag")
    gold = holds_gold(plain)
    judged = [c for r in plain if not r["abstained"] for c in r.get("claims", []) if c["supported"] is not None]
    lines.append(f"\nPlain RAG on the same base and questions (the quickstart's evaluation): gold "
                 f"{share(sum(gold.values()), len(gold))}, unsupported claims "
                 f"{share(sum(not c['supported'] for c in judged), len(judged))}.")
    table = "\n".join(lines) + "\n"
    sys.stdout.write(table)
    if args.out is not None:
        args.out.write_text(table, encoding="utf-8")


if __name__ == "__main__":
    main()
