"""Issue #42's study on sources the models never saw: copied-sentence SFT vs template-answer SFT vs template SFT + RL.

    python studies/rl_loso.py --out runs/rl-loso                          # seed 0, 200 SFT steps, 40 RL steps
    python studies/rl_loso.py --out runs/rl-loso --seed 1 --steps 300 --rl-steps 50 --left-out nq-open,retrievalqa
    python studies/rl_loso.py --out runs/rl-loso-long --rl-steps 120 --rl-at 40,80 --arms sft-template

Every arm trains on the quickstart's data recipe less the ``--left-out`` slices (their questions, passages and
answers), so all of those slices' questions with gold answers are never-trained questions (60 each for NQ-open and
RetrievalQA, against 2-6 in the shipped slices' test splits):

* ``sft-copied``: ``configs/data_gen/mixed-sources.yaml`` (answers are the gold passage's sentences);
* ``sft-template``: ``configs/data_gen/mixed-sources-template.yaml`` (one-sentence replies built from the question
  and its gold answer, issue #42 item 0);
* ``sft-template+rl``: ``sft-template`` trained further by ``selfrag rl --config configs/rl/smollm2-135m-cpu.yaml``
  (the demo's training questions, the demo corpus in the loop).

``--arms`` picks the SFT arms (``sft-template`` always trains: RL starts from it). ``--rl-at 40,80`` also judges the
RL run's adapter at those steps (its checkpoints, as ``sft-template+rl@40``...): one run's reward curve read as gold
answers. Each SFT arm is ``configs/train/smollm2-135m-cpu.yaml`` with ``--steps`` and ``--seed``. The arms are then
judged by ``studies/rl_study.py`` (each calibrated on the quickstart's 12 dev questions; single pass; plain RAG on
the same base) on the quickstart's 60 test questions and, per left-out slice, every question with a gold answer.
Everything goes under ``--out``; ``selfrag generate``, ``train``, ``rl``, ``calibrate`` and ``eval`` resume what they
finished, so a rerun with the same arguments continues.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "studies"))

import rl_study  # noqa: E402

RECIPES = {"sft-copied": REPO / "configs" / "data_gen" / "mixed-sources.yaml",
           "sft-template": REPO / "configs" / "data_gen" / "mixed-sources-template.yaml"}
TRAIN_RECIPE = REPO / "configs" / "train" / "smollm2-135m-cpu.yaml"
RL_RECIPE = REPO / "configs" / "rl" / "smollm2-135m-cpu.yaml"
SLICES = REPO / "data_gen" / "slices"


def data_recipe(recipe: Path, left_out: list[str], output: Path) -> dict[str, Any]:
    """``recipe`` with the left-out slices' corpora, queries and answers dropped, paths made absolute."""
    settings: dict[str, Any] = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    settings["output"] = str(output)
    for key in ("passages", "queries", "answers"):
        if settings.get(key):
            settings[key] = str(REPO / settings[key])
    dropped = {SLICES / name for name in left_out}
    for key in ("more_passages", "more_queries", "more_answers"):
        settings[key] = [str(REPO / path) for path in settings.get(key) or [] if (REPO / path).parent not in dropped]
    return settings


ADAPTER = "adapter_model.safetensors"


def checkpoint_model(final: Path, step: int) -> Path:
    """The RL run in ``final`` at ``step`` as a model folder beside it: ``checkpoints/checkpoint-<step>``'s adapter
    weights with the final folder's other files (tokenizer, selfrag.json, adapter_config.json). Only the tensors
    the final adapter holds are kept (a Trainer checkpoint may hold the grown embedding matrix too)."""
    import shutil

    from safetensors.torch import load_file, save_file

    dest = final.with_name(f"{final.name}-step{step}")
    if (dest / ADAPTER).is_file():
        return dest
    source = final / "checkpoints" / f"checkpoint-{step}" / ADAPTER
    if not source.is_file():
        raise SystemExit(f"rl_loso: --rl-at {step}: {source} does not exist (checkpoints every training.save_steps)")
    wanted = load_file(str(final / ADAPTER))
    weights = load_file(str(source))
    missing = sorted(set(wanted) - set(weights))
    if missing:
        raise SystemExit(f"rl_loso: {source} lacks {len(missing)} of the final adapter's tensors, e.g. {missing[0]}")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for path in final.iterdir():
        if path.is_file() and path.name != ADAPTER:
            shutil.copy2(path, partial / path.name)
    save_file({name: weights[name].contiguous() for name in wanted}, str(partial / ADAPTER))
    partial.rename(dest)
    return dest


