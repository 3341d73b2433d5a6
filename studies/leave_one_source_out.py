"""Leave one source out: train on the mixed-source recipe without source S, judge S (issue #33 item 1).

    python studies/leave_one_source_out.py                              # every arm, seed 0, 150 steps
    python studies/leave_one_source_out.py --seeds 0,1,2 --arms all,-nq-open --steps 150
    python studies/leave_one_source_out.py --table --scores studies/answers/loso-scores.jsonl   # the study's table

The recipe is ``configs/data_gen/mixed-sources.yaml``: the demo's SQuAD questions (whole-sentence answers), GSM8K and
general knowledge without retrieval, and the training split of the four shipped gold slices (HotpotQA, NQ-open,
RetrievalQA, BEGIN). Arm ``all`` trains on all of it; arm ``-S`` on all of it less source S (its questions, passages
and answers; GSM8K and general knowledge stay in every arm: they have no passages to judge). Each arm trains the
quickstart's CPU recipe (``configs/train/smollm2-135m-cpu.yaml``, ``--steps`` steps) with each seed, then is
teacher-forced on each source's gold records (``studies/source_transfer.py``'s scoring: relevance AUROC of the gold
passages against the easy and hard negatives; support AUROC of the ``[Fully supported]`` records against the
``[No support / Contradictory]`` ones, after a relevant passage; 95% bootstrap intervals):

* arm ``-S`` on every question of S (none of it trained): transfer to an unseen source;
* arm ``all`` on S's test split (``meta.split``: ~10% of a slice, the demo's 5 held-out SQuAD articles): the same
  source seen in training, on other questions.

Everything goes under ``runs/loso/`` (``<arm>/data``, ``<arm>/seed<N>/model``, ``scores.jsonl``: one line per arm,
seed and source); a rerun skips what is there. The table is written to ``runs/loso/table.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "studies"))

from source_transfer import SLICES, cell, label_slice, score  # noqa: E402

RECIPE = REPO / "configs" / "data_gen" / "mixed-sources.yaml"
TRAIN_RECIPE = REPO / "configs" / "train" / "smollm2-135m-cpu.yaml"
DEMO = REPO / "data_gen" / "demo"
SOURCES = ("squad", "hotpotqa", "nq-open", "retrievalqa", "begin")
OUT = REPO / "runs" / "loso"


def arm_recipe(arm: str, output: Path) -> dict[str, Any]:
    """The mixed-source data recipe for ``arm`` (``all`` or ``-S``), writing into ``output``."""
    settings: dict[str, Any] = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    settings["output"] = output
    for key in ("passages", "queries", "answers"):
        settings[key] = REPO / settings[key]
    for key in ("more_passages", "more_queries", "more_answers"):
        settings[key] = [REPO / path for path in settings[key]]
    left_out = arm[1:] if arm.startswith("-") else None
    if left_out is None:
        return settings
    if left_out not in SOURCES:
        raise SystemExit(f"unknown arm {arm!r}; expected all or -S for S in {', '.join(SOURCES)}")
    if left_out == "squad":  # the demo's queries without SQuAD: GSM8K and general knowledge; a slice's passages lead
        kept = output.parent / "queries-without-squad.jsonl"
        kept.parent.mkdir(parents=True, exist_ok=True)
        lines = [line for line in (DEMO / "queries.jsonl").read_text(encoding="utf-8").splitlines()
                 if line.strip() and json.loads(line)["meta"].get("source") != "squad_v2"]
        kept.write_text("\n".join(lines) + "\n", encoding="utf-8")
        settings.update(queries=kept, passages=settings["more_passages"][0], answers=None, limit=None)
        settings["more_passages"] = settings["more_passages"][1:]
        return settings
    part = SLICES / left_out
    for key in ("more_passages", "more_queries", "more_answers"):
        settings[key] = [path for path in settings[key] if path.parent != part]
    return settings


def generate(arm: str, reuse: bool = False) -> Path:
    if reuse:  # --reuse-data: the records made earlier (another machine: no corpus, splitter or fingerprint here)
        return existing(OUT / arm / "data" / "records.jsonl")
    from selfrag.config import from_dict
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run

    output = OUT / arm / "data"
    result = run(from_dict(GenerateConfig, arm_recipe(arm, output)))
    if result.problems:
        raise SystemExit(f"{arm}: {'; '.join(result.problems)}")
    return result.records_path


def train(records: Path, model_dir: Path, seed: int, steps: int) -> None:
    from selfrag.config import from_dict
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    if (model_dir / "metrics.json").is_file():
        return
    settings = yaml.safe_load(TRAIN_RECIPE.read_text(encoding="utf-8"))
    settings.update(records=records, output_dir=model_dir)
    settings["training"].update(seed=seed, max_steps=steps, bf16=False)  # as the table was measured: fp32 on
    settings.setdefault("lora", {})["layers"] = None  # every block (the recipe moved to bf16 on the top 15 since)
    run(from_dict(TrainConfig, settings))


def existing(path: Path) -> Path:
    if not path.is_file():
        raise SystemExit(f"{path}: missing; run once without --reuse-data to make it")
    return path


def test_records(source: str, split: str, reuse: bool = False) -> Path:
    """The gold records a model is judged on: a slice's questions of ``split``, or the demo's held-out SQuAD
    articles (the quickstart's sentence recipe's test split, labelled as the quickstart labels its test questions)."""
    if reuse:
        return existing(OUT / "judged" / f"{source}-{split}" / "records.jsonl")
    if source != "squad":
        return label_slice(source, OUT / "judged" / f"{source}-{split}", split=split)
    from selfrag.config import from_dict
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run

    settings = yaml.safe_load((REPO / "configs" / "data_gen" / "squad-demo-sentences.yaml").read_text("utf-8"))
    settings.update(passages=DEMO / "corpus.jsonl", queries=DEMO / "queries.jsonl",
                    answers=DEMO / "answers-sentences.jsonl", output=OUT / "judged" / "squad-test", split="test",
                    limit=None, more_queries=[])
    result = run(from_dict(GenerateConfig, settings))
    return result.records_path


def trained_on() -> str:
    """Where the arms train (seeds differ in the last digits between a GPU and the CPU)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def scored(done: list[dict[str, Any]], arm: str, seed: int, source: str) -> bool:
    return any(row["arm"] == arm and row["seed"] == seed and row["source"] == source for row in done)


