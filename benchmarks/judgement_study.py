"""The judgement study: which training recipe makes SmolLM2-135M's reflection tokens carry judgement on CPU.

    # 1. data: gold records of train articles, and of the 5 held-out articles (never seen in training)
    selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data-train split=train
    selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data-test split=test
    # 2. one arm = one `selfrag train` with judgement evaluation on the held-out articles
    python benchmarks/judgement_study.py run B-words-w5-row10
    # 3. the table of every finished arm -> benchmarks/judgement_study.md
    python benchmarks/judgement_study.py table

Each arm is the project's own pipeline (`selfrag train`, configs/train/smollm2-135m-cpu.yaml plus the arm's
overrides); the judgement (relevance AUROC vs easy / hard negatives, support AUROC with answers of the same form
on both sides, 95% bootstrap intervals) is written by training itself to ``<run>/judgement.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "runs" / "study"
LOGS = REPO / "runs" / "study-logs"
#: Arms timed on a CPU shared with seven other sessions (2-4x slower than alone), before logits were kept only
#: where a label is read (commit 608149b, ~2x faster steps).
SHARED = {"A-baseline": " (shared, old loss)", "B-words-w5-row10": " (shared, old loss)",
          "C-reflonly-rel10": " (old loss)", "H-text0.1-lr2e-3": " (tests running beside it)",
          "L-start5-600steps": " (tests running beside it for ~15 min)",
          "N-question-order": " (tests beside it for ~5 min)",
          "O-question-rel10": " (other sessions' tests and a vLLM install beside it)",
          "P-q50-repeat": " (a benchmark beside it for ~20 min)", "N-seed2": " (tests beside it for ~3 min)",
          "R-seed2-constant-lr": " (a fresh-clone CI run beside it for ~20 min)",
          "S-seed2-wsd": " (tests beside it for ~1 min)", "T-qs-order": " (alone)",
          "S-qs-order-300steps": " (tests beside it for ~3 min)",
          "U-qs-order-full": " (unit tests beside it for ~2 min)", "V-q215-3epochs": " (alone)",
          "W-qs-order-rank1": " (unit tests beside it for ~1 min)", "W-qs-order-rank1-150steps": " (alone)",
          "W-seed2-rank1": " (alone)",
          "W-qs-seed1-rank1-150steps": " (a scoring job beside it for ~14 min)",
          "W-qs-seed2-rank1-150steps": " (alone)", "W-qs-seed3-rank1-150steps": " (alone)",
          "W-qs-order-rank1-150steps-start5": " (cut by an environment restart after its last step; the resumed part)",
          "W-qs-seed1-rank1-150steps-start5": " (alone but for ~10 s of unit tests)",
          "W-qs-seed2-rank1-150steps-start5": " (alone)", "W-qs-seed3-rank1-150steps-start5": " (alone)",
          "W-qs-order-rank3-150steps-start5": " (quickstart tests beside it for ~4 min)",
          "W-qs-order-r64-150steps-start5": " (alone)",
          "E-qs-erased-150steps-start5": " (alone but for ~10 s of data generation)",
          "X-full-rank1-1000steps": " (unit tests beside it for ~1 min)",
          "G-qs-h2-rank1-150steps-start5": " (alone)"}
COMMON = [
    "records=runs/data-train/records.jsonl",
    "eval_records=runs/data-test/records.jsonl",
    "training.eval_fraction=0",
    "training.eval_steps=50",
    "training.save_steps=1000",
    # the recipe sets relevance_rank: 1 since adcfdf8; every arm before W ran without it (W arms set it again)
    "training.relevance_rank=0",
]
HELD_OUT = COMMON[1].split("=", 1)[1]  # the arms' held-out articles' records
#: arm name -> (what it tests, overrides on top of COMMON and the recipe's own settings)
ARMS: dict[str, tuple[str, list[str]]] = {
    "A-baseline": (
        "previous recipe (mean rows, plain loss) on the clean data",
        ["tokens.init=mean", "training.loss_weights={}", "training.row_lr_multiplier=1", "training.max_steps=150",
         "judgement_items=100"],
    ),
    "B-words-w5-row10": (
        "word-initialised rows, IsREL/IsSUP loss weight 5, rows at 10x the learning rate",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "judgement_items=100"],
    ),
    "C-reflonly-rel10": (
        "B, reflection positions only (text weight 0), IsREL weight 10",
        ["tokens.init=words", "training.loss_weights.relevance=10", "training.loss_weights.support=5",
         "training.loss_weights.text=0", "training.row_lr_multiplier=10", "training.max_steps=150",
         "judgement_items=100"],
    ),
    "D-text0.1-rel10": (
        "C with the answer text at weight 0.1 (the model still learns the answer's format)",
        ["tokens.init=words", "training.loss_weights.relevance=10", "training.loss_weights.support=5",
         "training.loss_weights.text=0.1", "training.row_lr_multiplier=10", "training.max_steps=150",
         "judgement_items=100"],
    ),
    "F-h2-text0.1": (
        "D on data with two hard negatives per question (hard_negatives=2: [Irrelevant] is 2/3 of IsREL)",
        ["records=runs/data-train-h2/records.jsonl", "tokens.init=words", "training.loss_weights.relevance=10",
         "training.loss_weights.support=5", "training.loss_weights.text=0.1", "training.row_lr_multiplier=10",
         "training.max_steps=150", "judgement_items=100"],
    ),
    "I-text0.1-balanced": (
        "D with IsREL class-balanced (training.balance=[relevance])",
        ["tokens.init=words", "training.loss_weights.relevance=10", "training.loss_weights.support=5",
         "training.loss_weights.text=0.1", "training.row_lr_multiplier=10", "training.max_steps=150",
         "training.balance=[relevance]", "judgement_items=100"],
    ),
    "J-h2-text0.1-balanced": (
        "F with IsREL class-balanced",
        ["records=runs/data-train-h2/records.jsonl", "tokens.init=words", "training.loss_weights.relevance=10",
         "training.loss_weights.support=5", "training.loss_weights.text=0.1", "training.row_lr_multiplier=10",
         "training.max_steps=150", "training.balance=[relevance]", "judgement_items=100"],
    ),
    "K-text0.1-start5": (
        "D with the first answer word after a verdict at weight 5 (training.loss_weights.answer_start)",
        ["tokens.init=words", "training.loss_weights.relevance=10", "training.loss_weights.support=5",
         "training.loss_weights.text=0.1", "training.loss_weights.answer_start=5", "training.row_lr_multiplier=10",
         "training.max_steps=150", "judgement_items=100"],
    ),
    "M-text0.3-rel10": (
        "B with IsREL weight 10 and the answer words at 0.3 (between B's 1 and D's 0.1)",
        ["tokens.init=words", "training.loss_weights.relevance=10", "training.loss_weights.support=5",
         "training.loss_weights.text=0.3", "training.row_lr_multiplier=10", "training.max_steps=150",
         "judgement_items=100"],
    ),
    "L-start5-600steps": (
        "K for 600 steps (4x the quickstart budget: the full CPU recipe's length)",
        ["tokens.init=words", "training.loss_weights.relevance=10", "training.loss_weights.support=5",
         "training.loss_weights.text=0.1", "training.loss_weights.answer_start=5", "training.row_lr_multiplier=10",
         "training.max_steps=600", "training.eval_steps=100", "judgement_items=100"],
    ),
    "N-question-order": (
        "B with each question's records in consecutive batches (training.order=question): every step contrasts a "
        "question's gold passage with its easy, hard and support negatives",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "judgement_items=100"],
    ),
    "N-seed1": (
        "N with training.seed=1 (another data order and initialisation): how stable is N?",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "training.seed=1",
         "judgement_items=100"],
    ),
    "N-seed2": (
        "N with training.seed=2: how often does N learn relevance within 150 steps?",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "training.seed=2",
         "judgement_items=100"],
    ),
    "N-seed2-300steps": (
        "N-seed2 (which had learned no relevance at step 100) for 300 steps: does a run that misses the jump in 150 "
        "steps catch it with twice the budget?",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=300", "training.order=question", "training.seed=2",
         "training.eval_steps=75", "judgement_items=100"],
    ),
    "R-seed2-constant-lr": (
        "N-seed2 with a constant learning rate (no cosine decay): N-seed2 missed the jump in 150 steps but caught it "
        "by step 150 of a 300-step schedule, whose learning rate is still high there. Is it the decay?",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "training.seed=2",
         "trl.lr_scheduler_type=constant_with_warmup", "judgement_items=100"],
    ),
    "S-seed2-wsd": (
        "N-seed2 with warm-up, a constant learning rate to step 120, then a 30-step cosine decay "
        "(`trl.lr_scheduler_type=warmup_stable_decay`): R's constant rate caught the jump but left the verdicts "
        "uncalibrated (gold passages called relevant 1% of the time at 0.5); does a short decay settle them?",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "training.seed=2",
         "trl.lr_scheduler_type=warmup_stable_decay", "trl.lr_scheduler_kwargs.num_decay_steps=30",
         "judgement_items=100"],
    ),
    "S-seed1-wsd": (
        "S with seed 1",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "training.seed=1",
         "trl.lr_scheduler_type=warmup_stable_decay", "trl.lr_scheduler_kwargs.num_decay_steps=30",
         "judgement_items=100"],
    ),
    "S-seed3-wsd": (
        "S with seed 3",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "training.seed=3",
         "trl.lr_scheduler_type=warmup_stable_decay", "trl.lr_scheduler_kwargs.num_decay_steps=30",
         "judgement_items=100"],
    ),
    "T-seed2-wsd-qbatch": (
        "S with batches of whole questions (`training.order=question_batch`): in S a batch of 4 holds parts of two "
        "questions whenever 3- and 1-record questions shift the boundaries",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question_batch",
         "training.seed=2", "trl.lr_scheduler_type=warmup_stable_decay", "trl.lr_scheduler_kwargs.num_decay_steps=30",
         "judgement_items=100"],
    ),
    "S-qs-order": (
        "the quickstart's own training run: the recipe as shipped (S's schedule, seed 0) with the quickstart's "
        "held-out 1% of questions (training.eval_fraction=0.01), which sets a different question order than the "
        "arms' (all questions trained). Its adapter from `bash scripts/quickstart.sh` scored: `score-dir`",
        ["training.eval_fraction=0.01", "training.max_steps=150", "judgement_items=100"],
    ),
    "S-qs-order-300steps": (
        "the quickstart's run (S-qs-order) for 300 steps, what its WARNING advises (`max_steps=300`): does the "
        "order that fails in 150 steps learn with twice the budget?",
        ["training.eval_fraction=0.01", "training.max_steps=300", "training.eval_steps=75", "judgement_items=100"],
    ),
    "U-qs-order-full": (
        "S-qs-order-300steps (the quickstart's recipe and question order, 300 steps) as full fine-tuning "
        "(`method=full`): every weight trains at 1e-4, the reflection rows' steps x100 (1e-2, as the LoRA "
        "recipe's rows: 1e-3 x 10)",
        ["method=full", "training.learning_rate=1e-4", "training.row_lr_multiplier=100",
         "training.eval_fraction=0.01", "training.max_steps=300", "training.eval_steps=75", "judgement_items=100"],
    ),
    "W-qs-order-rank1": (
        "S-qs-order-300steps with a pairwise IsREL ranking term (`training.relevance_rank=1`): each batch's "
        "[Relevant] positions ranked above its [Irrelevant] ones (softplus of the margin difference), i.e. a "
        "question's gold passage above its own hard negative",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=300",
         "training.eval_steps=75", "judgement_items=100"],
    ),
    "W-qs-order-rank1-150steps": (
        "S-qs-order (the quickstart's order, 150 steps: 0.65 / 0.62 without the term) with "
        "`training.relevance_rank=1`: does the ranking term bring the jump inside the 150-step budget?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "judgement_items=100"],
    ),
    "W-seed2-rank1": (
        "S-seed2-wsd (another order and seed, 150 steps: 0.968 / 0.760) with `training.relevance_rank=1`",
        ["tokens.init=words", "training.loss_weights.relevance=5", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "training.seed=2",
         "trl.lr_scheduler_type=warmup_stable_decay", "trl.lr_scheduler_kwargs.num_decay_steps=30",
         "training.relevance_rank=1", "judgement_items=100"],
    ),
    "W-qs-seed1-rank1-150steps": (
        "W-qs-order-rank1-150steps (the quickstart's recipe, its 1% held out, the ranking term, 150 steps) with "
        "`training.seed=1`: another data order and LoRA initialisation. Does a 150-step recipe with the term learn "
        "on orders it was not chosen on?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.seed=1", "judgement_items=100"],
    ),
    "W-qs-seed2-rank1-150steps": (
        "W-qs-order-rank1-150steps (the quickstart's recipe, its 1% held out, the ranking term, 150 steps) with "
        "`training.seed=2`: another data order and LoRA initialisation. Does a 150-step recipe with the term learn "
        "on orders it was not chosen on?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.seed=2", "judgement_items=100"],
    ),
    "W-qs-seed3-rank1-150steps": (
        "W-qs-order-rank1-150steps (the quickstart's recipe, its 1% held out, the ranking term, 150 steps) with "
        "`training.seed=3`: another data order and LoRA initialisation. Does a 150-step recipe with the term learn "
        "on orders it was not chosen on?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.seed=3", "judgement_items=100"],
    ),
    "W-qs-order-rank1-150steps-start5": (
        "W-qs-order-rank1-150steps (whose quickstart wrote 44% well-formed outputs) with the first answer word after a "
        "verdict weighted 5 (`training.loss_weights.answer_start=5`, as K): does it learn the answer's place in 150 "
        "steps?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.loss_weights.answer_start=5", "judgement_items=100"],
    ),
    "W-qs-order-rank3-150steps-start5": (
        "W-qs-order-rank1-150steps-start5 (the quickstart's model) with the ranking term weighted 3 "
        "(`training.relevance_rank=3`): do the closest same-article negatives, ranked below their question's gold "
        "passage three times as hard, separate better within the 150-step budget?",
        ["training.relevance_rank=3", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.loss_weights.answer_start=5", "judgement_items=100"],
    ),
    "W-qs-order-r64-150steps-start5": (
        "W-qs-order-rank1-150steps-start5 (the quickstart's model, LoRA r=16) with LoRA r=64, alpha 128 (the same "
        "scale): is the adapter's capacity what holds the closest same-article negatives back?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.loss_weights.answer_start=5", "lora.r=64", "lora.alpha=128", "judgement_items=100"],
    ),
    "E-qs-erased-150steps-start5": (
        "W-qs-order-rank1-150steps-start5 (the quickstart's model) on records with an erased negative per answerable "
        "question (`selfrag generate ... erased_negatives=1`: the gold passage without its answer's sentences, "
        "[Irrelevant]): does a minimal pair teach the closest same-article negatives within 150 steps?",
        ["records=runs/data-train-erased/records.jsonl", "training.relevance_rank=1", "training.eval_fraction=0.01",
         "training.max_steps=150", "training.loss_weights.answer_start=5", "judgement_items=100"],
    ),
    "G-qs-h2-rank1-150steps-start5": (
        "W-qs-order-rank1-150steps-start5 (the quickstart's model) on records with the article's two closest "
        "passages without the answer per question (`selfrag generate ... hard_negatives=2`): with question order a "
        "batch holds a question's gold passage and both, so the ranking term sets the gold above two close "
        "competitors at once (listwise, where F's two hard negatives without the term only tilted the classes)",
        ["records=runs/data-train-h2/records.jsonl", "training.relevance_rank=1", "training.eval_fraction=0.01",
         "training.max_steps=150", "training.loss_weights.answer_start=5", "judgement_items=100"],
    ),
    "E-qs-seed1-erased-150steps-start5": (
        "E-qs-erased-150steps-start5 with `training.seed=1` (another order; compare W-qs-seed1-rank1-150steps-start5)",
        ["records=runs/data-train-erased/records.jsonl", "training.relevance_rank=1", "training.eval_fraction=0.01",
         "training.max_steps=150", "training.loss_weights.answer_start=5", "training.seed=1", "judgement_items=100"],
    ),
    "X-full-rank1-1000steps": (
        "the full CPU recipe (configs/train/smollm2-135m-cpu-full.yaml: arm L's knobs, random order, cosine) with the "
        "ranking term for 1,000 steps instead of 600 (about the hour the issue allows a full recipe): do the closest "
        "same-article negatives keep rising past X-full-rank1's 0.893?",
        ["training.relevance_rank=1", "training.max_steps=1000", "training.eval_steps=250", "training.save_steps=250",
         "judgement_items=100"],
    ),
    "W-qs-seed1-rank1-150steps-start5": (
        "W-qs-order-rank1-150steps-start5 with `training.seed=1`: does the answer-start weight keep the judgement and "
        "the format on another data order?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.loss_weights.answer_start=5", "training.seed=1", "judgement_items=100"],
    ),
    "W-qs-seed2-rank1-150steps-start5": (
        "W-qs-order-rank1-150steps-start5 with `training.seed=2`: does the answer-start weight keep the judgement and "
        "the format on another data order?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.loss_weights.answer_start=5", "training.seed=2", "judgement_items=100"],
    ),
    "W-qs-seed3-rank1-150steps-start5": (
        "W-qs-order-rank1-150steps-start5 with `training.seed=3`: does the answer-start weight keep the judgement and "
        "the format on another data order?",
        ["training.relevance_rank=1", "training.eval_fraction=0.01", "training.max_steps=150",
         "training.loss_weights.answer_start=5", "training.seed=3", "judgement_items=100"],
    ),
    "V-q215-3epochs": (
        "the issue's lead ('800 clean records x 3 epochs reached 0.99 / 0.98') with today's quickstart recipe: the "
        "records of 215 questions (796; `selfrag generate ... limit=215`), question order, 600 steps = 3 epochs",
        ["records=runs/data-train-q215/records.jsonl", "training.max_steps=600", "training.eval_steps=150",
         "judgement_items=100"],
    ),
    "T-qs-order": (
        "S-qs-order (the quickstart's question order, which three quickstart runs failed on) with batches of whole "
        "questions (`training.order=question_batch`)",
        ["training.eval_fraction=0.01", "training.max_steps=150", "training.order=question_batch",
         "judgement_items=100"],
    ),
    "P-q50-repeat": (
        "N on the records of 50 questions (184; `selfrag generate ... limit=50`), seen ~3.3 times in the same "
        "150 steps: does repeating the same contrasts teach the hard negatives?",
        ["records=runs/data-train-q50/records.jsonl", "tokens.init=words", "training.loss_weights.relevance=5",
         "training.loss_weights.support=5", "training.row_lr_multiplier=10", "training.max_steps=150",
         "training.order=question", "judgement_items=100"],
    ),
    "Q-q100-repeat": (
        "N on the records of 100 questions (371), seen ~1.6 times in 150 steps",
        ["records=runs/data-train-q100/records.jsonl", "tokens.init=words", "training.loss_weights.relevance=5",
         "training.loss_weights.support=5", "training.row_lr_multiplier=10", "training.max_steps=150",
         "training.order=question", "judgement_items=100"],
    ),
    "O-question-rel10": (
        "N with IsREL weight 10 (answer words still at 1)",
        ["tokens.init=words", "training.loss_weights.relevance=10", "training.loss_weights.support=5",
         "training.row_lr_multiplier=10", "training.max_steps=150", "training.order=question", "judgement_items=100"],
    ),
    "H-text0.1-lr2e-3": (
        "D at learning rate 2e-3",
        ["tokens.init=words", "training.loss_weights.relevance=10", "training.loss_weights.support=5",
         "training.loss_weights.text=0.1", "training.row_lr_multiplier=10", "training.max_steps=150",
         "training.learning_rate=2e-3", "judgement_items=100"],
    ),
}
#: arms trained from another recipe than the quickstart's (configs/train/smollm2-135m-cpu.yaml)
RECIPES = {"X-full-rank1-1000steps": "configs/train/smollm2-135m-cpu-full.yaml"}


def run_arm(name: str) -> None:
    _, overrides = ARMS[name]
    out = RUNS / name
    recipe = RECIPES.get(name, "configs/train/smollm2-135m-cpu.yaml")
    command = [sys.executable, "-m", "selfrag.app.cli", "train", "--config", recipe,
               f"output_dir={out}", *COMMON, *overrides]
    LOGS.mkdir(parents=True, exist_ok=True)  # not in the output: train refuses a non-empty new output_dir
    start = time.time()
    with (LOGS / f"{name}.txt").open("w") as log:
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    with (LOGS / f"{name}.txt").open("a") as log:
        log.write(f"wall_s {int(time.time() - start)}\n")


def held_out_examples(model_dir: Path) -> tuple[Any, Any, list[Any]]:
    """A trained folder's model, its ``selfrag.json`` metadata, and the arms' held-out judgement examples
    (``runs/data-test``, whatever the folder trained on) encoded with its tokenizer."""
    import yaml

    from selfrag.config import from_dict
    from selfrag.training.config import TrainConfig
    from selfrag.training.export import load_trained
    from selfrag.training.run import judgement_set

    if not (model_dir / "config.yaml").is_file():
        raise SystemExit(f"{model_dir}: no config.yaml here; expected a folder `selfrag train` wrote (or an arm name)")
    settings = yaml.safe_load((model_dir / "config.yaml").read_text(encoding="utf-8"))
    settings.pop("overwrite", None)
    settings["eval_records"] = HELD_OUT
    config = from_dict(TrainConfig, settings)
    model, tokenizer, meta = load_trained(model_dir)
    return model, meta, judgement_set(config, tokenizer, meta.token_ids, meta.prompt_template)


def score_dir(model_dir: Path, items: int) -> Path:
    """Score any trained model folder (e.g. a quickstart's ``selfrag-quickstart/model``) on the arms' held-out
    judgement set (``runs/data-test``) -> ``<model_dir>/judgement-<items>.json``: the same items and figures as
    the arms, so a quickstart run can be set beside them."""
    from selfrag.training.judgement import headline, judge, write_report

    model, meta, examples = held_out_examples(model_dir)
    report = judge(model, examples, meta.token_ids, items)
    path = write_report(model_dir / f"judgement-{items}.json", report)
    print(f"{model_dir}: {headline(report)} ({items} items per class) -> {path}")
    return path


def score_arm(name: str, items: int) -> Path:
    """Re-score a finished arm's adapter on ``items`` held-out questions per class -> ``judgement-<items>.json``.

    Training logs the judgement on ``judgement_items`` (100 in the arms, to keep each run short); the same
    questions plus more are scored here from the saved adapter, so the final table has >= 300 items per class.
    """
    import yaml

    from selfrag.config import from_dict
    from selfrag.training.config import TrainConfig
    from selfrag.training.export import load_trained
    from selfrag.training.judgement import headline, judge, write_report
    from selfrag.training.run import judgement_set

    out = RUNS / name
    settings = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    settings.pop("overwrite", None)  # arms trained before `restart` replaced it
    config = from_dict(TrainConfig, settings)
    model, tokenizer, meta = load_trained(out)
    examples = judgement_set(config, tokenizer, meta.token_ids, meta.prompt_template)
    start = time.time()
    report = judge(model, examples, meta.token_ids, items)
    path = write_report(out / f"judgement-{items}.json", report)
    print(f"{name}: {headline(report)} ({items} items per class, {time.time() - start:.0f} s) -> {path}")
    return path


def item_scores(model_dir: Path, items: int) -> dict[str, dict[str, object]]:
    """Per-item scores (``score_examples`` rows by record id) of a trained folder on ``items`` held-out questions
    per class, cached in ``<model_dir>/scores-<items>.json`` under the hash of its weights and the held-out
    records: a retrained folder or regenerated test data is scored again, never read from an old cache."""
    import hashlib

    from selfrag.fsutil import write_json
    from selfrag.training.judgement import score_examples, select_items

    if not (model_dir / "config.yaml").is_file():
        raise SystemExit(f"{model_dir}: no config.yaml here; expected a folder `selfrag train` wrote (or an arm name)")
    inputs = [*sorted(model_dir.glob("*.safetensors")), REPO / HELD_OUT]  # the weights and the held-out records
    digest = hashlib.sha256(b"".join(hashlib.sha256(path.read_bytes()).digest() for path in inputs)).hexdigest()[:16]
    cache = model_dir / f"scores-{items}.json"
    if cache.exists():
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved.get("inputs") == digest:
            return dict(saved["rows"])
    model, meta, examples = held_out_examples(model_dir)
    rows = {str(row["id"]): row for row in score_examples(model, select_items(examples, items), meta.token_ids)}
    write_json(cache, {"inputs": digest, "items": items, "rows": rows})
    return rows


#: The held-out articles' records with one random same-article negative per question (kind ``article``):
#: ``selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data-test-article split=test
#: easy_negatives=0 support_negatives=0 article_negatives=1`` (hard_negatives=1 stays, so the draw leaves the hard
#: negative out).
ARTICLE = "runs/data-test-article/records.jsonl"
#: The held-out articles' records with the gold passage less its answer's sentences (kind ``erased``), optional:
#: ``selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data-test-erased split=test
#: easy_negatives=0 hard_negatives=0 support_negatives=0 erased_negatives=1``.
ERASED = "runs/data-test-erased/records.jsonl"


def article_records(items: int, path: str = ARTICLE, kind: str = "article") -> list[Any]:
    """The ``article`` records (a random passage of the question's own article without the answer, drawn by
    data_gen) of the questions whose ``hard`` records ``select_items`` scores: the same questions, two draws."""
    from selfrag.training.dataset import read_records
    from selfrag.training.judgement import select_items

    if not (REPO / ARTICLE).is_file():
        raise SystemExit(
            f"{ARTICLE} not found; make it with: selfrag generate --config configs/data_gen/squad-demo.yaml "
            "output=runs/data-test-article split=test easy_negatives=0 support_negatives=0 article_negatives=1"
        )
    held_out = read_records(REPO / HELD_OUT)
    rows = [{"id": r.id, "kind": str(r.meta.get("kind")), "query_id": str(r.meta.get("query_id"))} for r in held_out]
    questions = {str(row["query_id"]) for row in select_items(rows, items) if row["kind"] == "hard"}
    return [r for r in read_records(REPO / path) if r.meta.get("kind") == kind
            and str(r.meta.get("query_id")) in questions]


def negatives(name: str, items: int) -> dict[str, Any]:
    """Relevance AUROC of one arm (or trained folder) against two kinds of same-article negatives of the same
    questions: ``hard`` (the article's best BM25 match without the answer) and ``article`` (a random passage of the
    article without the answer, :data:`ARTICLE`); and against ``easy`` ones. Gold scores are shared
    (``item_scores``)."""
    import yaml

    from selfrag.config import from_dict
    from selfrag.training.config import TrainConfig
    from selfrag.training.export import load_trained
    from selfrag.training.judgement import auroc, auroc_interval, score_examples
    from selfrag.training.run import judgement_set

    folder = RUNS / name if (RUNS / name).is_dir() else Path(name).resolve()
    scores = item_scores(folder, items)
    settings = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    settings.pop("overwrite", None)
    settings["eval_records"] = HELD_OUT
    model, tokenizer, meta = load_trained(folder)
    examples = judgement_set(from_dict(TrainConfig, settings), tokenizer, meta.token_ids, meta.prompt_template,
                             records=article_records(items))
    random_rows = score_examples(model, examples, meta.token_ids)
    gold = [float(row["s_rel"]) for row in scores.values() if row["kind"] == "gold" and row["s_rel"] is not None]
    kinds = [("hard (BM25-best, data_gen)", [float(row["s_rel"]) for row in scores.values() if row["kind"] == "hard"]),
             ("article (random same-article)", [float(row["s_rel"]) for row in random_rows]),
             ("easy (other article)", [float(row["s_rel"]) for row in scores.values() if row["kind"] == "easy"])]
    if (REPO / ERASED).is_file():  # the gold passage less its answer's sentences, for the same questions
        erased = judgement_set(from_dict(TrainConfig, settings), tokenizer, meta.token_ids, meta.prompt_template,
                               records=article_records(items, ERASED, "erased"))
        kinds.append(("erased (gold less the answer)", [float(row["s_rel"]) for row in
                                                         score_examples(model, erased, meta.token_ids)]))
    result: dict[str, Any] = {}
    for kind, negative in kinds:
        low, high = auroc_interval(gold, negative)
        result[kind] = {"auroc": auroc(gold, negative), "low": low, "high": high, "n_pos": len(gold),
                        "n_neg": len(negative)}
        print(f"{name}: gold vs {kind:30} AUROC {result[kind]['auroc']:.3f} [{low:.3f}, {high:.3f}] "
              f"({len(gold)} vs {len(negative)})")
    return result


def compare(first: str, second: str, items: int) -> dict[str, dict[str, object]]:
    """Two arms (or trained folders) on the same ``items`` questions per class: each AUROC and a paired-bootstrap
    95% interval of ``second - first`` for relevance vs easy and hard negatives and for support."""
    from selfrag.training.judgement import paired_auroc_difference

    def folder(name: str) -> Path:
        return RUNS / name if (RUNS / name).is_dir() else Path(name).resolve()

    a, b = item_scores(folder(first), items), item_scores(folder(second), items)
    result = {
        "relevance easy": paired_auroc_difference(a, b, "gold", "easy"),
        "relevance hard": paired_auroc_difference(a, b, "gold", "hard"),
        "support": paired_auroc_difference(a, b, "gold", "support-negative", score="s_sup"),
    }
    print(f"{second} - {first}, {items} items per class, paired bootstrap (1,000 resamples):")
    for name, r in result.items():
        print(
            f"  {name:15} {r['a']:.3f} -> {r['b']:.3f}  difference {r['difference']:+.3f} "
            f"[{r['low']:+.3f}, {r['high']:+.3f}]  P(not better) {r['p_not_better']:.3f}  "
            f"({r['n_pos']} vs {r['n_neg']})"
        )
    return result


def answers_arm(name: str, questions: int, plain: bool = False) -> Path:
    """Does the arm's model also *answer*? ``selfrag eval`` single-pass on held-out demo questions (the quickstart's
    test questions: answerable, unanswerable and no-retrieval ones interleaved) -> ``<run>/answers/results.json``."""
    from selfrag.app.quickstart import _query_kind, interleave
    from selfrag.config import from_dict
    from selfrag.corpus import load_queries
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.evaluation.config import EvalConfig
    from selfrag.evaluation.data import query_to_row
    from selfrag.evaluation.run import run as evaluate
    from selfrag.jsonl import write_jsonl_atomic

    held_out = interleave([q for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "test"], _query_kind)
    data = RUNS / "answers-questions.jsonl"
    write_jsonl_atomic(data, [query_to_row(query) for query in held_out[12:][:questions]])  # after the dev 12
    out = RUNS / name / "answers"
    result = evaluate(from_dict(EvalConfig, {"data": data, "model": str(RUNS / name), "corpus": DEMO_CORPUS,
                                             "output_dir": out, "batch_size": 4,
                                             "modes": ["single_pass", "plain_rag"] if plain else ["single_pass"],
                                             "plots": False, "show": 0}))
    print(result.table)
    print(f"well-formed single-pass outputs: {well_formed_cell(out.parent)}")
    return out / "results.json"


def well_formed_cell(out: Path) -> str:
    """The share of the arm's single-pass outputs that parse as well-formed trajectories (the quickstart's format
    check, ``min_well_formed``), from its ``answers`` records."""
    from selfrag.app.quickstart import well_formed_share

    shares = well_formed_share(out / "answers" / "records" / "single_pass.jsonl")
    return "n/a" if shares["share"] is None else f"{shares['share']:.0%} of {shares['outputs']}"


def judgement_of(out: Path) -> Path | None:
    """The arm's judgement on the most items: ``judgement-<n>.json`` from ``score`` or training's own."""
    scored = sorted(out.glob("judgement-*.json"), key=lambda path: int(path.stem.split("-")[1]))
    if scored:
        return scored[-1]
    own = out / "judgement.json"
    return own if own.is_file() else None


def answer_cell(out: Path) -> str:
    """``answers`` figures: share of answerable questions whose answer holds a gold answer, false abstains on
    answerable ones, abstains on unanswerable ones (n questions)."""
    path = out / "answers" / "results.json"
    if not path.is_file():
        return "not run"
    single = json.loads(path.read_text())["modes"]["single_pass"]

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0%}"

    return (f"{pct(single.get('match'))} / {pct(single.get('false_abstain_rate'))} / "
            f"{pct(single.get('abstain_rate_unanswerable'))} (n={single.get('examples')}; well-formed "
            f"{well_formed_cell(out)})")


def fmt(entry: dict | None) -> str:
    if not entry or entry.get("auroc") is None:
        return "n/a"
    return f"{entry['auroc']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"


def acc(entry: dict | None) -> str:
    if not entry:
        return "n/a"
    return f"{entry['accuracy_pos']:.0%} / {entry['accuracy_neg']:.0%}"


TABLE = REPO / "benchmarks" / "judgement_study_table.md"


def earlier_rows(present: set[str]) -> tuple[list[str], dict[str, dict[int, str]]]:
    """Rows of arms measured on another machine (their runs/study folders are not here), read back from the last
    written table: a table written on a fresh machine keeps every earlier arm instead of dropping it."""
    if not TABLE.is_file():
        return [], {}
    main: list[str] = []
    curve_cells: dict[str, dict[int, str]] = {}
    steps: list[int] = []
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| arm | step "):
            steps = [int(cell.split()[1]) for cell in cells[1:]]
        elif line.startswith("| ") and cells[0] not in ("arm", *present) and not cells[0].startswith("---"):
            if steps:  # the curves table comes second
                curve_cells[cells[0]] = {step: cell for step, cell in zip(steps, cells[1:], strict=False) if cell}
            else:
                main.append(line)
    return main, curve_cells


def table() -> str:
    present = {out.name for out in RUNS.iterdir() if judgement_of(out)} if RUNS.is_dir() else set()
    kept, kept_curves = earlier_rows(present)
    rows = [
        "| arm | steps | train s (2 cores) | rel. AUROC easy [95% CI] | rel. AUROC hard [95% CI] | sup. AUROC [95% CI] "
        "| rel. acc gold/easy | rel. acc gold/hard | sup. acc right/wrong | n per class "
        "| answers: match / false abstain / abstain unanswerable |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *kept,
    ]
    notes = [f"- **{name}**: {ARMS[name][0]}." for name in ARMS if name not in present and any(
        row.startswith(f"| {name} |") for row in kept)]
    for out in sorted(RUNS.iterdir()) if RUNS.is_dir() else []:
        judgement_path = judgement_of(out)
        if judgement_path is None:
            continue
        report = json.loads(judgement_path.read_text())
        config = (out / "config.yaml").read_text() if (out / "config.yaml").is_file() else ""
        logs = [path for path in (LOGS / f"{out.name}.txt", out / "log.txt") if path.is_file()]
        found = re.search(r"'train_runtime': '([0-9.]+)'", logs[0].read_text()) if logs else None
        runtime = float(found.group(1)) if found else None
        steps = next((line.split()[-1] for line in config.splitlines() if line.strip().startswith("max_steps:")), "?")
        rel, sup = report["relevance"], report["support"]
        n = rel.get("easy", {}).get("n_pos", "?")
        seconds = ("?" if runtime is None else str(round(runtime))) + SHARED.get(out.name, "")
        rows.append(
            f"| {out.name} | {steps} | {seconds} | {fmt(rel.get('easy'))} | {fmt(rel.get('hard'))} | {fmt(sup)} | "
            f"{acc(rel.get('easy'))} | {acc(rel.get('hard'))} | {acc(sup)} | {n} | {answer_cell(out)} |"
        )
        description = ARMS.get(out.name, ("",))[0]
        if description:
            notes.append(f"- **{out.name}**: {description}.")
    return "\n".join(rows + [""] + notes + [""] + curves(kept_curves)) + "\n"


def curves(kept: dict[str, dict[int, str]] | None = None) -> list[str]:
    """Relevance easy / hard and support AUROC at each logged step (a third of the items per class)."""
    found: dict[str, dict[int, str]] = dict(kept or {})
    for out in sorted(RUNS.iterdir()) if RUNS.is_dir() else []:
        metrics_path = out / "metrics.json"
        if not metrics_path.is_file():
            continue
        history = json.loads(metrics_path.read_text()).get("reflection_accuracy_at_checkpoints") or []
        cells = {}
        for entry in history:
            j = entry.get("judgement")
            if j:
                cells[entry["step"]] = f"{j['rel_auroc_easy']:.2f} / {j['rel_auroc_hard']:.2f} / {j['sup_auroc']:.2f}"
        if cells:
            found[out.name] = cells
    steps = sorted({step for cells in found.values() for step in cells})
    rows = ["Curves (AUROC easy / hard / support at each logged step, a third of the items per class):", "",
            "| arm | " + " | ".join(f"step {step}" for step in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for name, cells in found.items():
        rows.append(f"| {name} | " + " | ".join(cells.get(step, "") for step in steps) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="train one arm (see ARMS)")
    one.add_argument("arm", choices=sorted(ARMS))
    rescore = sub.add_parser("score", help="re-score finished arms' adapters on more held-out items per class")
    rescore.add_argument("arms", nargs="+", choices=sorted(ARMS))
    rescore.add_argument("--items", type=int, default=300)
    anyone = sub.add_parser("score-dir", help="score any trained model folder on the arms' held-out items")
    anyone.add_argument("model_dir", type=Path)
    anyone.add_argument("--items", type=int, default=100)
    pair = sub.add_parser("compare", help="two arms (or trained folders) on the same items: paired AUROC differences")
    pair.add_argument("first")
    pair.add_argument("second")
    pair.add_argument("--items", type=int, default=300)
    kinds = sub.add_parser("negatives", help="one arm's relevance AUROC vs BM25-best and random same-article negatives")
    kinds.add_argument("arm", help="an arm name or a trained folder")
    kinds.add_argument("--items", type=int, default=300)
    answer = sub.add_parser("answers", help="single-pass answers of finished arms on held-out questions (selfrag eval)")
    answer.add_argument("arms", nargs="+", choices=sorted(ARMS))
    answer.add_argument("--questions", type=int, default=30)
    answer.add_argument("--with-plain", action="store_true", help="also plain RAG on the base model (a reference)")
    sub.add_parser("table", help="write benchmarks/judgement_study.md from runs/study/*/judgement.json")
    args = parser.parse_args()
    if args.command == "run":
        run_arm(args.arm)
    elif args.command == "answers":
        os.chdir(REPO)
        for arm in args.arms:
            answers_arm(arm, args.questions, args.with_plain)
    elif args.command == "compare":
        os.chdir(REPO)
        compare(args.first, args.second, args.items)
    elif args.command == "negatives":
        os.chdir(REPO)
        negatives(args.arm, args.items)
    elif args.command == "score-dir":
        model_dir = args.model_dir.resolve()
        os.chdir(REPO)
        score_dir(model_dir, args.items)
    elif args.command == "score":
        os.chdir(REPO)  # the arms' config.yaml name their records relative to the repository
        for arm in args.arms:
            score_arm(arm, args.items)
    else:
        text = table()
        TABLE.write_text(text, encoding="utf-8")
        print(text)


if __name__ == "__main__":
    main()
