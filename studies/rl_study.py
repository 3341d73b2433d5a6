"""Old-target SFT vs new-target SFT vs SFT + RL (issue #42, item 5): gold answers against plain RAG on the same base.

    python studies/rl_study.py --split runs/qs-output/splits --out runs/rl-study \
        --arm sft-copied=runs/qs-output/model --arm sft-template=runs/qs-template/model --arm sft+rl=runs/qs-rl
    python studies/rl_study.py --out runs/rl-study --table            # the table again, from what is there

Each arm is a trained model folder. Every arm is calibrated the quickstart's way (``selfrag calibrate`` on the
split's ``dev.jsonl``, the demo corpus, top_k 3, 96 new tokens; written into the arm's own ``selfrag.json``) and
answers, single-pass, with the quickstart's evaluation settings (``selfrag eval``: batch 4, the overlap claim judge):

* ``quickstart``: the quickstart's 60 test questions (``splits/test.jsonl``) in the demo corpus;
* ``<slice>``: each shipped slice's questions that no arm trained on (``meta.split`` test, and in no arm's
  ``trained-questions.json``) that have gold answers (BEGIN's do not), searched in that slice's own corpus
  (``data_gen/slices/<slice>``).

Plain RAG (the arms' common base model, one decode over the top 3 passages) answers each question set once, in its
own folder. Per arm and set: answerable questions whose answer holds a gold answer, with a 95% bootstrap interval
of the difference to plain RAG on the same questions (paired), false abstains on answerable questions, the
unsupported-claim rate (the overlap judge), engine calls and latency (p50, p95) per question. ``selfrag eval`` and
``selfrag calibrate`` keep what they finished, so a rerun only answers what is missing. Prints markdown with the CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SLICES = REPO / "data_gen" / "slices"
DEMO_CORPUS = REPO / "data_gen" / "demo" / "corpus.jsonl"
SETTINGS = ["inference.top_k=3", "inference.max_tokens=96"]
EVAL_SETTINGS = [*SETTINGS, "batch_size=4", "judge.kind=overlap"]
RESAMPLES = 2000


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def selfrag(*args: str) -> None:
    command = [str(Path(sys.executable).with_name("selfrag")), *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def trained_keys(model: Path) -> set[str]:
    from selfrag.artifacts import load_trained_questions

    return set(load_trained_questions(model) or ())


def question_sets(split: Path, arms: dict[str, Path], out: Path,
                  slices: list[str] | None = None) -> dict[str, tuple[Path, Path]]:
    """name -> (questions file, corpus): the quickstart's test split and each slice's never-trained questions (its
    test split's; with ``slices``, every question of those slices, for arms that left them out of training)."""
    from selfrag.artifacts import question_key
    from selfrag.corpus import load_queries
    from selfrag.evaluation.data import query_to_row
    from selfrag.jsonl import write_jsonl_atomic

    sets = {"quickstart": (split / "test.jsonl", DEMO_CORPUS)}
    trained = set().union(*(trained_keys(model) for model in arms.values()))
    folders = [SLICES / name for name in slices] if slices is not None else \
        sorted(p for p in SLICES.iterdir() if (p / "queries.jsonl").is_file())
    for folder in folders:
        never = [q for q in load_queries(folder / "queries.jsonl")
                 if (slices is not None or q.meta.get("split") == "test") and question_key(q.question) not in trained
                 and (q.answers or not q.answerable)]  # BEGIN's have no gold answers to hold
        if never:
            path = out / "questions" / f"{folder.name}.jsonl"
            write_jsonl_atomic(path, [query_to_row(q) for q in never])
            sets[folder.name] = (path, folder / "corpus.jsonl")
    return sets


def run(split: Path, arms: dict[str, Path], out: Path, slices: list[str] | None = None) -> None:
    sets = question_sets(split, arms, out, slices)
    for arm, model in arms.items():
        if (out / "calibration" / arm / "calibration.json").is_file():
            continue  # calibrated by an earlier run of this study (the arm's selfrag.json holds the values)
        selfrag("calibrate", f"data={split / 'dev.jsonl'}", f"model={model}", f"retriever.corpus={DEMO_CORPUS}",
                f"output_dir={out / 'calibration' / arm}", *SETTINGS)
    first = next(iter(arms.values()))
    for name, (questions, corpus) in sets.items():
        common = [f"data={questions}", f"retriever.corpus={corpus}", *EVAL_SETTINGS]
        selfrag("eval", *common, f"model={first}", f"output_dir={out / name / 'plain_rag'}", "modes=[plain_rag]")
        for arm, model in arms.items():
            selfrag("eval", *common, f"model={model}", f"output_dir={out / name / arm}", "modes=[single_pass]")
    (out / "arms.json").write_text(json.dumps({k: str(v) for k, v in arms.items()}, indent=1), encoding="utf-8")


def records(folder: Path, mode: str) -> dict[str, dict[str, Any]]:
    path = folder / "records" / f"{mode}.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {row["question"]: row for row in rows}


def gold(row: dict[str, Any]) -> float:
    from selfrag.evaluation.metrics import match

    return float(row["answerable"] and not row["abstained"] and match(row["answer"], row["gold_answers"]))


def paired_interval(a: np.ndarray, b: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of mean(b - a) over the same questions."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(a), size=(RESAMPLES, len(a)))
    differences = (b[picks] - a[picks]).mean(axis=1)
    return float(np.percentile(differences, 2.5)), float(np.percentile(differences, 97.5))


def table(out: Path) -> str:
    from selfrag.evaluation.metrics import summarize

    arms = json.loads((out / "arms.json").read_text(encoding="utf-8"))
    lines = [f"CPU: {cpu_name()}", "",
             "| questions | arm | gold / answerable | vs plain RAG (95% CI) | false abstains | unsupported claims "
             "| engine calls | p50 s | p95 s |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in sorted((p.name for p in out.iterdir() if (p / "plain_rag" / "results.json").is_file()),
                       key=lambda n: (n != "quickstart", n)):
        plain = records(out / name / "plain_rag", "plain_rag")
        answerable = [q for q, row in plain.items() if row["answerable"]]
        base = np.array([gold(plain[q]) for q in answerable])
        columns = [("plain RAG", plain)] + [(arm, records(out / name / arm, "single_pass")) for arm in arms
                                            if (out / name / arm / "records" / "single_pass.jsonl").is_file()]
        for arm, rows in columns:
            summary = summarize(list(rows.values()))
            held = np.array([gold(rows[q]) for q in answerable])
            if arm == "plain RAG":
                versus = "—"
            else:
                low, high = paired_interval(base, held)
                versus = f"{held.mean() - base.mean():+.2f} [{low:+.2f}, {high:+.2f}]"
            lines.append(
                f"| {name} | {arm} | {int(held.sum())}/{len(answerable)} | {versus} | "
                f"{summary['false_abstain_rate']:.0%} | {summary['unsupported_claim_rate']:.0%} "
                f"({summary['claims_judged']}) | {summary['engine_calls_per_query']:.1f} | "
                f"{summary['latency_p50']:.2f} | {summary['latency_p95']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", type=Path, help="the quickstart's splits folder (dev.jsonl, test.jsonl)")
    parser.add_argument("--arm", action="append", default=[], help="NAME=MODEL_DIR, in the table's order")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--slices", help="judge every never-trained question of these slices (comma-separated; arms "
                        "that left them out of training), not only the slices' test splits")
    parser.add_argument("--table", action="store_true", help="only print the table from what --out holds")
    args = parser.parse_args()
    if not args.table:
        if args.split is None or not args.arm:
            parser.error("--split and at least one --arm are needed (or --table)")
        arms = dict(arm.split("=", 1) for arm in args.arm)
        slices = args.slices.split(",") if args.slices else None
        run(args.split, {name: Path(model) for name, model in arms.items()}, args.out, slices)
    text = table(args.out)
    (args.out / "table.md").write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
