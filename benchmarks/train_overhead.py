"""What `selfrag train` costs over a bare TRL ``SFTTrainer`` script: tokens/second and peak memory, in one run.

    nice -n 10 .venv/bin/python benchmarks/train_overhead.py --records runs/demo-data/records.jsonl --steps 20

Both sides train the same LoRA (same rank, targets, reflection-token rows, learning rate, batch size, seed)
on the same pre-tokenized examples of the same base for the same number of steps, each in its own child
process (so each peak RSS is its own), one after the other, ``--repeats`` times in alternation:

* ``bare-trl`` — the baseline: the few lines a TRL user writes (load, add the 15 tokens, ``SFTTrainer`` with
  a ``peft_config``, ``train()``, ``save_model()``); since TRL's fused LM-head loss cannot run through PEFT's
  trainable-token wrapper of a tied head, it computes the loss with the model's own forward, as selfrag does;
* ``selfrag`` — ``selfrag.training.run.run(config)``: everything the command does (run fingerprint, records
  read and encoded, token set-up, trainer, adapter + tokenizer + selfrag.json + metrics written), with
  ``eval_fraction=0`` so both train on every example and no held-out scoring runs.

Prints, per side, wall seconds (process start to finish, model load included), training tokens per second
(non-padding tokens of the batches trained) over the wall time and over the training loop alone (the
Trainer's own ``train_runtime``), and peak RSS, each with its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SIDES = ("bare-trl", "selfrag")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, required=True, help="trajectory records (selfrag generate)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base model (alias, directory, hub id)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per side")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per side; the median is shown")
    args = parser.parse_args()

    settings = {"model": args.model, "records": str(args.records.resolve()), "steps": args.steps,
                "batch_size": args.batch_size, "max_length": args.max_length}
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="train-overhead-") as scratch:
        for repeat in range(args.repeats):
            for side in SIDES:
                out = Path(scratch) / f"{side}-{repeat}"
                result = run_in_child(_child, side, settings, str(out))
                results[side].append(result)
                print(f"{side:9s} run {repeat + 1}: {result['wall_s']:.1f} s ({result['loop_s']:.1f} s in the "
                      f"training loop), {result['tokens']:.0f} tokens, "
                      f"{result['tokens'] / result['wall_s']:.1f} tokens/s, peak RSS {result['peak_mib']:.0f} MiB",
                      flush=True)
    _report(results, args.steps)


def _report(results: dict[str, list[dict[str, float]]], steps: int) -> None:
    summary = {}
    for side in SIDES:
        wall = statistics.median(run["wall_s"] for run in results[side])
        loop = statistics.median(run["loop_s"] for run in results[side])
        tokens = results[side][0]["tokens"]
        peak = max(run["peak_mib"] for run in results[side])
        summary[side] = (wall, tokens / wall, tokens / loop, peak)
    _, base_rate, base_loop_rate, base_peak = summary["bare-trl"]
    print(f"\n{steps} steps each; median over {len(results['bare-trl'])} run(s) per side")
    print(f"{'side':9s} {'wall s':>8s} {'tokens/s':>9s} {'ratio':>6s} {'loop tokens/s':>14s} {'ratio':>6s} "
          f"{'peak MiB':>9s} {'ratio':>6s}")
    for side, (wall, rate, loop_rate, peak) in summary.items():
        print(f"{side:9s} {wall:8.1f} {rate:9.2f} {rate / base_rate:6.3f} {loop_rate:14.2f} "
              f"{loop_rate / base_loop_rate:6.3f} {peak:9.0f} {peak / base_peak:6.3f}")
    same = results["bare-trl"][0]["tokens"] == results["selfrag"][0]["tokens"]
    print(f"same training tokens on both sides: {same}")


def run_in_child(target: Any, side: str, *args: Any) -> dict[str, float]:
    """``target(side, *args, queue)`` in a fresh spawned process (its own peak RSS, no state left by another side);
    the dict it puts on the queue, or exit naming the side where it put an ``error``."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(side, *args, queue))
    process.start()
    result = queue.get()
    process.join()
    if "error" in result:
        raise SystemExit(f"{side} failed: {result['error']}")
    return dict(result)


