"""Recipes over several seeds, on the quickstart's own training data: the judgement (#33 item 4) and well-formed
answers of each (recipe, seed), trained in parallel where a GPU leaves room for it.

    python studies/recipe_seeds.py data                                   # the records the runs read (seconds)
    python studies/recipe_seeds.py run --arms top15-300 --seeds 0 1 2     # train + judge + answer, one at a time
    python studies/recipe_seeds.py run --arms bf16-300 top15-300 --seeds 0 1 2 --workers 6   # on a GPU
    python studies/recipe_seeds.py table --out studies/answers/seeds-table.md

An arm is the quickstart's recipe (``configs/train/smollm2-135m-cpu.yaml`` on the records of
``configs/data_gen/mixed-sources.yaml``) with a few overrides (:data:`ARMS`). Each (arm, seed) is one child process:
``selfrag train`` into ``runs/study/<arm>-s<seed>``, then the judgement study's measurements of that folder —
relevance AUROC against other-article (easy), BM25-best and random same-article negatives, and support AUROC, on 300
held-out SQuAD questions per class (the items ``judgement_study.py negatives`` scores, scored once) — then
single-pass answers to the held-out demo questions and the share of well-formed outputs
(``judgement_study.py answers``). Each child writes ``seed-result.json`` in its folder; ``table`` reads them all. A
finished (arm, seed) is not trained again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "runs" / "study"
RECIPE = "configs/train/smollm2-135m-cpu.yaml"
TRAIN_RECORDS = "runs/mix-train/records.jsonl"
#: the item-4 aims: relevance vs easy and random same-article negatives, support, well-formed share
AIMS = {"easy": 0.97, "article": 0.94, "support": 0.95, "well_formed": 0.80}


def arm_overrides(bf16: bool, steps: int, layers: int | None) -> list[str]:
    """An arm's overrides on top of the recipe: bf16 autocast or not, the steps, LoRA on the top ``layers`` blocks
    (``None``: every block)."""
    return [f"training.bf16={str(bf16).lower()}", f"training.max_steps={steps}",
            f"lora.layers={'null' if layers is None else layers}"]


#: arm -> (what it tests, its overrides on top of the recipe)
ARMS: dict[str, tuple[str, list[str]]] = {
    "fp32-150": ("the CPU recipe before this study: fp32, 150 steps, LoRA on every block",
                 arm_overrides(False, 150, None)),
    "bf16-300": ("300 steps in bf16 autocast, LoRA on every block", arm_overrides(True, 300, None)),
    "top15-300": ("300 steps in bf16, LoRA on the top 15 of 30 blocks (lora.layers=15)", arm_overrides(True, 300, 15)),
    "top10-300": ("300 steps in bf16, LoRA on the top 10 of 30 blocks", arm_overrides(True, 300, 10)),
    "top15-200": ("200 steps in bf16, LoRA on the top 15 blocks", arm_overrides(True, 200, 15)),
    "top15-300-fp32": ("300 steps in fp32, LoRA on the top 15 blocks (a CPU without native bf16)",
                       arm_overrides(False, 300, 15)),
}
#: what every run sets besides its arm: no scoring or checkpoints during training (measured after it)
COMMON = ["training.eval_steps=100000", "training.save_steps=100000", "eval_records=null"]


def data() -> None:
    """The training records (the quickstart's data recipe) and the judgement study's held-out SQuAD records."""
    commands = [
        ["--config", "configs/data_gen/mixed-sources.yaml", "output=runs/mix-train", "split=train"],
        ["--config", "configs/data_gen/squad-demo.yaml", "output=runs/data-test", "split=test"],
        ["--config", "configs/data_gen/squad-demo.yaml", "output=runs/data-test-article", "split=test",
         "easy_negatives=0", "support_negatives=0", "article_negatives=1"],
    ]
    for command in commands:
        subprocess.run([sys.executable, "-m", "selfrag.app.cli", "generate", *command], cwd=REPO, check=True)


def folder(arm: str, seed: int) -> Path:
    return RUNS / f"{arm}-s{seed}"


def one(arm: str, seed: int, questions: int) -> dict[str, Any]:
    """Train, judge and answer one (arm, seed) in this process -> ``seed-result.json``."""
    sys.path.insert(0, str(REPO / "studies"))
    os.chdir(REPO)
    from judgement_study import answers_arm, item_scores, negatives

    from selfrag.app.quickstart import well_formed_share
    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    out = folder(arm, seed)
    config = load_config(TrainConfig, RECIPE, [f"records={TRAIN_RECORDS}", f"output_dir={out}",
                                               f"training.seed={seed}", *COMMON, *ARMS[arm][1]])
    start = time.monotonic()
    trained = run(config)
    train_s = time.monotonic() - start
    kinds = negatives(str(out), 300)  # scores the held-out items once (cached); support is read from the same rows
    support = _support(item_scores(out, 300))
    start = time.monotonic()
    answers = answers_arm(out.name, questions, data=out / "answers-questions.jsonl")  # runs in parallel: its own
    result = {
        "arm": arm, "seed": seed, "train_s": round(train_s, 1), "answer_s": round(time.monotonic() - start, 1),
        "steps": config.training.max_steps, "final_loss": trained.losses[-1]["loss"] if trained.losses else None,
        "easy": kinds["easy (other article)"]["auroc"], "article": kinds["article (random same-article)"]["auroc"],
        "hard": kinds["hard (BM25-best, data_gen)"]["auroc"], "support": support,
        "well_formed": well_formed_share(answers.parent / "records" / "single_pass.jsonl")["share"],
        "intervals": {kind: [value["low"], value["high"]] for kind, value in kinds.items()},
    }
    (out / "seed-result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result), flush=True)
    return result


def _support(rows: dict[str, dict[str, Any]]) -> float | None:
    """Support AUROC of scored held-out items: the gold records' IsSUP score against the support negatives' (another
    question's answer of the same form), as ``training.judgement.summarise`` computes it."""
    from selfrag.training.judgement import SUPPORT_NEGATIVE, auroc

    def scores(kind: str) -> list[float]:
        return [float(row["s_sup"]) for row in rows.values() if row["kind"] == kind and row["s_sup"] is not None]

    gold, wrong = scores("gold"), scores(SUPPORT_NEGATIVE)
    return auroc(gold, wrong) if gold and wrong else None


def run_all(arms: list[str], seeds: list[int], workers: int, questions: int, copy_to: Path | None) -> None:
    jobs = [(arm, seed) for seed in seeds for arm in arms if not (folder(arm, seed) / "seed-result.json").is_file()]
    logs = RUNS / "seed-logs"
    logs.mkdir(parents=True, exist_ok=True)

    def launch(job: tuple[str, int]) -> None:
        arm, seed = job
        shutil.rmtree(folder(arm, seed), ignore_errors=True)  # a run killed half-way starts over
        with (logs / f"{arm}-s{seed}.txt").open("w") as log:
            code = subprocess.run([sys.executable, __file__, "one", arm, str(seed), "--questions", str(questions)],
                                  cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"{arm} seed {seed}: {'done' if code == 0 else f'FAILED ({code}), see {logs}'}", flush=True)
        if copy_to is not None:
            copy_to.mkdir(parents=True, exist_ok=True)
            result = folder(arm, seed) / "seed-result.json"
            if result.is_file():
                shutil.copy(result, copy_to / f"{arm}-s{seed}.json")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(launch, jobs))


def results(paths: list[Path] | None = None) -> list[dict[str, Any]]:
    found = paths if paths is not None else sorted(RUNS.glob("*/seed-result.json"))
    return [json.loads(path.read_text(encoding="utf-8")) for path in found]


def table(rows: list[dict[str, Any]]) -> str:
    """One line per run and one per arm (the mean and the worst seed), each figure against its aim."""
    def cell(value: float | None, aim: float | None = None) -> str:
        if value is None:
            return "n/a"
        text = f"{value:.3f}"
        return f"**{text}**" if aim is not None and value < aim else text

    lines = ["| arm | seed | easy | random same-article | BM25-best | support | well-formed | train s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (list(ARMS).index(r["arm"]) if r["arm"] in ARMS else 99, r["seed"])):
        by_arm.setdefault(row["arm"], []).append(row)
        lines.append(f"| {row['arm']} | {row['seed']} | {cell(row['easy'], AIMS['easy'])} | "
                     f"{cell(row['article'], AIMS['article'])} | {cell(row['hard'])} | "
                     f"{cell(row['support'], AIMS['support'])} | {cell(row['well_formed'], AIMS['well_formed'])} | "
                     f"{row['train_s']:.0f} |")
    lines += ["", "| arm | seeds | mean easy | mean random same-article | mean support | mean well-formed | "
              "seeds meeting every aim |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for arm, runs in by_arm.items():
        met = sum(all((run[key] or 0) >= aim for key, aim in AIMS.items()) for run in runs)
        means = [statistics.mean(run[key] or 0 for run in runs) for key in ("easy", "article", "support",
                                                                               "well_formed")]
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(f"{m:.3f}" for m in means) + f" | {met}/{len(runs)} |")
    lines += ["", "Bold: below the aim (easy >= 0.97, random same-article >= 0.94, support >= 0.95, well-formed >= "
              "0.80). Arms:"]
    lines += [f"- `{arm}`: {ARMS[arm][0]}" for arm in by_arm if arm in ARMS]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("data", help="generate the records the runs read")
    many = sub.add_parser("run", help="every (arm, seed) not finished yet")
    many.add_argument("--arms", nargs="+", choices=list(ARMS), required=True)
    many.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    many.add_argument("--workers", type=int, default=1, help="runs at once (1 on a 2-core CPU; 4-6 on one GPU)")
    many.add_argument("--questions", type=int, default=48, help="held-out questions answered for well-formedness")
    many.add_argument("--copy-to", type=Path, help="also copy each seed-result.json here (a device's $OUT)")
    single = sub.add_parser("one", help="one (arm, seed) in this process")
    single.add_argument("arm", choices=list(ARMS))
    single.add_argument("seed", type=int)
    single.add_argument("--questions", type=int, default=48)
    show = sub.add_parser("table", help="the table of every finished run (or of the given seed-result files)")
    show.add_argument("files", nargs="*", type=Path)
    show.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.command == "data":
        data()
    elif args.command == "run":
        run_all(args.arms, args.seeds, args.workers, args.questions, args.copy_to)
    elif args.command == "one":
        one(args.arm, args.seed, args.questions)
    else:
        text = table(results(args.files or None))
        if args.out:
            args.out.write_text(text, encoding="utf-8")
        print(text)


if __name__ == "__main__":
    main()
