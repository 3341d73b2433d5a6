"""Your model next to the paper's: the released Self-RAG checkpoints and yours through `selfrag eval`, on the
paper's four short-form sets, with its prompt, passages, token budget and metric, in one table.

    .venv/bin/python benchmarks/paper_reference.py --data-dir eval_data \\
        --model selfrag/selfrag_llama2_7b --model runs/llama8b --limit 500 --output runs/paper-reference

``--data-dir`` holds the paper's ``eval_data`` files (popqa_longtail_w_gs.jsonl, triviaqa_test_w_gs.jsonl,
health_claims_processed.jsonl, arc_challenge_processed.jsonl; the paper's README links them). Every ``--model``
(a released checkpoint such as selfrag/selfrag_llama2_7b or selfrag/selfrag_llama2_13b, read as released: the
15 tokens in its tokenizer and the ``### Instruction:`` prompt; or a directory written by `selfrag train` /
`selfrag export`) answers every set in the single-pass mode with adaptive retrieval at the paper's threshold 0.2,
over each question's own ``ctxs``. Each run is an ordinary `selfrag eval` output folder under
``--output/<model>/<set>`` (resumable; a rerun with other settings is refused). Prints the table and writes it
as ``reference.json`` and ``reference.md``. `selfrag eval` decodes with the transformers engine: a GPU for 7B
models; the paper's numbers are its Table 2 (Self-RAG 7B / 13B).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

#: The paper's adaptive-retrieval threshold in its README's short-form commands (``--threshold 0.2``).
PAPER_THRESHOLD = 0.2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from selfrag.evaluation.paper_data import PAPER_TASKS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="the paper's eval_data folder")
    parser.add_argument("--model", action="append", required=True, help="a released checkpoint or a selfrag model")
    parser.add_argument("--tasks", default=",".join(PAPER_TASKS), help="comma-separated, of " + ", ".join(PAPER_TASKS))
    parser.add_argument("--limit", type=int, default=None, help="first N questions of each set (None: all)")
    parser.add_argument("--output", type=Path, default=Path("runs/paper-reference"))
    return parser.parse_args(argv)


def slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model.strip("/")).strip("_") or "model"


def eval_config(model: str, task: str, data_dir: Path, output: Path, limit: int | None) -> Any:
    """The `selfrag eval` config of one model on one of the paper's sets, as the paper ran it."""
    from selfrag.config import load_config
    from selfrag.evaluation.config import EvalConfig
    from selfrag.evaluation.paper_data import PAPER_TASKS

    spec = PAPER_TASKS[task]
    return load_config(
        EvalConfig, None, [],
        data=str(data_dir / spec.file), format=task, model=model, output_dir=str(output / slug(model) / task),
        modes=["single_pass"], limit=limit, plots=False, show=0, judge={"kind": "none"},
        inference={"mode": "adaptive", "threshold": PAPER_THRESHOLD, "top_k": spec.top_k,
                   "max_tokens": spec.max_tokens},
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from selfrag.errors import InputError
    from selfrag.evaluation.paper_data import PAPER_TASKS
    from selfrag.evaluation.run import run as evaluate

    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    unknown = [task for task in tasks if task not in PAPER_TASKS]
    if unknown:
        raise InputError(f"--tasks has {unknown}; use some of {list(PAPER_TASKS)}")
    files = [args.data_dir / PAPER_TASKS[task].file for task in tasks]
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise InputError(f"--data-dir lacks {missing}; download the paper's eval_data (its README links it)")
    rows = []
    for task in tasks:
        row: dict[str, Any] = {"task": task, "paper_7b": PAPER_TASKS[task].paper_7b,
                               "paper_13b": PAPER_TASKS[task].paper_13b}
        for model in args.model:
            result = evaluate(eval_config(model, task, args.data_dir, args.output, args.limit))
            accuracy = result.summaries["single_pass"]["accuracy"]
            row[model] = None if accuracy is None else round(100 * accuracy, 1)
        rows.append(row)
    return {"limit": args.limit, "threshold": PAPER_THRESHOLD, "models": args.model, "rows": rows}


def markdown(report: dict[str, Any]) -> str:
    models = report["models"]
    lines = ["| set | paper 7B | paper 13B | " + " | ".join(models) + " |",
             "|---|---|---|" + "---|" * len(models)]
    for row in report["rows"]:
        cells = ["n/a" if row[m] is None else f"{row[m]:.1f}" for m in models]
        lines.append(f"| {row['task']} | {row['paper_7b']} | {row['paper_13b']} | " + " | ".join(cells) + " |")
    scope = f"first {report['limit']} questions of each set" if report["limit"] else "every question"
    lines.append(f"\nAccuracy (%), single pass, adaptive retrieval at threshold {report['threshold']}, {scope}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import sys

    from selfrag.errors import SelfragError

    args = parse_args(argv)
    try:
        report = run(args)
    except SelfragError as error:
        print(f"paper_reference: error: {error}", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "reference.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    table = markdown(report)
    (args.output / "reference.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
