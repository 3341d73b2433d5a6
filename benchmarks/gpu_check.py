"""Validate the GPU path on a fresh machine: train a few dozen steps, export, serve through vLLM, judge.

    bash scripts/gpu_check.sh --random-init         # no hub, no download: the 8B shape, random weights (<= 8 min, H100)
    bash scripts/gpu_check.sh                       # the 8B recipe (Llama-3.1-8B-Instruct, >= 40 GB card, hub access)
    bash scripts/gpu_check.sh --stand-in 1b         # Llama-3.2-1B-Instruct with the same recipe (a smaller card)
    bash scripts/gpu_check.sh --dry-run             # no CUDA needed: configs, versions, the memory estimate, 8B counts

``--random-init`` trains ``configs/models/llama-3.1-8b`` (the architecture; seeded random bf16 weights built on the
GPU) with the real ``selfrag train`` for strategies reserved and add, kills and resumes a run, times the HF engine's
short form at top_k 5, and checks CUDA-vs-CPU log-prob parity of the quickstart model's shape; the stages are
benchmarks/gpu_random_init.py's. It writes ``gpu_check.json`` and ``gpu_check.md`` (the table). ``--device cpu``
runs the same stages on a CPU, with ``--shape 1b --scale num_hidden_layers=2 hidden_size=128 ...`` to shrink it
(tests/training/test_gpu_check_random_init.py).

Stages (GPU): (1) the demo data's gold trajectories (train split, and the test split's held-out questions with
their easy/hard/support negatives); (2) ``selfrag train`` with the recipe for ``--steps`` steps: tokens/s, peak
GPU memory (``torch.cuda.max_memory_allocated``) against the estimate, the loss at the first and last logged
step; (3) relevance and support AUROC on the held-out questions (the judgement report of the training run);
(4) export: strategy ``reserved`` is served as it is (a LoRARequest on the unchanged base), ``add`` is merged by
``selfrag export``; (5) the same requests through the HF engine and vLLM: tokens equal, worst |d logprob|.
One table on stdout and the same as JSON (``--output``).

``--dry-run`` checks what needs no CUDA: every configs/train and configs/accelerate file parses (the training
configs against the real TRL/PEFT classes), the installed versions, the memory estimate of the chosen
recipe and batch with its formula (selfrag.training.memory), and the 8B shape built on the meta device (no memory):
its parameter count (asserted: 8.03B) and the recipe's LoRA trainable count for strategies reserved and add (the
recipe's real LoraConfig applied by PEFT). Without a GPU and without ``--dry-run`` it refuses
in one line. Needs the hub (or HF_HOME holding the base) for the GPU run; the gated Llama bases need a token.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "train" / "llama-3.1-8b-instruct-lora.yaml"
SHAPE_8B = ROOT / "configs" / "models" / "llama-3.1-8b"
STAND_INS = {"8b": "meta-llama/Llama-3.1-8B-Instruct", "3b": "meta-llama/Llama-3.2-3B-Instruct",
             "1b": "meta-llama/Llama-3.2-1B-Instruct"}
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "bitsandbytes")
PROBABILITY_TOLERANCE = 2e-3  # as tests/inference/test_vllm_parity.py (bf16 on a GPU may need more: reported)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="check what needs no CUDA and exit")
    parser.add_argument("--random-init", action="store_true",
                        help="the shape of configs/models with seeded random weights: no hub, no download")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="--random-init: cpu rehearses every stage on a CPU (use --scale to shrink the shape)")
    parser.add_argument("--shape", choices=["8b", "1b"], default="8b", help="--random-init: configs/models shape")
    parser.add_argument("--scale", nargs="*", default=[], metavar="KEY=VALUE",
                        help="--random-init: config.json overrides (num_hidden_layers=2 hidden_size=128 ...)")
    parser.add_argument("--strategies", nargs="+", default=["reserved", "add"], choices=["reserved", "add"])
    parser.add_argument("--stages", nargs="*", default=["resume", "engine", "parity"],
                        choices=["rl", "resume", "engine", "parity", "vllm"],
                        help="--random-init: stages after the trainings (rl: selfrag rl's 8B recipe; vllm: the runtime "
                             "on vLLM with dummy weights, benchmarks/gpu_vllm.py; neither by default)")
    parser.add_argument("--train-variants", nargs="+", default=["recipe"],
                        choices=["recipe", "packed", "packed-no-checkpointing", "packed-plan", "profile", "plan",
                                 "no-dropout", "plan-no-dropout", "lora-cast", "flash-attention"],
                        help="--random-init: training runs per strategy (gpu_random_init.TRAIN_VARIANTS): the recipe "
                             "as it is, padding-free, padding-free without checkpointing, padding-free with "
                             "training.memory_plan, the recipe with training.profile_steps=2 (its operators' table "
                             "in the report), padded with training.memory_plan, lora.dropout=0, both, PEFT's LoRA "
                             "input casts kept (the step before 2026-11-30), SDPA limited to flash / efficient; the "
                             "first one's adapter is what rl and vllm read")
    parser.add_argument("--rl-steps", type=int, default=3, help="--stages rl: GRPO steps")
    parser.add_argument("--rl-override", nargs="*", default=[], metavar="KEY=VALUE",
                        help="--stages rl: overrides of configs/rl/llama-3.1-8b-instruct-grpo.yaml")
    parser.add_argument("--questions", type=int, default=32, help="--random-init: questions the engine answers")
    parser.add_argument("--train-override", nargs="*", default=[], metavar="KEY=VALUE",
                        help="--random-init: extra selfrag train settings (e.g. training.batch_size=2)")
    parser.add_argument("--stand-in", choices=sorted(STAND_INS), default="8b", help="the base (8b: the recipe's)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (40; --random-init: 6)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "gpu_check", help="folder for runs + JSON")
    return parser.parse_args(argv)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def check_configs() -> dict[str, str]:
    """Every training recipe through load_config (TRL/PEFT keys against the real classes); accelerate YAMLs read."""
    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig

    checked: dict[str, str] = {}
    for path in sorted((ROOT / "configs" / "train").glob("*.yaml")):
        load_config(TrainConfig, path, ["records=records.jsonl", "output_dir=out"])
        checked[str(path.relative_to(ROOT))] = "ok"
    for path in sorted((ROOT / "configs" / "accelerate").glob("*.yaml")):
        settings = yaml.safe_load(path.read_text(encoding="utf-8"))
        missing = [key for key in ("distributed_type", "num_processes", "num_machines") if key not in settings]
        checked[str(path.relative_to(ROOT))] = f"missing {missing}" if missing else settings["distributed_type"]
    return checked


def memory(args: argparse.Namespace) -> dict[str, Any]:
    from selfrag.training.memory import SHAPES, Setup, estimate_memory, memory_table

    shape = SHAPES[STAND_INS[args.stand_in]]
    chosen = estimate_memory(shape, Setup(args.batch_size, args.max_length))
    return {"model": STAND_INS[args.stand_in], "chosen": chosen.to_json(),
            "table_8b": memory_table(SHAPES[STAND_INS["8b"]], args.batch_size, args.max_length)}


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    return {"mode": "dry-run", "versions": versions(), "configs": check_configs(), "memory": memory(args),
            "memory_plans": memory_plans(args), "meta_8b": meta_counts()}


def memory_plans(args: argparse.Namespace) -> dict[str, str]:
    """What ``training.memory_plan`` chooses for the 8B recipe (batch x accumulation from the recipe, ``--max-length``
    tokens, strategy reserved) on the cards the project is lent: the line a run prints at start."""
    from selfrag.training.memory import SHAPES, Setup
    from selfrag.training.plan import plan_batch

    training = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))["training"]
    per_step = int(training["batch_size"]) * int(training["gradient_accumulation_steps"])
    setup = Setup(int(training["batch_size"]), args.max_length)
    return {f"{card} GB": plan_batch(SHAPES[STAND_INS["8b"]], setup, card, per_step).line()
            for card in (80.0, 139.8)}


def meta_counts() -> dict[str, Any]:
    """configs/models/llama-3.1-8b built on the meta device (shapes, no memory) by the one loader: its parameter
    count, and per strategy the recipe's LoRA trainable count (its real LoraConfig through PEFT's get_peft_model)."""
    from peft import get_peft_model
    from transformers import AutoTokenizer

    from selfrag.config import load_config
    from selfrag.loading import load_base_model
    from selfrag.models import resolve_model
    from selfrag.training.config import TrainConfig
    from selfrag.training.memory import SHAPES as ESTIMATED
    from selfrag.training.model import lora_config
    from selfrag.training.tokens import prepare_tokens

    shape = resolve_model(str(SHAPE_8B))  # builds the shape's tokenizer the first time
    counts: dict[str, Any] = {"shape": str(SHAPE_8B.relative_to(ROOT))}
    for strategy in ("reserved", "add"):
        config = load_config(TrainConfig, RECIPE, [f"model={shape}", "random_init=true", "records=records.jsonl",
                                                  "output_dir=out", f"tokens.strategy={strategy}"])
        model = load_base_model(shape, config.dtype, random_init=True, device="meta")
        counts["parameters"] = sum(parameter.numel() for parameter in model.parameters())
        token_ids = prepare_tokens(model, AutoTokenizer.from_pretrained(shape), strategy)
        trainable, total = get_peft_model(model, lora_config(config, token_ids, model, strategy)) \
            .get_nb_trainable_parameters()
        counts[strategy] = {"lora_trainable": trainable, "total": total, "reflection_ids": sorted(token_ids.all_ids)}
    counts["billions"] = round(counts["parameters"] / 1e9, 2)
    if counts["billions"] != 8.03 or counts["parameters"] != ESTIMATED["meta-llama/Llama-3.1-8B-Instruct"].parameters:
        raise RuntimeError(f"{SHAPE_8B}: {counts['parameters']} parameters on the meta device, expected 8.03B (the "
                           "count selfrag.training.memory computes from the same shape)")
    return counts


def gpu_run(args: argparse.Namespace) -> dict[str, Any]:
    """The stages of the module docstring, on the GPU."""
    import torch

    report = dry_run(args) | {"mode": "gpu", "device": torch.cuda.get_device_name(0)}
    data = stages().demo_data(args.output / "data")
    trained = train(args, data)
    report["train"] = trained
    served = trained["output_dir"]
    if trained["strategy"] == "add":
        from selfrag.training.export import export

        served = str(export(Path(trained["output_dir"]), args.output / "merged"))
    report["served"] = served
    report["parity"] = parity(Path(served))
    return report


def train(args: argparse.Namespace, data: dict[str, Path]) -> dict[str, Any]:
    import torch

    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    out = args.output / f"train-{args.stand_in}"
    config = load_config(TrainConfig, RECIPE, [
        f"model={STAND_INS[args.stand_in]}", f"records={data['train']}", f"eval_records={data['test']}",
        f"output_dir={out}", f"training.max_steps={args.steps}", f"training.batch_size={args.batch_size}",
        f"training.max_length={args.max_length}", "training.logging_steps=5", "training.save_steps=1000",
        "judgement_items=100", "restart=true",
    ])
    torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    run(config)
    seconds = time.monotonic() - started
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    judgement = json.loads((out / "judgement.json").read_text(encoding="utf-8"))
    tokens = args.steps * args.batch_size * config.training.gradient_accumulation_steps * mean_length(data["train"])
    return {
        "output_dir": str(out), "strategy": json.loads((out / "selfrag.json").read_text())["strategy"],
        "steps": args.steps, "seconds": round(seconds, 1),
        "approx_tokens_per_second": round(tokens / seconds, 1),  # record characters / 4 over the wall time of run()
        "peak_gpu_memory_gb": round(torch.cuda.max_memory_allocated() / 1024**3, 2),
        "loss_first": metrics["train_losses"][0]["loss"], "loss_last": metrics["train_losses"][-1]["loss"],
        "relevance_auroc": aurocs(judgement, "relevance"), "support_auroc": aurocs(judgement, "support"),
    }


def mean_length(records: Path, sample: int = 200) -> float:
    """Mean characters / 4 of the first records' text: a token count good to a few percent for English."""
    lines = records.read_text(encoding="utf-8").splitlines()[:sample]
    return sum(len(line) for line in lines) / max(1, len(lines)) / 4


