"""How often the learnability test's recipe learns: its fixture trained once per seed, IsREL accuracy per seed.

    nice python studies/learnability_seeds.py --seeds 0 1 2 --rank 0      # the recipe before relevance_rank
    nice python studies/learnability_seeds.py --seeds 0 1 2 3 4 5 6 7     # the test's recipe (relevance_rank 1)
    ATEN_CPU_CAPABILITY=avx2 nice python studies/learnability_seeds.py --seeds 0 --rank 0   # other CPU kernels

Each run is ``tests/training/test_judgement_training.py``'s ``learned`` fixture (the 2-layer tiny model, 256
synthetic flag/river records, 160 steps) with ``training.seed`` set; ~30-60 s each on 2 cores. Prints, per seed,
the IsREL accuracy and relevance AUROC on the 120 held-out records, and the accuracy on each class. Results:
results/judgement-test.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rank", type=float, default=1.0, help="training.relevance_rank (the test uses 1.0)")
    args = parser.parse_args()

    from selfrag.config import load_config
    from selfrag.jsonl import write_jsonl_atomic
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    fixtures = _module("tests_conftest", ROOT / "tests" / "conftest.py")
    sys.path.insert(0, str(ROOT / "tests" / "training"))  # the test module imports its sibling training_records
    test = _module("judgement_test", ROOT / "tests" / "training" / "test_judgement_training.py")
    import torch

    print(f"torch kernels: {torch.backends.cpu.get_cpu_capability()}, relevance_rank={args.rank}")
    with tempfile.TemporaryDirectory(prefix="learnability-") as tmp:
        folder = Path(tmp)
        tokenizer = fixtures.build_tiny_tokenizer()
        base = folder / "base"
        fixtures.build_tiny_model(len(tokenizer)).save_pretrained(str(base))
        tokenizer.save_pretrained(str(base))
        train, held_out = folder / "train.jsonl", folder / "test.jsonl"
        write_jsonl_atomic(train, [r.to_json() for r in test.synthetic_records(256, seed=1)])
        write_jsonl_atomic(held_out, [r.to_json() for r in test.synthetic_records(120, seed=2)])
        for seed in args.seeds:
            out = folder / f"seed{seed}"
            config = load_config(
                TrainConfig, None, [],
                model=str(base), records=str(train), output_dir=str(out), eval_records=str(held_out),
                judgement_items=60,
                training={"learning_rate": 1e-2, "max_steps": 160, "batch_size": 8, "logging_steps": 20,
                          "eval_fraction": 0.0, "max_length": 256, "save_steps": 1000,
                          "loss_weights": {"relevance": 4.0}, "row_lr_multiplier": 2.0,
                          "relevance_rank": args.rank, "seed": seed},
                lora={"r": 16, "alpha": 32, "dropout": 0.0},
            )
            run(config)
            report = json.loads((out / "judgement.json").read_text())
            easy = report["relevance"]["easy"]
            print(f"seed {seed}: IsREL accuracy {report['accuracy']['relevance']:.3f}, AUROC {easy['auroc']:.3f}, "
                  f"accuracy on [Relevant] {easy['accuracy_pos']:.2f}, on [Irrelevant] {easy['accuracy_neg']:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
