"""What makes the CPU recipe's training steps faster: bf16 autocast and LoRA on the top blocks only, against fp32 on
every block, in one run: seconds per step and the loss.

    .venv/bin/python benchmarks/train_speed.py --records runs/qs/data/records.jsonl --steps 20 --repeats 2
    .venv/bin/python benchmarks/train_speed.py --records ... --sides fp32 bf16     # the precision alone
    .venv/bin/python benchmarks/train_speed.py --records ... --sides recipe recipe-dropout05 recipe-top10   # levers
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/train_speed.py --records ... \
        --sides recipe-unshared recipe --set training.bf16=false     # shared prefixes, on an AVX2-only fp32 rehearsal

Every side runs ``selfrag train`` with the quickstart's recipe (``configs/train/smollm2-135m-cpu.yaml``: LoRA r=16,
the reflection rows, the weighted loss and the ranking term, questions side by side) on the same records for the same
steps and seed, each in its own child process, the sides alternating ``--repeats`` times. Only the overrides of
:data:`SIDES` differ (``training.bf16`` and ``lora.layers``; the ``recipe-*`` sides: the recipe as it ships against
one lever each: ``recipe-dropout05``, LoRA dropout 0.05 with the prefix tree forced on (the recipe before this one;
``auto`` turns the tree off with dropout); LoRA on the top 10 blocks; ``trl.torch_compile=true``, whose first step
compiles, so give it enough ``--steps``; or ``recipe-unshared``, the records side by side without the shared-prefix
tree, ``training.share_prefixes=false``. ``recipe-before`` is the recipe before the step shortcuts: also PEFT's merged
reflection rows, torch's dropout masks and LoRA dropout 0.05). The first side given is the baseline.
``--set KEY=VALUE`` adds an override to every side. No held-out scoring, no checkpoints.

Prints per side the training loop's seconds per step (the Trainer's own ``train_runtime``), its speed-up over the
baseline, and the mean training loss over the last half of the steps (what each side learns in as many steps), and
whether this CPU has native bf16 (``training.bf16: auto`` turns autocast on only there: elsewhere PyTorch emulates it
and it is slower than fp32).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: side -> its overrides; the first is the baseline
SIDES: dict[str, list[str]] = {
    "fp32": ["training.bf16=false", "lora.layers=null"],
    "bf16": ["training.bf16=true", "lora.layers=null"],
    "fp32-top15": ["training.bf16=false", "lora.layers=15"],
    "bf16-top15": ["training.bf16=true", "lora.layers=15"],
    # the recipe as it ships (training.bf16=auto, the top half of the blocks, padding-free), and one lever each
    "recipe": [],
    "recipe-dropout05": ["lora.dropout=0.05", "training.share_prefixes=true"],  # the recipe before
    "recipe-top10": ["lora.layers=10"],
    "recipe-compile": ["trl.torch_compile=true"],
    "recipe-unshared": ["training.share_prefixes=false"],
    # the recipe before the step shortcuts and the shared prefixes: PEFT's merged rows, torch's masks,
    # LoRA dropout 0.05
    "recipe-before": ["training.share_prefixes=false", "training.trainable_rows=peft", "training.dropout_masks=torch",
                      "lora.dropout=0.05"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=Path, required=True, help="trajectory records (selfrag generate)")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "train" / "smollm2-135m-cpu.yaml")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per side")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per side; the median is shown")
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), default=list(SIDES),
                        help="which sides (the first given is the baseline of the ratios)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for every side, e.g. training.bf16=false for an fp32 rehearsal")
    args = parser.parse_args()

    from train_overhead import run_in_child  # benchmarks/, the script's own folder

    from selfrag.training.trainer import native_bf16

    results: dict[str, list[dict[str, float]]] = {side: [] for side in args.sides}
    with tempfile.TemporaryDirectory(prefix="train-speed-") as scratch:
        for repeat in range(args.repeats):
            for side in args.sides:
                settings = {"config": str(args.config), "records": str(args.records.resolve()),
                            "steps": args.steps, "overrides": [*args.set, *SIDES[side]]}
                result = run_in_child(_child, side, settings, str(Path(scratch) / f"{side}-{repeat}"))
                results[side].append(result)
                print(f"{side} run {repeat + 1}: {result['loop_s']:.1f} s for {args.steps} steps, "
                      f"late loss {result['late_loss']:.3f}", flush=True)
    baseline = args.sides[0]
    base = statistics.median(run["loop_s"] for run in results[baseline]) / args.steps
    print(f"\n{args.steps} steps per run; median over {args.repeats} run(s) per side; native bf16 on this machine: "
          f"{native_bf16()}; speed-up against {baseline}")
    if args.set:
        print(f"every side with {' '.join(args.set)}")
    print(f"{'side':15s} {'s/step':>7s} {'speed-up':>9s} {'late loss':>10s}")
    for side in args.sides:
        per_step = statistics.median(run["loop_s"] for run in results[side]) / args.steps
        loss = statistics.median(run["late_loss"] for run in results[side])
        print(f"{side:15s} {per_step:7.2f} {base / per_step:8.2f}x {loss:10.3f}")


def _child(side: str, settings: dict[str, Any], out: str, queue: Any) -> None:
    try:
        from train_overhead import timed_training_loops  # benchmarks/, the script's own folder

        from selfrag.config import load_config
        from selfrag.training.config import TrainConfig
        from selfrag.training.run import run

        config = load_config(TrainConfig, settings["config"], [
            f"records={settings['records']}", f"output_dir={out}", f"training.max_steps={settings['steps']}",
            "training.eval_fraction=0", "training.save_steps=100000", "training.logging_steps=1",
            "eval_records=null", *settings["overrides"],
        ])
        loop = timed_training_loops()
        result = run(config)
        losses = [entry["loss"] for entry in result.losses]
        late = losses[len(losses) // 2:] or losses
        queue.put({"loop_s": loop[0], "late_loss": sum(late) / len(late)})
    except Exception as error:  # reported by the parent
        queue.put({"error": f"{side}: {error!r}"})


if __name__ == "__main__":
    main()