def aurocs(report: dict[str, Any], group: str) -> dict[str, float]:
    """``{negative kind: AUROC}`` of one judgement group (relevance, support) of the training run's judgement.json."""
    kinds = report.get(group) or {}
    return {kind: round(float(value["auroc"]), 3) for kind, value in kinds.items()
            if isinstance(value, dict) and value.get("auroc") is not None}


def parity(served: Path) -> dict[str, Any]:
    """The same scored requests through the HF engine and vLLM: equal tokens and the worst |d probability|."""
    from selfrag.inference.engines import GenerationRequest
    from selfrag.inference.engines.hf import HFEngine
    from selfrag.inference.engines.vllm import VLLMEngine
    from selfrag.prompting import encode_prompt

    hf = HFEngine(served)
    questions = ["Who ruled Normandy in the 10th century?", "Name the largest planet.", "What is 2 + 2?"]
    requests = [GenerationRequest(tuple(encode_prompt(hf.tokenizer, q)), max_tokens=16,
                                  score_token_ids=hf.token_ids.all_ids) for q in questions]
    expected = hf.generate(requests)
    del hf
    engine = VLLMEngine(served, max_model_len=2048, gpu_memory_utilization=0.6)
    try:
        got = engine.generate(requests)
    finally:
        engine.close()
    worst = max((abs(math.exp(v) - math.exp(theirs.score_logprobs[i].get(t, -math.inf)))
                 for ours, theirs in zip(expected, got, strict=True)
                 for i, scores in enumerate(ours.score_logprobs) for t, v in scores.items()), default=0.0)
    same = sum(ours.token_ids == theirs.token_ids for ours, theirs in zip(expected, got, strict=True))
    return {"same_tokens": f"{same}/{len(requests)}", "worst_probability_difference": worst,
            "within_tolerance": worst <= PROBABILITY_TOLERANCE}