def run_arms(arms: list[str], seeds: list[int], steps: int, items: int, reuse: bool = False) -> None:
    """Every arm with the first seed, then every arm with the next (a run cut short still has each arm once)."""
    OUT.mkdir(parents=True, exist_ok=True)
    scores_path = OUT / "scores.jsonl"
    done = [json.loads(line) for line in scores_path.read_text("utf-8").splitlines()] if scores_path.exists() else []
    records = {arm: generate(arm, reuse) for arm in arms}
    for seed in seeds:
        for arm in arms:
            model_dir = OUT / arm / f"seed{seed}" / "model"
            started = time.monotonic()
            train(records[arm], model_dir, seed, steps)
            print(f"[{arm} seed {seed}] trained in {time.monotonic() - started:.0f} s", flush=True)
            for source in [arm[1:]] if arm.startswith("-") else list(SOURCES):
                if scored(done, arm, seed, source):
                    continue
                split = "all" if arm.startswith("-") and source != "squad" else "test"
                result = score(model_dir, test_records(source, split, reuse), items if source == "squad" else None)
                row = {"arm": arm, "seed": seed, "steps": steps, "source": source, "split": split,
                       "device": trained_on(), **result}
                done.append(row)
                with scores_path.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(row) + "\n")
                print(f"[{arm} seed {seed}] {source}: relevance {cell(result['relevance']['all negatives'])}, "
                      f"support {cell(result['support'])}", flush=True)
    (OUT / "table.md").write_text(table(done), encoding="utf-8")
    print(table(done))


def table(rows: list[dict[str, Any]]) -> str:
    """Per source: relevance (all negatives, easy) and support AUROC left out vs trained on, one line per seed."""
    lines = ["| source | arm (seed; trained on): -S left S out | judged on | relevance AUROC, all negatives | "
             "relevance vs easy | relevance vs hard | support AUROC |", "| --- " * 7 + "|"]
    for source in SOURCES:
        for row in sorted((r for r in rows if r["source"] == source), key=lambda r: (r["arm"] != "all", r["seed"])):
            relevance = row["relevance"]
            none = {"auroc": None, "n_pos": 0, "n_neg": 0}
            where = "held-out articles" if source == "squad" else "test split" if row["arm"] == "all" else (
                "every question")
            device = row.get("device", "?")
            lines.append(f"| {source} | {row['arm']} ({row['seed']}; {device}) | {where} | "
                         f"{cell(relevance['all negatives'])} | "
                         f"{cell(relevance.get('easy', none))} | {cell(relevance.get('hard', none))} | "
                         f"{cell(row['support'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--arms", default="all," + ",".join(f"-{s}" for s in SOURCES))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=150, help="training steps (150: what the table was measured with)")
    parser.add_argument("--items", type=int, default=150, help="held-out SQuAD items per class")
    parser.add_argument("--table", action="store_true", help="only print the table of --scores")
    parser.add_argument("--scores", type=Path, default=OUT / "scores.jsonl",
                        help="with --table: a scores file (default runs/loso/scores.jsonl; the study's: "
                             "studies/answers/loso-scores.jsonl)")
    parser.add_argument("--reuse-data", action="store_true",
                        help="train and judge on the records an earlier run made (e.g. on a GPU machine)")
    args = parser.parse_args(argv)
    if args.table:
        rows = [json.loads(line) for line in args.scores.read_text("utf-8").splitlines()]
        print(table(rows))
        return 0
    run_arms(args.arms.split(","), [int(s) for s in args.seeds.split(",")], args.steps, args.items, args.reuse_data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