def timed_training_loops() -> list[float]:
    """Patch ``Trainer.train`` (in this process) to append each run's training-loop seconds, as the Trainer times
    them (``train_runtime``: the loop alone, no model load or saving), to the returned list."""
    from transformers import Trainer

    loop: list[float] = []
    train = Trainer.train

    def timed_train(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        output = train(self, *args, **kwargs)
        loop.append(float(output.metrics["train_runtime"]))
        return output

    Trainer.train = timed_train  # type: ignore[method-assign]
    return loop


def _child(side: str, settings: dict[str, Any], out: str, queue: Any) -> None:
    try:
        loop = timed_training_loops()
        start = time.perf_counter()
        tokens = _bare_trl(settings, out) if side == "bare-trl" else _selfrag(settings, out)
        wall = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        queue.put({"wall_s": wall, "loop_s": loop[0], "tokens": float(tokens), "peak_mib": peak_mib})
    except Exception as error:  # reported by the parent
        queue.put({"error": repr(error)})


def _selfrag(settings: dict[str, Any], out: str) -> int:
    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    config = load_config(
        TrainConfig, model=settings["model"], records=settings["records"], output_dir=out,
        tokens={"strategy": "add"}, lora=LORA,
        training={"max_steps": settings["steps"], "batch_size": settings["batch_size"], "learning_rate": 1e-3,
                  "max_length": settings["max_length"], "eval_fraction": 0.0, "save_steps": 10_000,
                  "logging_steps": 5, "seed": 0},
    )
    run(config)
    return _trained_tokens(settings)


def _bare_trl(settings: dict[str, Any], out: str) -> int:
    """The baseline script, kept to what a TRL user writes."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer
    from trl import SFTConfig, SFTTrainer

    from selfrag.models import resolve_model
    from selfrag.reflection import TOKENS

    path = resolve_model(settings["model"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer.add_special_tokens({"extra_special_tokens": list(TOKENS)}, replace_extra_special_tokens=False)
    model.resize_token_embeddings(len(tokenizer))
    ids = [tokenizer.get_vocab()[token] for token in TOKENS]
    dataset = _dataset(settings, tokenizer)

    class ForwardLossTrainer(SFTTrainer):  # the fused LM-head loss cannot run through the trainable-token wrapper
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
            return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    trainer = ForwardLossTrainer(
        model=model,
        args=SFTConfig(
            output_dir=out, max_steps=settings["steps"], per_device_train_batch_size=settings["batch_size"],
            learning_rate=1e-3, seed=0, logging_steps=5, save_steps=10_000, report_to="none", bf16=False,
            gradient_checkpointing=False, dataset_kwargs={"skip_prepare_dataset": True}, max_length=None,
            train_sampling_strategy="group_by_length", dataloader_pin_memory=False,
        ),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                               target_modules="all-linear", trainable_token_indices={"embed_tokens": ids},
                               task_type="CAUSAL_LM"),
    )
    trainer.train()
    trainer.save_model(out)
    return _trained_tokens(settings)


LORA: dict[str, Any] = {"r": 16, "alpha": 32, "dropout": 0.05}


def _dataset(settings: dict[str, Any], tokenizer: Any) -> Any:
    """The examples selfrag trains on: the same records through the same encoder (so both sides see equal data)."""
    from selfrag.prompting import resolve_template
    from selfrag.reflection import reflection_ids
    from selfrag.training.dataset import encode_records, read_records

    template = resolve_template(tokenizer, "auto")
    records = read_records(settings["records"])
    return encode_records(records, tokenizer, reflection_ids(tokenizer), template, settings["max_length"]).to_dataset()


def _trained_tokens(settings: dict[str, Any]) -> int:
    """Non-padding tokens in ``steps`` batches (both sides cycle through the same examples)."""
    from transformers import AutoTokenizer

    from selfrag.models import resolve_model
    from selfrag.reflection import TOKENS

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(settings["model"]))
    tokenizer.add_special_tokens({"extra_special_tokens": list(TOKENS)}, replace_extra_special_tokens=False)
    lengths = [len(ids) for ids in _dataset(settings, tokenizer)["input_ids"]]
    seen = settings["steps"] * settings["batch_size"]
    mean = sum(lengths) / len(lengths)
    return round(mean * seen)  # the order differs by sampler, the mean per example does not


if __name__ == "__main__":
    main()
