"""Issue #55's study: does single-pass Self-RAG beat plain RAG and a fine-tuned RAG baseline on sources it never saw?

    python studies/transfer.py --out runs/transfer --seeds 0,1,2              # everything, 3 seeds (hours on 2 cores)
    python studies/transfer.py --out runs/transfer --seeds 0 --sets quickstart,dev   # while choosing: dev only
    python studies/transfer.py --out runs/transfer --table                   # the table again, from what is there
    python studies/transfer.py --out runs/t-s0 --join runs/t-s1 --table      # seeds run apart, in one table
    python studies/transfer.py --out runs/arm-s0 --versus runs/t-s0 --table  # an arm recipe against the shipped one

Per seed ``s``, on the quickstart's recipe (``configs/data_gen/mixed-sources-nq.yaml`` since 2026-11-30; before,
``mixed-sources.yaml``: ``--data-recipe configs/data_gen/mixed-sources.yaml`` reproduces the earlier runs; +
``configs/train/smollm2-135m-cpu.yaml``):

1. ``selfrag quickstart output_dir=OUT/seed-s train.training.seed=s``: the records, the single-pass model (SFT),
   calibrated the quickstart's way, and the quickstart's own table;
2. ``selfrag train form=rag`` on the same records, recipe, steps and seed: the fine-tuned RAG baseline (the paper's
   "FT + retrieval" row), in ``OUT/seed-s/ft-rag`` (``training.max_length=640``: its prompts hold the passages);
3. with ``--dev-calibrated``, a copy of the SFT model calibrated on the dev sets instead of the quickstart's 12 SQuAD
   questions (``selfrag calibrate`` on every nq-open and retrievalqa question, whose ``gold_passage_ids`` are the
   passages holding the answer): a choice made on dev, so its dev figures are in-sample and only test judges it;
   and the same model with ``inference.on_unsupported=flag`` (the arm "flagging"), which is what ``calibrate``
   advises when even ``support_bound=0`` abstains on more answerable dev questions than its target: the answer is
   kept and flagged ``low_confidence`` instead of replaced by the abstain sentence (the paper's runtime never
   abstains);
4. with ``--rl-steps N``, ``selfrag rl`` from the SFT model (``configs/rl/smollm2-135m-cpu.yaml``, or
   ``--rl-recipe``'s config on the questions of the seed's records), calibrated again the quickstart's way, and judged
   on every set after the SFT arms (a stopped run has their rows first);
5. ``selfrag eval`` of every model on every question set, one judgement for all modes (the paper's metric: a gold
   string occurs in the answer; baselines abstain only with their prompt's abstain sentence; the overlap claim
   judge), ``inference.top_k=3``, ``inference.max_tokens=96``, batch 8 (results/transfer.md names each run's
   batch). Plain RAG (the untuned base) answers each set once.

Question sets (``studies/transfer/``, written by ``studies/transfer_data.py``; none is in any training slice):

* ``quickstart``: the quickstart's 60 held-out demo questions (SQuAD articles never trained on, searched in the
  demo corpus);
* dev (read for every choice): ``nq-open`` (100), ``retrievalqa`` (40 news questions), ``popqa-dev`` (57 PopQA
  long-tail questions that the test set does not hold, with the same kind of passages; dev since 2026-11-30);
* test (read once per change): ``popqa`` (50), ``triviaqa`` (50), ``hotpotqa`` (56), each with its three passages.

The table pools the seeds: per set and arm, gold answers on answerable questions (summed over seeds), the paired
bootstrap 95% interval of the difference to plain RAG and to fine-tuned RAG (pairs: the same question in the same
seed), false abstains on answerable questions, unsupported claims and engine calls per question; under it, for
every single-pass arm on every test set, which of the issue's aims it meets and which it misses. Every command
resumes what it finished, so a rerun continues; results go under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "studies"))

from rl_study import cpu_name, gold, paired_interval, selfrag  # noqa: E402  (the studies import each other as scripts)

SETS = REPO / "studies" / "transfer"
DEMO_CORPUS = REPO / "data_gen" / "demo" / "corpus.jsonl"
TRAIN_RECIPE = REPO / "configs" / "train" / "smollm2-135m-cpu.yaml"
RL_RECIPE = REPO / "configs" / "rl" / "smollm2-135m-cpu.yaml"
DEV, TEST = ("nq-open", "retrievalqa", "popqa-dev"), ("popqa", "triviaqa", "hotpotqa")
#: the dev-calibrated arm's calibration questions (every dev question before popqa-dev joined dev; kept so that arm
#: means one thing)
DEV_CALIBRATION = ("nq-open", "retrievalqa")
EVAL_SETTINGS = ["inference.top_k=3", "inference.max_tokens=96", "batch_size=8", "judge.kind=overlap"]
#: form=rag's examples hold their question's passages in the prompt: 635 ids at the 99th percentile of the
#: quickstart's records (the recipe's 320 would drop half of them)
RAG_LENGTH = 640
FLAGGING = "single-pass SFT, dev-calibrated, flagging"
ARMS = ("plain RAG", "fine-tuned RAG", "single-pass SFT", "single-pass SFT, dev-calibrated", FLAGGING,
        "single-pass SFT+RL")
#: each single-pass arm's eval folder under seed-s/evals/<set>/ (beside the quickstart's own eval/, which `eval` owns)
FOLDERS = {"single-pass SFT": "sft", "single-pass SFT, dev-calibrated": "sft-devcal", FLAGGING: "sft-devcal-flag",
           "single-pass SFT+RL": "sft+rl"}


def question_sets(seed_dir: Path, names: list[str]) -> dict[str, tuple[Path, list[str]]]:
    """name -> (questions file, extra eval settings): the quickstart's test split searches the demo corpus; the
    dev and test sets carry their passages."""
    sets: dict[str, tuple[Path, list[str]]] = {}
    for name in names:
        if name == "quickstart":
            sets[name] = (seed_dir / "splits" / "test.jsonl", [f"retriever.corpus={DEMO_CORPUS}"])
        else:
            sets[name] = (SETS / f"{name}.jsonl", [])
    return sets


def dev_calibrated(out: Path, seed_dir: Path, sft: Path) -> Path:
    """A copy of the SFT model (no checkpoints) calibrated on every dev question (nq-open and retrievalqa)."""
    import shutil

    model = seed_dir / "model-devcal"
    if not (model / "adapter_config.json").is_file():
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(sft, model, ignore=shutil.ignore_patterns("checkpoints"))
    data = out / "dev-calibration.jsonl"
    data.write_text("".join((SETS / f"{name}.jsonl").read_text(encoding="utf-8") for name in DEV_CALIBRATION),
                    encoding="utf-8")
    if not (seed_dir / "devcal-calibration" / "calibration.json").is_file():
        selfrag("calibrate", f"data={data}", f"model={model}", f"output_dir={seed_dir / 'devcal-calibration'}",
                "inference.top_k=3", "inference.max_tokens=96")
    return model


def run_seed(out: Path, seed: int, names: list[str], steps: int | None, rl_steps: int, devcal: bool,
             rag_steps: int | None = None, data_recipe: Path | None = None, sp_train: list[str] = (),
             rl_recipe: Path | None = None) -> None:
    seed_dir = out / f"seed-{seed}"
    budget = [f"max_steps={steps}"] if steps else []
    recipe = [f"data_recipe={data_recipe.resolve()}"] if data_recipe else []
    # eval.batch_size=8: the quickstart's own table is the SFT arm's quickstart row, answered as every arm is
    # (EVAL_SETTINGS)
    selfrag("quickstart", f"output_dir={seed_dir}", f"train.training.seed={seed}", "eval.batch_size=8", *budget,
            *recipe, *(f"train.{setting}" for setting in sp_train))
    sft = seed_dir / "model"
    rag_budget = rag_steps or steps
    selfrag("train", "--config", str(TRAIN_RECIPE), f"records={seed_dir / 'data' / 'records.jsonl'}",
            f"output_dir={seed_dir / 'ft-rag'}", "form=rag", f"training.seed={seed}",
            f"training.max_length={RAG_LENGTH}", *([f"training.max_steps={rag_budget}"] if rag_budget else []))
    models: dict[str, tuple[Path, list[str]]] = {"single-pass SFT": (sft, [])}
    if devcal:
        calibrated = dev_calibrated(out, seed_dir, sft)
        models["single-pass SFT, dev-calibrated"] = (calibrated, [])
        models[FLAGGING] = (calibrated, ["inference.on_unsupported=flag"])
    sets = question_sets(seed_dir, names)

    def judge(arms: dict[str, tuple[Path, list[str]]], baselines: bool) -> None:
        for name, (questions, extra) in sets.items():
            common = [f"data={questions}", *extra, *EVAL_SETTINGS]
            if baselines:
                plain = out / "plain" / name if name != "quickstart" else seed_dir / "eval-plain"  # same questions
                selfrag("eval", *common, f"model={sft}", f"output_dir={plain}", "modes=[plain_rag]")
                selfrag("eval", *common, f"model={sft}", f"ft_rag_model={seed_dir / 'ft-rag'}", "modes=[ft_rag]",
                        f"output_dir={seed_dir / 'evals' / name / 'ft-rag'}")
            for arm, (model, settings) in arms.items():
                selfrag("eval", *common, f"model={model}", "modes=[single_pass]", *settings,
                        f"output_dir={seed_dir / 'evals' / name / FOLDERS[arm]}")

    judge(models, baselines=True)
    if rl_steps:  # last: the SFT arms' rows are complete before the longest stage starts
        rl = seed_dir / "rl"
        # another recipe names its sources; records= keeps the questions the SFT model was trained on
        questions = [f"records={seed_dir / 'data' / 'records.jsonl'}"] if rl_recipe else []
        selfrag("rl", "--config", str(rl_recipe or RL_RECIPE), f"model={sft}", f"output_dir={rl}",
                f"training.max_steps={rl_steps}", f"training.seed={seed}", *questions)
        if not (seed_dir / "rl-calibration" / "calibration.json").is_file():
            selfrag("calibrate", f"data={seed_dir / 'splits' / 'dev.jsonl'}", f"model={rl}",
                    f"retriever.corpus={DEMO_CORPUS}", f"output_dir={seed_dir / 'rl-calibration'}",
                    "inference.top_k=3", "inference.max_tokens=96")
        judge({"single-pass SFT+RL": (rl, [])}, baselines=False)


def records(folder: Path, mode: str) -> dict[str, dict[str, Any]] | None:
    path = folder / "records" / f"{mode}.jsonl"
    if not path.is_file() or not (folder / "results.json").is_file():
        return None
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {row["question"]: row for row in rows}


def arm_rows(out: Path, seed_dir: Path, name: str, runtime: str = "") -> dict[str, dict[str, dict[str, Any]] | None]:
    """Every arm's answers to set ``name`` in one seed; ``runtime``: the single-pass arms' answers under that
    runtime variant (``--runtime-name``) instead of the default runtime's."""
    plain = out / "plain" / name if name != "quickstart" else seed_dir / "eval-plain"
    folder = seed_dir / "evals" / name
    rows = {"plain RAG": records(plain, "plain_rag"), "fine-tuned RAG": records(folder / "ft-rag", "ft_rag"),
            **{arm: records(folder / runtime_folder(name, runtime), "single_pass") for arm, name in FOLDERS.items()}}
    if name == "quickstart" and not runtime and rows["single-pass SFT"] is None:
        # the quickstart's own evaluation answered its split with the SFT model under the same settings
        # (EVAL_SETTINGS: top 3 of the demo corpus, 96 tokens, batch 8, the overlap judge)
        rows["single-pass SFT"] = records(seed_dir / "eval", "single_pass")
    return rows