def write_splits(folder: Path) -> Path:
    """The quickstart's dev (12) and test (60) questions, chosen as ``selfrag quickstart`` chooses them."""
    from selfrag.app.quickstart import QuickstartConfig, held_out_splits
    from selfrag.corpus import load_queries
    from selfrag.data_gen import DEMO_QUERIES
    from selfrag.evaluation.data import query_to_row
    from selfrag.jsonl import write_jsonl_atomic

    defaults = QuickstartConfig()
    dev, test = held_out_splits(load_queries(DEMO_QUERIES), defaults.dev_questions, defaults.test_questions,
                                defaults.test_mix)
    write_jsonl_atomic(folder / "dev.jsonl", [query_to_row(q) for q in dev])
    write_jsonl_atomic(folder / "test.jsonl", [query_to_row(q) for q in test])
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200, help="SFT steps of each arm")
    parser.add_argument("--rl-steps", type=int, default=40, help="GRPO steps on top of sft-template")
    parser.add_argument("--left-out", default="nq-open,retrievalqa", help="slices no arm trains on (comma-separated)")
    parser.add_argument("--arms", default=",".join(RECIPES), help="SFT arms to train (sft-template always trains)")
    parser.add_argument("--rl-at", default="", help="also judge the RL adapter at these steps (comma-separated)")
    args = parser.parse_args()
    chosen = [name for name in args.arms.split(",") if name]
    if unknown_arms := [name for name in chosen if name not in RECIPES]:
        parser.error(f"--arms: no arm {', '.join(unknown_arms)} (one of {', '.join(RECIPES)})")
    rl_at = sorted({int(step) for step in args.rl_at.split(",") if step})
    if any(not 0 < step < args.rl_steps for step in rl_at):
        parser.error(f"--rl-at: steps between 1 and --rl-steps - 1 ({args.rl_steps - 1}), got {args.rl_at}")
    left_out = [name for name in args.left_out.split(",") if name]
    unknown = [name for name in left_out if not (SLICES / name / "queries.jsonl").is_file()]
    if unknown:
        parser.error(f"--left-out: no shipped slice {', '.join(unknown)} (data_gen/slices/)")
    out = args.out.resolve()
    arms: dict[str, Path] = {}
    for arm, recipe in RECIPES.items():
        if arm not in chosen and arm != "sft-template":
            continue
        data = out / arm / "data"
        config = out / arm / "data.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(data_recipe(recipe, left_out, data), sort_keys=False), encoding="utf-8")
        rl_study.selfrag("generate", "--config", str(config))
        model = out / arm / f"seed{args.seed}"
        rl_study.selfrag("train", "--config", str(TRAIN_RECIPE), f"records={data / 'records.jsonl'}",
                         f"output_dir={model}", f"training.max_steps={args.steps}", f"training.seed={args.seed}")
        arms[arm] = model
    tuned = out / "sft-template+rl" / f"seed{args.seed}"
    rl_study.selfrag("rl", "--config", str(RL_RECIPE), f"model={arms['sft-template']}", f"output_dir={tuned}",
                     f"training.max_steps={args.rl_steps}", f"training.seed={args.seed}")
    for step in rl_at:
        arms[f"sft-template+rl@{step}"] = checkpoint_model(tuned, step)
    arms["sft-template+rl"] = tuned
    study = out / f"study-seed{args.seed}"
    rl_study.run(write_splits(out / "splits"), arms, study, slices=left_out)
    text = rl_study.table(study)
    (study / "table.md").write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