def table(report: dict[str, Any]) -> str:
    lines = [f"gpu_check ({report['mode']})", f"  versions: {json.dumps(report['versions'])}"]
    lines += [f"  {name}: {state}" for name, state in report["configs"].items()]
    if "meta_8b" in report:
        meta = report["meta_8b"]
        lines.append(f"  {meta['shape']} on the meta device: {meta['parameters']:,} parameters ({meta['billions']}B); "
                     f"recipe LoRA trainable: reserved {meta['reserved']['lora_trainable']:,}, "
                     f"add {meta['add']['lora_trainable']:,}")
    chosen = report["memory"]["chosen"]
    lines.append(f"  estimate for {report['memory']['model']}, batch {chosen['setup']['batch_size']} x "
                 f"{chosen['setup']['max_length']} tokens: {chosen['formula']}")
    lines.append("  8B recipe       estimate   24 GB  40 GB  80 GB")
    for row in report["memory"]["table_8b"]:
        marks = "  ".join(f"{'yes' if row[f'fits_{card}gb'] else 'no':>5}" for card in (24, 40, 80))
        lines.append(f"  {row['recipe']:<18} {row['estimate_gb']:>5.1f} GB {marks}")
    for card, line in report.get("memory_plans", {}).items():
        lines.append(f"  8B recipe on a {card} card: {line}")
    for stage in ("train", "parity"):
        if stage in report:
            lines.append(f"  {stage}: " + ", ".join(f"{k} {v}" for k, v in report[stage].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.steps = args.steps or (6 if args.random_init else 40)
    import torch

    on_cpu = args.dry_run or (args.random_init and args.device == "cpu")
    if not on_cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); run it on a GPU machine, "
              "or pass --dry-run (or --random-init --device cpu) to check what needs none", file=sys.stderr)
        return 2
    if args.random_init and not args.dry_run:
        return random_init_main(args)
    report = dry_run(args) if args.dry_run else gpu_run(args)
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / ("gpu_check_dry_run.json" if args.dry_run else "gpu_check.json")
    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print(table(report))
    print(f"written to {path}")
    return 0


def stages() -> Any:
    """benchmarks/gpu_random_init.py, beside this file: its stages and the demo data (however this file was loaded)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import gpu_random_init

    return gpu_random_init


def random_init_main(args: argparse.Namespace) -> int:
    """``--random-init``: gpu_random_init's stages; gpu_check.json and the table gpu_check.md; 1 if a check failed."""
    random_init = stages()
    plan = dry_run(args) if args.device == "cuda" else {"versions": versions()}
    counted = f"; 8B on the meta device: {plan['meta_8b']['parameters']:,} parameters" if "meta_8b" in plan else ""
    random_init.log(f"plan: versions {json.dumps(plan['versions'])}{counted}")
    report = random_init.random_init_run(args, plan)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    table_text = random_init.markdown(report)
    (args.output / "gpu_check.md").write_text(table_text, encoding="utf-8")
    print(table_text)
    print(f"written to {args.output / 'gpu_check.json'} and {args.output / 'gpu_check.md'}")
    problems = random_init.failures(report)
    for problem in problems:
        print(f"gpu_check: FAILED {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
