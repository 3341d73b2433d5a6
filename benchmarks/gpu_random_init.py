"""The stages of ``gpu_check.py --random-init``: the 8B shape trained by ``selfrag train`` with seeded random weights.

    .venv/bin/python benchmarks/gpu_check.py --random-init                     # on a GPU (scripts/gpu_check.sh)
    .venv/bin/python benchmarks/gpu_check.py --random-init --device cpu --shape 1b \\
        --scale num_hidden_layers=2 hidden_size=128 intermediate_size=256 num_attention_heads=4 num_key_value_heads=2 \\
        head_dim=32                                                            # the same stages, scaled, on a CPU

No download: the base is ``configs/models/<shape>`` (config.json; the tokenizer selfrag.shapes builds), and every
training is the real command, ``python -m selfrag.app.cli train --config configs/train/llama-3.1-8b-instruct-lora.yaml
model=<shape> random_init=true ...``, in its own process. Stages:

1. data: the quickstart's gold records of the demo data, then the longest of them that the steps read (``steps x
   batch x accumulation`` records, one epoch): every micro-batch is then close to the longest, which is the length
   the memory estimate takes.
2. train, per strategy (reserved, add): tokens/s after the first step and the peak memory of the steps, from the
   run's metrics.json; the estimate of ``selfrag.training.memory`` for the same shape, batch, longest length and
   labelled share; MFU = model FLOPs/s over the card's dense bf16 peak (LoRA: forward 2N + input gradients 2N per
   token for the linear layers, 6 x layers x length x hidden for causal attention, 4 x vocab x hidden per labelled
   position for the head; the recomputation of gradient checkpointing is not counted, as MFU does not).
3. resume: a 4-step run with checkpoints every 2 steps killed (SIGKILL) once ``checkpoint-2`` is complete, then the
   same command again: it must resume from the last checkpoint written and log every step exactly once (the log
   history before the checkpoint comes back with it).
3b. rl (``--stages rl``): ``selfrag rl`` with configs/rl/llama-3.1-8b-instruct-grpo.yaml on train-reserved's adapter
   (random_init=true, the demo corpus in the loop), ``--rl-steps`` steps: seconds a step and the rollouts' share,
   the rollouts' mean length, the allocator's peak and the card's (nvidia-smi sampled every 250 ms).
4. engine: the short-form runtime (``SelfRAG.answer_many``, mode always, top_k 5, BM25 over the demo corpus) on the
   HF engine holding the random-init shape with strategy reserved's tokens: questions/s.
5. parity: the quickstart model's shape (configs/models/smollm2-135m, seeded random weights: its real weights, a
   98 MB GGUF, exceed what travels to the lent GPU) on the CPU in fp32 against the device in fp32 and bf16: the
   same token ids teacher-forced, max |d log-prob| over the whole vocabulary and the share of equal argmax tokens.
   fp32 must hold 1e-3; bf16 is reported (random weights pass bf16 rounding through 30 layers less damped than
   trained ones do).

The exit status is 1 when the resume or the fp32 parity failed; the memory estimate outside 15% is reported (NO in
the table) for the estimate to be corrected, not failed.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "train" / "llama-3.1-8b-instruct-lora.yaml"
RL_RECIPE = ROOT / "configs" / "rl" / "llama-3.1-8b-instruct-grpo.yaml"
SHAPES = {"8b": "llama-3.1-8b", "1b": "llama-3.2-1b"}
PARITY_SHAPE = ROOT / "configs" / "models" / "smollm2-135m"
#: Dense bf16 peak of the cards (vendor datasheets, SXM parts), for MFU.
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12}
MEMORY_TOLERANCE = 0.15  # the bar: the estimate within 15% of the measured peak, else correct the estimate
#: |d log-prob| allowed between the CPU (fp32) and the device in fp32 (float error); bf16 is reported only
PARITY_TOLERANCE = 1e-3
RESUME_STEPS = 4
#: What the CPU rehearsal overrides in the recipe: fp32 weights and steps (bf16 on a CPU is emulated), no loader
#: workers; gradient checkpointing stays on, as the GPU run has it.
CPU_OVERRIDES = ["dtype=float32", "trl.bf16=false", "trl.dataloader_num_workers=0"]
#: ``--train-variants``: the recipe as it is (padded, gradient checkpointing on) and the throughput settings of issue
#: 53, each one ``selfrag train`` per strategy; the first variant's adapter is train-<strategy> (what rl and vllm read)
TRAIN_VARIANTS: dict[str, list[str]] = {
    "recipe": [],
    "packed": ["training.padding_free=true"],
    "packed-no-checkpointing": ["training.padding_free=true", "trl.gradient_checkpointing=false"],
    "packed-plan": ["training.padding_free=true", "training.memory_plan=true"],
    # the recipe with torch.profiler over 2 steps after the first: profile.txt's top operators in the report
    "profile": ["training.profile_steps=2"],
    # the profile of 2026-11-30 (H200): the card busy ~31% of a step, the host issuing ~100k small kernels (the LoRA
    # wrappers' casts, scaling, dropout) for 8 micro-batches of 4: fewer, larger micro-batches (padded, the plan
    # choosing from the card's memory) and no LoRA dropout (PEFT then skips its kernels) are the levers it points to
    "plan": ["training.memory_plan=true"],
    "no-dropout": ["lora.dropout=0"],
    "plan-no-dropout": ["training.memory_plan=true", "lora.dropout=0"],
    # the recipe skips PEFT's fp32 casts of LoRA inputs under autocast since 2026-11-30: this is the step before
    "lora-cast": ["training.lora_input_cast=always"],
    # torch picked cuDNN attention, 1.4-1.6 ms of host time a call: flash / memory-efficient only
    "flash-attention": ["training.attention_kernels=[flash,efficient]"],
}


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- The shape ------------------------------------------------------------------------------------------


def demo_data(folder: Path) -> dict[str, Path]:
    """The quickstart's data stage: gold trajectories of the shipped demo data, train and test splits."""
    from selfrag.app.quickstart import QuickstartConfig, data_settings
    from selfrag.config import from_dict, load_config
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run as generate

    quickstart = load_config(QuickstartConfig, None, [f"output_dir={folder}"])
    paths = {}
    for split in ("train", "test"):
        settings = data_settings(quickstart, DEMO_CORPUS, DEMO_QUERIES, folder / split, split)
        paths[split] = Path(generate(from_dict(GenerateConfig, settings)).records_path)
    return paths