def runtime_folder(folder: str, runtime: str) -> str:
    """A single-pass arm's eval folder under a runtime variant: ``sft@NAME`` (the default runtime: ``sft``)."""
    return f"{folder}@{runtime}" if runtime else folder


def run_runtime(out: Path, seed: int, names: list[str], runtime: str, settings: list[str], rl: bool = False) -> None:
    """``--runtime-name``: the seed's trained single-pass models (SFT; with ``rl`` SFT+RL too) answer the sets again
    with the runtime ``settings``, beside their default-runtime answers; nothing is trained."""
    seed_dir = out / f"seed-{seed}"
    models = {"single-pass SFT": seed_dir / "model"}
    if rl:
        models["single-pass SFT+RL"] = seed_dir / "rl"
    missing = [str(model) for model in models.values() if not (model / "adapter_config.json").is_file()]
    if missing:
        raise SystemExit(f"transfer: --runtime-name reads trained models; {', '.join(missing)} holds none (train "
                         "them first: the same command without --runtime-name)")
    for name, (questions, extra) in question_sets(seed_dir, names).items():
        for arm, model in models.items():
            selfrag("eval", f"data={questions}", *extra, *EVAL_SETTINGS, f"model={model}", "modes=[single_pass]",
                    *settings, f"output_dir={seed_dir / 'evals' / name / runtime_folder(FOLDERS[arm], runtime)}")


