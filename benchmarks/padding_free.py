"""Padding-free batches (``training.padding_free``) against padded ones: the pad share of the quickstart's batches
and the training step's tokens/s, both sides in one process on the same batches.

    .venv/bin/python benchmarks/padding_free.py --records runs/qs/data/train/records.jsonl
    .venv/bin/python benchmarks/padding_free.py                      # makes the demo's gold records first (~1 min)
    .venv/bin/python benchmarks/padding_free.py --batches 6 --repeats 2 --config configs/train/smollm2-135m-cpu.yaml

The records are encoded as ``selfrag train`` encodes them (the recipe's model, reflection tokens, template and
max_length) and read in the recipe's order (the quickstart: ``order: question``, batch 4). Printed: the share of the
padded batches' tokens that are pads, over all the records, for ``order`` question and length; then for the first
``--batches`` batches the forward and backward of the recipe's loss (LoRA model, loss weights, answer start,
ranking term, the backward stopping at ``lora.layers`` as in ``selfrag train``; fp32, what ``bf16: auto`` is on a CPU
without native bf16; no optimizer step, which is the same either way), padded then packed, alternating ``--repeats``
times: real tokens/s of each and their ratio, and the worst |d loss| between the two (the same trained tokens).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def demo_records(folder: Path) -> Path:
    """The quickstart's data stage (gold trajectories of the demo data, train split) into ``folder``."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check import demo_data

    return demo_data(folder)["train"]


def batches_in_order(config: Any, examples: list[dict[str, Any]], records: list[Any], order: str) -> list[list[int]]:
    """Index batches of ``batch_size`` as the recipe reads them: question order, or examples sorted by length (what
    ``group_by_length`` approximates within its mega-batches)."""
    from selfrag.training.dataset import order_by_question

    size = config.training.batch_size
    if order == "question":
        ordered = order_by_question(examples, records, config.training.seed)
        position = {id(example): index for index, example in enumerate(examples)}
        indices = [position[id(example)] for example in ordered]
    else:
        indices = sorted(range(len(examples)), key=lambda index: len(examples[index]["input_ids"]))
    return [indices[start:start + size] for start in range(0, len(indices), size)]


def step_seconds(model: Any, batch: dict[str, Any], loss_settings: tuple[Any, Any, Any]) -> tuple[float, float, float]:
    """Wall and CPU seconds of one forward + backward of the recipe's loss, and the loss. The CPU seconds (this
    process's, one thread) are the figure that holds on a machine shared with other work."""
    from selfrag.training.loss import masked_loss

    model.zero_grad(set_to_none=True)
    started, cpu = time.perf_counter(), time.process_time()
    loss, _ = masked_loss(model, batch, *loss_settings)
    loss.backward()
    return time.perf_counter() - started, time.process_time() - cpu, float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=Path, default=None, help="trajectory records (default: the demo's gold)")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "train" / "smollm2-135m-cpu.yaml")
    parser.add_argument("--batches", type=int, default=6, help="batches timed per side and repeat")
    parser.add_argument("--repeats", type=int, default=2, help="alternating passes over the batches per side")
    args = parser.parse_args()

    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.dataset import encode_records, read_records
    from selfrag.training.loss import answer_start, loss_weight_table, relevance_rank
    from selfrag.training.model import prepare_model
    from selfrag.training.packing import PackedCollator, packed_attention, padding_share
    from selfrag.training.trainer import input_side_detached

    print(f"CPU: {cpu_model()}; torch threads {torch.get_num_threads()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="padding-free-") as scratch:
        records_path = args.records or demo_records(Path(scratch) / "data")
        config = load_config(TrainConfig, args.config, [f"records={records_path}", f"output_dir={scratch}/out",
                                                         "training.bf16=false"])
        records = read_records(records_path)
        prepared = prepare_model(config)
    model, tokenizer, meta = prepared.model, prepared.tokenizer, prepared.meta
    encoded = encode_records(records, tokenizer, meta.token_ids, meta.prompt_template, config.training.max_length)
    examples = encoded.examples
    lengths = [len(example["input_ids"]) for example in examples]
    print(f"{len(examples)} records ({encoded.skipped} over max_length {config.training.max_length}), "
          f"{statistics.mean(lengths):.0f} ids on average, batch {config.training.batch_size}")
    for order in ("question", "length"):
        share = padding_share(lengths, batches_in_order(config, examples, records, order))
        print(f"pad share of the padded batches, order {order}: {share:.1%}")

    batches = batches_in_order(config, examples, records, config.training.order)[:args.batches]
    padder = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id or 0)
    sides = {"padded": [padder([examples[i] for i in batch]) for batch in batches],
             "packed": [PackedCollator()([examples[i] for i in batch]) for batch in batches]}
    tokens = sum(lengths[i] for batch in batches for i in batch)
    print(f"timed: the first {len(batches)} batches, pad share {padding_share(lengths, batches):.1%}", flush=True)
    loss_settings = (loss_weight_table(config.training.loss_weights, meta.token_ids, len(tokenizer)),
                     answer_start(config.training.loss_weights, meta.token_ids),
                     relevance_rank(config.training.relevance_rank, meta.token_ids))
    model.train()
    seconds: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    losses: dict[str, list[float]] = {side: [] for side in sides}
    with input_side_detached(model, config.lora.layers is not None):  # as selfrag train: backward stops at lora.layers
        step_seconds(model, sides["padded"][0], loss_settings)  # warm-up, not timed
        for _ in range(args.repeats):
            for side, collated in sides.items():
                with packed_attention(model, side == "packed"):  # as selfrag train: each record attended alone
                    timed = [step_seconds(model, batch, loss_settings) for batch in collated]
                seconds[side].append((sum(row[0] for row in timed), sum(row[1] for row in timed)))
                losses[side] = [row[2] for row in timed]
    rates = {}
    for side, spent in seconds.items():
        wall, cpu = statistics.median(row[0] for row in spent), statistics.median(row[1] for row in spent)
        rates[side] = (tokens / wall, tokens / cpu)
        print(f"{side}: {rates[side][0]:,.0f} real tokens/s wall, {rates[side][1]:,.0f} per CPU second "
              f"({wall:.2f} s wall, {cpu:.2f} s CPU for {len(batches)} batches, {tokens} tokens)")
    worst = max(abs(a - b) for a, b in zip(losses["padded"], losses["packed"], strict=True))
    print(f"packed / padded tokens/s: {rates['packed'][0] / rates['padded'][0]:.2f}x wall, "
          f"{rates['packed'][1] / rates['padded'][1]:.2f}x CPU; worst |d loss| {worst:.2e}")


if __name__ == "__main__":
    main()