def shape_dir(shape: str, scale: dict[str, Any], folder: Path) -> Path:
    """``configs/models/<shape>`` (its tokenizer built), or a copy in ``folder`` with ``scale``'s config changes."""
    from selfrag.shapes import SHAPE_FILE, ensure_tokenizer

    source = ensure_tokenizer(ROOT / "configs" / "models" / SHAPES[shape])
    if not scale:
        return source
    target = folder / f"{SHAPES[shape]}-scaled"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "config.json":
            shutil.copy2(path, target / path.name)
    config = json.loads((source / "config.json").read_text(encoding="utf-8")) | scale
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    if not (target / SHAPE_FILE).is_file():
        raise FileNotFoundError(f"{source} has no {SHAPE_FILE}")
    return target


def parse_scale(items: list[str]) -> dict[str, Any]:
    """``key=value`` config.json overrides (values read as JSON: numbers, true/false)."""
    scale = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            scale[key] = json.loads(value)
        except ValueError:
            scale[key] = value
    return scale


# --- 1. data ----------------------------------------------------------------------------------------------


def longest_records(records: Path, shape: Path, count: int, max_length: int, target: Path) -> dict[str, Any]:
    """Write the ``count`` longest records (encoded with the shape's tokenizer and chat template) that fit
    ``max_length`` to ``target``; their length range and labelled share."""
    from transformers import AutoTokenizer

    from selfrag.prompting import resolve_template
    from selfrag.reflection import TOKENS, reflection_ids
    from selfrag.training.dataset import encode_records, read_records

    tokenizer = AutoTokenizer.from_pretrained(str(shape))
    tokenizer.add_special_tokens({"extra_special_tokens": list(TOKENS)}, replace_extra_special_tokens=False)
    rows = read_records(records)
    encoded = encode_records(rows, tokenizer, reflection_ids(tokenizer), resolve_template(tokenizer, "auto"),
                             max_length).examples
    chosen = sorted(encoded, key=lambda example: len(example["input_ids"]), reverse=True)[:count]
    keep = {example["id"] for example in chosen}
    lines = [line for line in records.read_text(encoding="utf-8").splitlines()
             if line.strip() and json.loads(line)["id"] in keep]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    lengths = [len(example["input_ids"]) for example in chosen]
    labelled = sum(sum(label != -100 for label in example["labels"]) for example in chosen)
    return {"records": len(lines), "of": len(encoded), "longest": max(lengths), "shortest": min(lengths),
            "mean_length": round(sum(lengths) / len(lengths), 1), "labelled_share": round(labelled / sum(lengths), 4)}


