"""bf16 autocast against fp32 for the CPU recipe's training steps: seconds per step and the loss, in one run.

    .venv/bin/python benchmarks/train_precision.py --records runs/qs/data/records.jsonl --steps 30 --repeats 2

Both sides run ``selfrag train`` with the quickstart's recipe (``configs/train/smollm2-135m-cpu.yaml``: LoRA r=16,
the reflection rows, the weighted loss and the ranking term, questions side by side) on the same records for the
same steps and seed, each in its own child process, alternating ``--repeats`` times; only ``training.bf16``
differs (``false``, the baseline, against ``true``). No held-out scoring, no checkpoints.

Prints per side the training loop's seconds per step (the Trainer's own ``train_runtime``), its ratio to fp32, and
the mean training loss over the last half of the steps (autocast must not change what is learned), and whether
this CPU has native bf16 (``training.bf16: auto`` turns autocast on only there: elsewhere PyTorch emulates it and it
is slower than fp32).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SIDES = ("fp32", "bf16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, required=True, help="trajectory records (selfrag generate)")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "train" / "smollm2-135m-cpu.yaml")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per side")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per side; the median is shown")
    args = parser.parse_args()

    from selfrag.training.trainer import native_bf16

    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="train-precision-") as scratch:
        for repeat in range(args.repeats):
            for side in SIDES:
                queue = context.Queue()
                settings = {"config": str(args.config), "records": str(args.records.resolve()),
                            "steps": args.steps, "bf16": side == "bf16"}
                out = str(Path(scratch) / f"{side}-{repeat}")
                process = context.Process(target=_child, args=(settings, out, queue))
                process.start()
                result = queue.get()
                process.join()
                if "error" in result:
                    raise SystemExit(f"{side} failed: {result['error']}")
                results[side].append(result)
                print(f"{side} run {repeat + 1}: {result['loop_s']:.1f} s for {args.steps} steps, "
                      f"late loss {result['late_loss']:.3f}", flush=True)
    base = statistics.median(run["loop_s"] for run in results["fp32"]) / args.steps
    print(f"\n{args.steps} steps per run; median over {args.repeats} run(s) per side; native bf16 on this machine: "
          f"{native_bf16()}")
    print(f"{'side':5s} {'s/step':>7s} {'speed-up':>9s} {'late loss':>10s}")
    for side in SIDES:
        per_step = statistics.median(run["loop_s"] for run in results[side]) / args.steps
        loss = statistics.median(run["late_loss"] for run in results[side])
        print(f"{side:5s} {per_step:7.2f} {base / per_step:8.2f}x {loss:10.3f}")


def _child(settings: dict[str, Any], out: str, queue: Any) -> None:
    try:
        from selfrag.config import load_config
        from selfrag.training.config import TrainConfig
        from selfrag.training.run import run

        config = load_config(TrainConfig, settings["config"], [
            f"records={settings['records']}", f"output_dir={out}", f"training.max_steps={settings['steps']}",
            f"training.bf16={str(settings['bf16']).lower()}", "training.eval_fraction=0",
            "training.save_steps=100000", "training.logging_steps=1", "eval_records=null",
        ])
        from train_overhead import timed_training_loops  # benchmarks/, the script's own folder

        loop = timed_training_loops()
        result = run(config)
        losses = [entry["loss"] for entry in result.losses]
        late = losses[len(losses) // 2:] or losses
        queue.put({"loop_s": loop[0], "late_loss": sum(late) / len(late)})
    except Exception as error:  # reported by the parent
        queue.put({"error": repr(error)})


if __name__ == "__main__":
    main()