def seed_folders(outs: list[Path]) -> list[tuple[Path, Path]]:
    """(out, seed folder) for every ``seed-*`` under the ``--out`` folders, sorted by seed; seeds run as separate
    processes each keep their own out (two processes never write one ``plain/`` eval), and join here."""
    found: dict[str, tuple[Path, Path]] = {}
    for out in outs:
        for folder in sorted(p for p in out.glob("seed-*") if p.is_dir()):
            if folder.name in found:
                raise SystemExit(f"transfer: {folder.name} is in both {found[folder.name][0]} and {out}; "
                                 "give each seed once")
            found[folder.name] = (out, folder)
    return [found[name] for name in sorted(found, key=lambda name: int(name.split("-")[1]))]


#: issue #55's aims for every single-pass arm on every test set
AIM_FALSE_ABSTAINS = 0.25


def aims(name: str, arm: str, held: np.ndarray, base: np.ndarray, tuned: np.ndarray,
         summaries: dict[str, dict[str, Any]]) -> str:
    """One line: which of the aims this single-pass arm meets on this set (gold at least plain RAG's and fine-tuned
    RAG's, fewer unsupported claims than both, false abstains on answerable questions at most 25%)."""
    own = summaries[arm]
    checks = [
        (f"gold >= plain RAG ({int(held.sum())} vs {int(base.sum())})", held.sum() >= base.sum()),
        (f"gold >= fine-tuned RAG ({int(held.sum())} vs {int(tuned.sum())})", held.sum() >= tuned.sum()),
    ]
    rates = [summaries[other]["unsupported_claim_rate"] for other in ("plain RAG", "fine-tuned RAG")]
    mine = own["unsupported_claim_rate"]
    checks.append((f"fewer unsupported claims ({_percent(mine)} vs {_percent(rates[0])}, {_percent(rates[1])})",
                   mine is not None and all(rate is None or mine < rate for rate in rates)))
    abstains = own["false_abstain_rate"]
    checks.append((f"false abstains <= 25% ({_percent(abstains)})",
                   abstains is not None and abstains <= AIM_FALSE_ABSTAINS))
    missed = [text for text, ok in checks if not ok]
    met = [text for text, ok in checks if ok]
    verdict = "all aims met" if not missed else "missed: " + "; ".join(missed)
    return f"- {name}, {arm}: {verdict}" + (f" (met: {'; '.join(met)})" if missed and met else "")