# --- 2./3. training through the CLI -----------------------------------------------------------------------


def train_command(shape: Path, records: Path, output: Path, strategy: str, steps: int, save_steps: int,
                  device: str, extra: list[str]) -> list[str]:
    overrides = [f"model={shape}", "random_init=true", f"records={records}", f"output_dir={output}",
                 f"tokens.strategy={strategy}", f"training.max_steps={steps}", "training.logging_steps=1",
                 f"training.save_steps={save_steps}", "training.eval_fraction=0", "eval_records=null"]
    if device == "cpu":
        overrides += CPU_OVERRIDES
    return [sys.executable, "-m", "selfrag.app.cli", "train", "--config", str(RECIPE), *overrides, *extra]


def run_training(command: list[str], cwd: Path) -> float:
    """Run one ``selfrag train`` to the end (its output goes to ours); its wall seconds."""
    started = time.monotonic()
    subprocess.run(command, cwd=cwd, check=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    return time.monotonic() - started


def train_stage(shape: Path, records: Path, data: dict[str, Any], folder: Path, strategy: str, steps: int,
                device: str, extra: list[str], variant: str = "recipe", first: bool = True) -> dict[str, Any]:
    output = folder / (f"train-{strategy}" if first else f"train-{strategy}-{variant}")
    shutil.rmtree(output, ignore_errors=True)
    log(f"train {strategy} ({variant}): {steps} steps of selfrag train on {shape.name} (random init)")
    others = card_used_gb() if device != "cpu" else None
    command = train_command(shape, records, output, strategy, steps, 10_000, device, [*TRAIN_VARIANTS[variant], *extra])
    seconds = run_training(command, folder)
    metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    config = json.loads((shape / "config.json").read_text(encoding="utf-8"))
    recipe = resolved_recipe(output)
    throughput, peak = metrics["throughput"], metrics["peak_memory"]
    estimate = memory_estimate(config, recipe, strategy, data, device, metrics.get("memory_plan"))
    # the estimate counts the CUDA context and fragmentation (its 1.5 GB overhead): the pool's peak plus what the
    # device holds outside it; on a CPU the process's peak RSS during the steps
    # (less what the card held before the training process started: other processes, this one included)
    measured = peak.get("device_peak_gb") if peak["device"] == "cuda" else peak["rss_gb"]
    if measured is not None and others:
        measured = round(measured - others, 3)
    flops = flops_per_token(config, data["mean_length"], data["labelled_share"])
    tokens_per_second = throughput.get("tokens_per_second")
    peak_flops = peak_flops_of(peak.get("name", "")) if peak["device"] == "cuda" else None
    mfu = tokens_per_second * flops / peak_flops if tokens_per_second and peak_flops else None
    return {
        "strategy": strategy, "variant": variant, "memory_plan": metrics.get("memory_plan"),
        "padding_free": (recipe.get("training") or {}).get("padding_free"),
        "wall_seconds": round(seconds, 1), "steps": steps, "throughput": throughput,
        "peak_memory": peak, "card_used_before_gb": others, "estimate_gb": round(estimate.total_gb, 2),
        "estimate": estimate.formula(),
        "measured_gb": measured,
        "estimate_ratio": round(estimate.total_gb / measured, 3) if measured else None,
        "estimate_within_tolerance": (abs(estimate.total_gb / measured - 1) <= MEMORY_TOLERANCE) if measured else None,
        "model_flops_per_token": flops, "mfu": round(mfu, 4) if mfu is not None else None,
        "losses": [entry["loss"] for entry in metrics["train_losses"]],
        # training.profile_steps (the "profile" variant): the operators' table, top rows, where a step's time goes
        "profile": (output / "profile.txt").read_text(encoding="utf-8").splitlines()[:30]
        if (output / "profile.txt").is_file() else None,
    }


def card_used_gb() -> float | None:
    """What the card holds now (``nvidia-smi``'s memory.used, GiB), read before a training process starts: a peak
    read in that process counts it too (an H200's first run counted 105 GiB that JAX had preallocated here)."""
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True, timeout=30, check=True).stdout
        return round(float(text.split()[0]) / 1024, 3)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def resolved_recipe(output: Path) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load((output / "config.yaml").read_text(encoding="utf-8")))


def memory_estimate(config: dict[str, Any], recipe: dict[str, Any], strategy: str, data: dict[str, Any],
                    device: str, plan: dict[str, Any] | None = None) -> Any:
    """``selfrag.training.memory``'s estimate for the run as it was set up (its resolved config.yaml, and the
    micro-batch and checkpointing that ``training.memory_plan`` chose, from metrics.json)."""
    from selfrag.training.memory import ModelShape, Setup, estimate_memory

    trl = recipe.get("trl") or {}
    setup = Setup(
        batch_size=int(plan["micro_batch"] if plan else recipe["training"]["batch_size"]),
        max_length=int(data["longest"]),
        rank=int(recipe["lora"]["r"]), quantization="fp32" if recipe["dtype"] == "float32" else "bf16",
        gradient_checkpointing=bool(plan["checkpointing"] if plan else trl.get("gradient_checkpointing", False)),
        lora_on_embeddings=strategy == "reserved", labelled_share=float(data["labelled_share"]),
        device="cpu" if device == "cpu" else "cuda",
    )
    return estimate_memory(ModelShape.from_config(config), setup)


def flops_per_token(config: dict[str, Any], length: float, labelled_share: float) -> float:
    """Model FLOPs of one LoRA training token (see the module docstring; recomputation not counted)."""
    from selfrag.training.memory import ModelShape

    shape = ModelShape.from_config(config)
    linear = shape.layers * sum(a * b for a, b in shape.linear_shapes())
    attention = 6 * shape.layers * length * shape.hidden
    head = 4 * shape.vocab * shape.hidden * labelled_share
    return float(4 * linear + attention + head)


def peak_flops_of(name: str) -> float | None:
    return next((flops for card, flops in PEAK_BF16_FLOPS.items() if card in name), None)