def table(outs: list[Path], runtime: str = "") -> str:
    """The study's table (see the module docstring); ``runtime``: the single-pass arms' answers under that runtime
    variant (``--runtime-name``), the baselines' as they are."""
    from selfrag.evaluation.metrics import summarize

    seeds = seed_folders(outs)
    lines = [f"CPU: {cpu_name()}; seeds: {', '.join(p.name.split('-')[1] for _, p in seeds)}", "",
             "| set | kind | arm | seeds | gold / answerable | vs plain RAG (95% CI) | vs fine-tuned RAG (95% CI) "
             "| false abstains | unsupported claims | hedged | engine calls |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    verdicts: list[str] = []
    for name in ["quickstart", *DEV, *TEST]:
        kind = "trained sources' held-out" if name == "quickstart" else ("dev" if name in DEV else "test")
        pooled: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        paired: dict[str, list[float]] = {arm: [] for arm in ARMS}
        counted: dict[str, int] = {arm: 0 for arm in ARMS}
        for out, seed_dir in seeds:
            rows = arm_rows(out, seed_dir, name, runtime)
            if rows["plain RAG"] is None or rows["fine-tuned RAG"] is None:
                continue
            answerable = [q for q, row in rows["plain RAG"].items() if row["answerable"]]
            for arm in ARMS:
                found = rows[arm]
                if found is None:
                    continue
                counted[arm] += 1
                pooled[arm] += list(found.values())
                paired[arm] += [gold(found[q]) for q in answerable]
        if not counted["plain RAG"]:
            continue
        base, tuned = np.array(paired["plain RAG"]), np.array(paired["fine-tuned RAG"])
        summaries: dict[str, dict[str, Any]] = {}
        for arm in ARMS:
            if not counted[arm] or len(paired[arm]) != len(base):
                continue
            held = np.array(paired[arm])
            summary = summaries[arm] = summarize(pooled[arm])
            if kind == "test" and arm not in ("plain RAG", "fine-tuned RAG") and len(tuned) == len(held):
                verdicts.append(aims(name, arm, held, base, tuned, summaries))
            versus = [_difference(reference, held) if arm != title else "—"
                      for reference, title in ((base, "plain RAG"), (tuned, "fine-tuned RAG"))]
            unsupported = summary["unsupported_claim_rate"]
            lines.append(
                f"| {name} | {kind} | {arm} | {counted[arm]} | {int(held.sum())}/{len(held)} | {versus[0]} | "
                f"{versus[1]} | {_percent(summary['false_abstain_rate'])} | {_percent(unsupported)} "
                f"({summary['claims_judged']}) | {_percent(summary['hedged_rate'])} | "
                f"{summary['engine_calls_per_query']:.1f} |")
    if verdicts:
        lines += ["", "Aims on the test sets (issue #55; gold summed over the seeds):", *verdicts]
    return "\n".join(lines)


def versus(outs: list[Path], others: list[Path], runtime: str = "", other_runtime: str = "") -> str:
    """Two recipes' models set against each other: for every set and every arm both hold, gold answers and false
    abstains of ``outs`` (an arm recipe) and ``others`` (the recipe it changes), paired on the same question in the
    same seed; only seeds both hold count (a seed is ``seed-s`` under any of the folders). ``runtime`` and
    ``other_runtime``: each side's single-pass answers under that runtime variant ("": the default runtime's);
    ``others`` the same folders as ``outs`` with ``runtime`` alone sets a variant against the default runtime."""
    from selfrag.evaluation.metrics import summarize

    mine, theirs = dict((p.name, (o, p)) for o, p in seed_folders(outs)), dict(
        (p.name, (o, p)) for o, p in seed_folders(others))
    common = sorted(set(mine) & set(theirs), key=lambda name: int(name.split("-")[1]))
    lines = [f"seeds in both: {', '.join(name.split('-')[1] for name in common) or 'none'}", "",
             "| set | arm | seeds | gold: this recipe | gold: the other | difference (95% CI) | false abstains: this "
             "| false abstains: the other |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in ["quickstart", *DEV, *TEST]:
        pairs = [(arm_rows(*mine[seed], name, runtime), arm_rows(*theirs[seed], name, other_runtime))  # once a set
                 for seed in common]
        for arm in ARMS:
            a: list[float] = []
            b: list[float] = []
            rows_a: list[dict[str, Any]] = []
            rows_b: list[dict[str, Any]] = []
            seeds = 0
            for found_a, found_b in ((x[arm], y[arm]) for x, y in pairs):
                if found_a is None or found_b is None:
                    continue
                seeds += 1
                answerable = [q for q, row in found_b.items() if row["answerable"]]
                a += [gold(found_a[q]) for q in answerable]
                b += [gold(found_b[q]) for q in answerable]
                rows_a += list(found_a.values())
                rows_b += list(found_b.values())
            if not seeds:
                continue
            held, other = np.array(a), np.array(b)
            abstains = [_percent(summarize(rows)["false_abstain_rate"]) for rows in (rows_a, rows_b)]
            lines.append(f"| {name} | {arm} | {seeds} | {int(held.sum())}/{len(held)} | {int(other.sum())}/{len(other)}"
                         f" | {_difference(other, held)} | {abstains[0]} | {abstains[1]} |")
    return "\n".join(lines)


def _difference(reference: np.ndarray, held: np.ndarray) -> str:
    if len(reference) != len(held) or not len(held):
        return "n/a"
    low, high = paired_interval(reference, held)
    return f"{held.mean() - reference.mean():+.2f} [{low:+.2f}, {high:+.2f}]"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated")
    parser.add_argument("--sets", default="quickstart,dev,test",
                        help="question sets: quickstart, dev (nq-open, retrievalqa), test (popqa, triviaqa, hotpotqa) "
                        "or single names, comma-separated")
    parser.add_argument("--steps", type=int, help="training steps of both models (default: the recipe's)")
    parser.add_argument("--rag-steps", type=int,
                        help="the fine-tuned RAG baseline's steps, if not --steps' (fewer: a handicapped baseline)")
    parser.add_argument("--rl-steps", type=int, default=0, help="also train SFT+RL for this many GRPO steps")
    parser.add_argument("--rl-recipe", type=Path,
                        help="the RL config instead of configs/rl/smollm2-135m-cpu.yaml, trained on the questions of "
                        "the seed's records (e.g. studies/transfer/rl-recipes/rl-sources.yaml: every source, F1 "
                        "reward)")
    parser.add_argument("--dev-calibrated", action="store_true",
                        help="also judge the SFT model calibrated on the dev sets")
    parser.add_argument("--data-recipe", type=Path,
                        help="the labelling recipe of both models' records (default: the quickstart's)")
    parser.add_argument("--sp-train", action="append", default=[], metavar="KEY=VALUE",
                        help="a training setting of the single-pass model alone (e.g. training.loss_weights.text=4); "
                        "the fine-tuned RAG baseline keeps the recipe's")
    parser.add_argument("--table", action="store_true", help="only print the table from what --out holds")
    parser.add_argument("--join", type=Path, action="append", default=[], metavar="OUT",
                        help="another --out folder whose seeds join the table (seeds run as separate processes, "
                        "each with its own --out)")
    parser.add_argument("--versus", type=Path, action="append", default=[], metavar="OUT",
                        help="also set this recipe's models (--out, --join) against another recipe's "
                        "(its --out folders), paired per seed and question; with --runtime-name, both sides' "
                        "answers under that runtime")
    parser.add_argument("--runtime-name", metavar="NAME",
                        help="a runtime variant: the trained single-pass SFT model (with --rl-steps, SFT+RL too) "
                        "answers --sets again with --runtime's settings (in evals/<set>/sft@NAME), set against the "
                        "default runtime's answers, paired")
    parser.add_argument("--runtime", action="append", default=[], metavar="KEY=VALUE",
                        help="an inference setting of the --runtime-name variant "
                        "(e.g. inference.weights.retrieval=0.5)")
    args = parser.parse_args()
    if args.runtime_name:
        if not args.runtime:
            parser.error("--runtime-name needs at least one --runtime KEY=VALUE")
        if not args.table:
            groups = {"dev": list(DEV), "test": list(TEST)}
            names = [name for item in args.sets.split(",") for name in groups.get(item, [item])]
            for seed in (int(s) for s in args.seeds.split(",")):
                run_runtime(args.out, seed, names, args.runtime_name, args.runtime, rl=bool(args.rl_steps))
        outs = [args.out, *args.join]
        print(f"runtime {args.runtime_name} ({' '.join(args.runtime)}) against the default runtime:")
        print(versus(outs, outs, args.runtime_name))
        print(f"\nthe study's table, single-pass under runtime {args.runtime_name}:")
        print(table(outs, args.runtime_name))
        if args.versus:
            print(f"\nthese models against --versus's, both under runtime {args.runtime_name}:")
            print(versus(outs, args.versus, args.runtime_name, args.runtime_name))
        return
    if not args.table:
        groups = {"dev": list(DEV), "test": list(TEST)}
        names = [name for item in args.sets.split(",") for name in groups.get(item, [item])]
        unknown = sorted(set(names) - {"quickstart", *DEV, *TEST})
        if unknown:
            parser.error(f"--sets: unknown {unknown}; expected quickstart, dev, test, {', '.join(DEV + TEST)}")
        for seed in (int(s) for s in args.seeds.split(",")):
            run_seed(args.out, seed, names, args.steps, args.rl_steps, args.dev_calibrated, args.rag_steps,
                     args.data_recipe, args.sp_train, args.rl_recipe)
    text = table([args.out, *args.join])
    (args.out / "table.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    if args.versus:
        print()
        print(versus([args.out, *args.join], args.versus))


if __name__ == "__main__":
    main()