def resume_stage(shape: Path, records: Path, folder: Path, device: str, extra: list[str]) -> dict[str, Any]:
    """Kill a run (SIGKILL) once checkpoint-2 is complete, run the same command again: it must resume there."""
    output = folder / "resume"
    shutil.rmtree(output, ignore_errors=True)
    command = train_command(shape, records, output, "reserved", RESUME_STEPS, 2, device, extra)
    log("resume: a run with checkpoints every 2 steps, killed once checkpoint-2 is written")
    process = subprocess.Popen(command, cwd=folder, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    complete = output / "checkpoints" / "checkpoint-2" / "trainer_state.json"
    while process.poll() is None and not complete.is_file():
        time.sleep(0.05)
    killed = process.poll() is None
    if killed:
        time.sleep(0.5)  # let the Trainer finish writing that checkpoint's last files
        process.send_signal(signal.SIGKILL)
        process.wait()
    present = sorted(path.name for path in (output / "checkpoints").glob("checkpoint-*"))
    finished_before = (output / "metrics.json").is_file()
    log(f"resume: killed={killed}, checkpoints {present}; the same command again")
    seconds = run_training(command, folder)
    metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    steps = [int(entry["step"]) for entry in metrics["train_losses"]]
    resumed = metrics.get("resumed_from") or ""
    last = max(present, key=lambda name: int(name.split("-")[1])) if present else None
    ok = killed and not finished_before and last is not None and resumed.endswith(last) and \
        steps == list(range(1, RESUME_STEPS + 1))
    return {"killed_at": present, "killed": killed, "resumed_from": resumed, "steps_logged": steps,
            "resume_seconds": round(seconds, 1), "ok": bool(ok)}


# --- rl: GRPO on the trained adapter -------------------------------------------------------------------------


def rl_command(start: Path, output: Path, steps: int, device: str, extra: list[str]) -> list[str]:
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES

    overrides = [f"model={start}", f"output_dir={output}", "random_init=true", f"queries={DEMO_QUERIES}",
                 "retriever.index=null", f"retriever.corpus={DEMO_CORPUS}", f"training.max_steps={steps}",
                 "training.logging_steps=1", f"training.save_steps={steps}"]
    if device == "cpu":
        overrides += ["dtype=float32", "trl.bf16=false"]
    return [sys.executable, "-m", "selfrag.app.cli", "rl", "--config", str(RL_RECIPE), *overrides, *extra]


class CardPeak:
    """The most ``nvidia-smi`` says the card holds while a command runs (sampled every 250 ms), GiB."""

    def __init__(self) -> None:
        import threading

        self.peak: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(0.25):
            used = card_used_gb()
            if used is not None:
                self.peak = max(self.peak or 0.0, used)

    def __enter__(self) -> CardPeak:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def rl_stage(folder: Path, steps: int, device: str, extra: list[str]) -> dict[str, Any]:
    """``selfrag rl`` (configs/rl's 8B recipe: its group size, rollout lengths, KL, bf16, gradient checkpointing) on
    train-reserved's adapter over the same random-init base: rollouts decoded by the runtime on the policy with the
    demo corpus in the loop, scored, and GRPO steps; per step its wall seconds, the rollouts' share, the rollouts'
    mean length, and the peak memory (allocator, and the card's as nvidia-smi samples it, less what it held before)."""
    start, output = folder / "train-reserved", folder / "rl"
    shutil.rmtree(output, ignore_errors=True)
    command = rl_command(start, output, steps, device, extra)
    log(f"rl: {steps} GRPO steps of selfrag rl ({RL_RECIPE.name}) on {start.name}'s adapter (random init)")
    before = card_used_gb() if device != "cpu" else None
    if device != "cpu":
        with CardPeak() as card:
            seconds = run_training(command, folder)
        peak = card.peak
    else:
        seconds, peak = run_training(command, folder), None
    history = json.loads((output / "rewards.json").read_text(encoding="utf-8"))["history"]
    recipe = resolved_recipe(output)
    later = history[1:] or history  # the first step also warms the kernels up

    def mean(key: str) -> float | None:
        values = [row[key] for row in later if key in row]
        return round(sum(values) / len(values), 2) if values else None

    return {
        "steps": len(history), "wall_seconds": round(seconds, 1),
        "questions_per_step": recipe["training"]["questions_per_step"],
        "generations": recipe["training"]["generations"], "beta": recipe["training"]["beta"],
        "segment_tokens": recipe["rollout"]["segment_tokens"], "max_segments": recipe["rollout"]["max_segments"],
        "step_seconds": mean("step_seconds"), "rollout_seconds": mean("rollout_seconds"),
        "completion_tokens": mean("completion_tokens"),
        "peak_allocated_gb": max((row.get("peak_allocated_gb", 0.0) for row in history), default=None) or None,
        "card_peak_gb": round(peak - (before or 0.0), 2) if peak is not None else None,
        "card_used_before_gb": before, "rewards": [row["reward"] for row in history],
        "adapter": (output / "adapter_model.safetensors").is_file(),
    }


# --- 4. engine ----------------------------------------------------------------------------------------------


def engine_stage(shape: Path, device: str, questions: int, top_k: int = 5) -> dict[str, Any]:
    """The short-form runtime on the HF engine over the random-init shape (strategy reserved): questions/s."""
    import torch
    from transformers import AutoTokenizer

    from selfrag.corpus import load_queries
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.inference.config import InferenceConfig
    from selfrag.inference.engines.hf import HFEngine
    from selfrag.inference.retrievers import build_bm25
    from selfrag.inference.runtime import SelfRAG
    from selfrag.loading import load_base_model
    from selfrag.training.tokens import prepare_tokens

    where = "cuda" if device != "cpu" else "cpu"
    dtype = "bfloat16" if where == "cuda" else "float32"
    log(f"engine: the HF engine on {where} ({dtype}), short form, top_k={top_k}, {questions} questions")
    tokenizer = AutoTokenizer.from_pretrained(str(shape))
    model = load_base_model(str(shape), dtype, random_init=True, device=where)
    token_ids = prepare_tokens(model, tokenizer, "reserved")
    engine = HFEngine.from_model(model, tokenizer, token_ids, device=where, batch_size=64, name=shape.name)
    config = InferenceConfig(top_k=top_k, mode="always", max_tokens=32, max_rounds=1)
    asked = [q.question for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "test"][: questions + 1]
    runtime = SelfRAG(engine, build_bm25(DEMO_CORPUS), config)
    runtime.answer(asked[0])  # warm-up
    if where == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    answers = runtime.answer_many(asked[1:])
    if where == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    del engine, model, runtime
    if where == "cuda":
        torch.cuda.empty_cache()
    return {"device": where, "dtype": dtype, "questions": len(answers), "top_k": top_k, "max_tokens": 32,
            "mode": "always", "max_rounds": 1, "seconds": round(seconds, 2),
            "questions_per_second": round(len(answers) / seconds, 2)}


# --- 5. parity -----------------------------------------------------------------------------------------------


def parity_stage(device: str, sequences: int = 4, length: int = 128) -> dict[str, Any]:
    """The quickstart model's shape, seeded random weights: CPU fp32 against the device in fp32 and bf16."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    where = "cuda" if device != "cpu" else "cpu"
    log(f"parity: {PARITY_SHAPE.name} shape, CPU fp32 vs {where} fp32 and bf16, {sequences} x {length} tokens")
    config = AutoConfig.from_pretrained(str(PARITY_SHAPE))
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (sequences, length), generator=generator)
    with torch.inference_mode():
        expected = torch.log_softmax(reference(input_ids=ids).logits.float(), dim=-1)
    result: dict[str, Any] = {"device": where, "shape": PARITY_SHAPE.name, "tokens": sequences * length}
    for dtype in ("float32", "bfloat16"):
        model = copy.deepcopy(reference).to(where, getattr(torch, dtype))
        with torch.inference_mode():
            got = torch.log_softmax(model(input_ids=ids.to(where)).logits.float(), dim=-1).cpu()
        worst = float((got - expected).abs().max())
        same = float((got.argmax(-1) == expected.argmax(-1)).float().mean())
        result[dtype] = {"max_abs_logprob_difference": worst, "same_argmax_share": round(same, 4)}
        if dtype == "float32":
            result[dtype] |= {"tolerance": PARITY_TOLERANCE, "within_tolerance": worst <= PARITY_TOLERANCE}
        del model
    return result


# --- The whole check -------------------------------------------------------------------------------------------


def guarded(name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One stage: its result logged as one JSON line the moment it ends (a call cut at its time limit keeps what
    finished), or ``{"error": ...}`` with the traceback logged, so one failing stage does not lose the later ones."""
    try:
        result = run()
    except Exception as error:  # noqa: BLE001 - a one-shot GPU call reports every stage it can
        log(f"{name}: FAILED {type(error).__name__}: {error}\n{traceback.format_exc()}")
        return {"error": f"{type(error).__name__}: {error}"}
    log(f"{name}: result {json.dumps(result, default=str)}")
    return result


def random_init_run(args: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """Every stage, in order, into one report (the JSON beside the markdown table)."""
    import yaml

    folder = args.output.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    scale = parse_scale(args.scale)
    started = time.monotonic()
    report: dict[str, Any] = plan | {"mode": "random-init", "device": device_name(args.device), "shape": args.shape,
                                     "scale": scale, "steps": args.steps}
    shape = shape_dir(args.shape, scale, folder)
    log(f"data: the quickstart's gold records of the demo data (shape {shape})")
    data = demo_data(folder / "data")
    recipe = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    extra = list(args.train_override)
    training = dict(recipe["training"]) | {key.removeprefix("training."): value for key, _, value in
                                           (item.partition("=") for item in extra) if key.startswith("training.")}
    per_step = int(training["batch_size"]) * int(training["gradient_accumulation_steps"])
    subset = folder / "data" / "longest.jsonl"
    report["data"] = longest_records(data["train"], shape, per_step * args.steps, int(training["max_length"]), subset)
    log(f"data: {report['data']}")
    variants = list(getattr(args, "train_variants", None) or ["recipe"])
    report["train"] = []
    for strategy in args.strategies:
        for variant in variants:
            row = guarded(f"train {strategy} ({variant})", functools.partial(
                train_stage, shape, subset, report["data"], folder, strategy, args.steps, args.device, extra, variant,
                variant == variants[0]))
            report["train"].append(row | {"strategy": strategy, "variant": variant} if "error" in row else row)
    # vLLM before rl: serving is the stage never measured on CUDA, and rl's rollouts use vLLM where it imports.
    if "vllm" in args.stages:
        from gpu_vllm import serving_stage

        report["vllm"] = guarded("vllm", lambda: serving_stage(shape, folder / "train-reserved", args.device,
                                                               args.questions, log=log))
    if "rl" in args.stages:
        if "reserved" not in args.strategies:
            raise SystemExit("gpu_check: --stages rl trains on train-reserved's adapter; keep reserved in --strategies")
        report["rl"] = guarded("rl", lambda: rl_stage(folder, args.rl_steps, args.device, list(args.rl_override)))
    if "resume" in args.stages:
        report["resume"] = guarded("resume", lambda: resume_stage(shape, subset, folder, args.device, extra))
    if "engine" in args.stages:
        report["engine"] = guarded("engine", lambda: engine_stage(shape, args.device, args.questions))
    if "parity" in args.stages:
        report["parity"] = guarded("parity", lambda: parity_stage(args.device))
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def device_name(device: str) -> str:
    import platform

    import torch

    if device != "cpu" and torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def markdown(report: dict[str, Any]) -> str:
    """The report as the markdown table the README's GPU section quotes."""
    lines = [f"gpu_check --random-init on {report['device']}, {time.strftime('%Y-%m-%d')}: shape {report['shape']}"
             + (f" scaled {report['scale']}" if report["scale"] else "")
             + f", {report['steps']} steps, {report['data']['records']} longest demo records "
             f"({report['data']['shortest']}-{report['data']['longest']} tokens), {report['seconds']} s in all", "",
             "| strategy | variant | tokens/s | MFU | peak memory (GB) | estimate (GB) | estimate / peak "
             "| within 15% |",
             "|---|---|---|---|---|---|---|---|"]
    for row in report["train"]:
        if "error" in row:
            lines.append(f"| {row['strategy']} | {row['variant']} | FAILED: {row['error']} | | | | | |")
            continue
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
        peak = row["peak_memory"]
        kind = f"device; allocated {peak['allocated_gb']}" if peak["device"] == "cuda" else "RSS"
        if row.get("card_used_before_gb"):
            kind += f"; less {row['card_used_before_gb']} on the card before"
        plan = row.get("memory_plan")
        variant = row.get("variant", "recipe") + (f" (micro-batch {plan['micro_batch']} x {plan['accumulation']}, "
                                                   f"checkpointing {'on' if plan['checkpointing'] else 'off'})"
                                                   if plan else "")
        lines.append(f"| {row['strategy']} | {variant} | {row['throughput'].get('tokens_per_second')} | {mfu} | "
                     f"{row['measured_gb']} ({kind}) | {row['estimate_gb']} | {row['estimate_ratio']} | "
                     f"{'yes' if row['estimate_within_tolerance'] else 'NO'} |")
    failed = [stage for stage in ("rl", "resume", "engine", "vllm", "parity") if "error" in report.get(stage, {})]
    lines += [line for stage in failed for line in ("", f"{stage}: FAILED {report[stage]['error']}")]
    report = {key: value for key, value in report.items() if key not in failed}
    for row in report["train"]:
        if row.get("profile"):
            lines += ["", f"profile of {row['strategy']} ({row['variant']}), training.profile_steps:", "```",
                      *row["profile"], "```"]
    if "resume" in report:
        resume = report["resume"]
        lines += ["", f"resume: killed (SIGKILL) with {resume['killed_at']} written, resumed from "
                      f"{Path(resume['resumed_from']).name}, steps logged {resume['steps_logged']}: "
                      f"{'ok' if resume['ok'] else 'FAILED'}"]
    if "rl" in report:
        rl = report["rl"]
        peaks = [f"allocator peak {rl['peak_allocated_gb']:.1f} GB"] if rl["peak_allocated_gb"] else []
        if rl["card_peak_gb"] is not None:
            peaks.append(f"card peak {rl['card_peak_gb']} GB (nvidia-smi, less what it held before)")
        memory = ", ".join(peaks) or "no device memory read (CPU)"
        lines.append(f"rl: {rl['steps']} GRPO steps ({rl['questions_per_step']} questions x {rl['generations']} "
                     f"rollouts, up to {rl['max_segments']} x {rl['segment_tokens']} tokens, beta {rl['beta']}): "
                     f"{rl['step_seconds']} s a step, {rl['rollout_seconds']} s of it decoding rollouts of "
                     f"{rl['completion_tokens']} tokens on average; {memory}; adapter written: "
                     f"{'yes' if rl['adapter'] else 'NO'}")
    if "engine" in report:
        engine = report["engine"]
        lines.append(f"engine: HF engine ({engine['device']}, {engine['dtype']}), short form, top_k {engine['top_k']}: "
                     f"{engine['questions_per_second']} questions/s ({engine['questions']} questions)")
    if "vllm" in report:
        from gpu_vllm import serving_lines

        lines += serving_lines(report["vllm"])
    if "parity" in report:
        parity = report["parity"]
        for dtype in ("float32", "bfloat16"):
            row = parity[dtype]
            bound = f" (tolerance {row['tolerance']})" if "tolerance" in row else " (reported)"
            lines.append(f"parity {parity['shape']} CPU fp32 vs {parity['device']} {dtype}: max |d log-prob| "
                         f"{row['max_abs_logprob_difference']:.2e}{bound}, same argmax {row['same_argmax_share']:.1%}")
    return "\n".join(lines) + "\n"


def failures(report: dict[str, Any]) -> list[str]:
    """What did not hold (the exit status): a resume that did not resume, fp32 parity out of tolerance."""
    found = [f"train {row['strategy']} ({row['variant']}): {row['error']}" for row in report["train"]
             if "error" in row]
    found += [f"{stage}: {report[stage]['error']}" for stage in ("rl", "resume", "engine", "vllm", "parity")
              if "error" in report.get(stage, {})]
    if found:
        return found
    if "rl" in report and not (report["rl"]["adapter"] and report["rl"]["steps"]):
        found.append(f"rl: {report['rl']}")
    if "resume" in report and not report["resume"]["ok"]:
        found.append(f"resume: {report['resume']}")
    if "parity" in report and not report["parity"]["float32"]["within_tolerance"]:
        found.append(f"parity fp32: {report['parity']['float32']}")
    return found

