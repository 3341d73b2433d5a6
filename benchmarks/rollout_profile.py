"""Where ``selfrag rl``'s rollout decode spends its time on a GPU: the runtime's rollouts (``Rollouts.run``) of a
random-init shape, as the GRPO step decodes them, timed in variants on the same model and questions.

    python benchmarks/rollout_profile.py --shape 8b                 # on a GPU (carry .whl; see results/gpu.md)
    python benchmarks/rollout_profile.py --shape 1b --device cpu --scale num_hidden_layers=2 hidden_size=128 \\
        intermediate_size=256 num_attention_heads=4 num_key_value_heads=2 head_dim=32 --rollouts 4 --tokens 8

Variants (each times one ``Rollouts.run`` of ``--rollouts`` questions after a warm-up):
- base: the plain model (no PEFT), the engine's batch_size (16);
- lora: the model wrapped in the recipe's LoRA (all-linear, r 16, strategy reserved also adapts embed_tokens and
  lm_head), batch_size 16: what GRPO decodes with;
- lora-gc: the same with gradient checkpointing enabled as the Trainer enables it (input grads on);
- lora-batch: the LoRA model, every rollout in one batch;
- lora-merged: the LoRA folded into the weights (PEFT's merge_adapter) for the decode, unmerged after;
- forward: one decode-step forward of a batch of 16 (ms), base vs LoRA, and the profiler's top operators of the
  LoRA model's decode (CPU time: launch overhead shows there).
``--model DIR`` instead: a trained adapter's rollouts on the CPU (the CPU recipe's settings), the LoRA policy
against the same policy merged, alternating. Writes ``rollout_profile.json`` to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["8b", "1b"], default="8b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--scale", nargs="*", default=[])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="segment_tokens (random weights use all of them)")
    parser.add_argument("--output", type=Path, default=Path("/tmp/rollout_profile"))
    parser.add_argument("--short", action="store_true", help="base, lora and lora-merged only; no profiler")
    parser.add_argument("--model", default=None,
                        help="a trained adapter (e.g. the quickstart's model) instead of a random-init shape: its "
                             "rollouts with configs/rl/smollm2-135m-cpu.yaml's settings, LoRA vs merged, alternating")
    parser.add_argument("--repeats", type=int, default=2, help="--model: alternating timings of each variant")
    args = parser.parse_args(argv)

    import torch
    from gpu_random_init import parse_scale, shape_dir
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    from selfrag.corpus import load_queries
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.inference.retrievers import build_bm25
    from selfrag.loading import load_base_model
    from selfrag.rl.config import RolloutConfig
    from selfrag.rl.rollout import Rollouts, policy_engine
    from selfrag.training.tokens import prepare_tokens

    args.output.mkdir(parents=True, exist_ok=True)
    if args.model:
        return trained(args)
    shape = shape_dir(args.shape, parse_scale(args.scale), args.output)
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    tokenizer = AutoTokenizer.from_pretrained(str(shape))
    model = load_base_model(str(shape), dtype, random_init=True, device=args.device)
    token_ids = prepare_tokens(model, tokenizer, "reserved")
    retriever = build_bm25(DEMO_CORPUS)
    questions = [q.question for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "train"][: args.rollouts]
    config = RolloutConfig(mode="adaptive", depth=3, max_segments=4, segment_tokens=args.tokens)
    report: dict[str, Any] = {"shape": args.shape, "device": args.device, "rollouts": len(questions),
                              "segment_tokens": args.tokens}
    if args.device == "cuda":
        report["card"] = torch.cuda.get_device_name(0)

    def timed(name: str, policy: Any, batch_size: int | None = None) -> None:
        engine = policy_engine(policy, tokenizer, token_ids, "auto", seed=0)
        if batch_size:
            engine.batch_size = batch_size
        runner = Rollouts(engine, retriever, config)
        runner.run(questions[:2])  # warm-up
        sync(args.device)
        started = time.perf_counter()
        rollouts = runner.run(questions)
        sync(args.device)
        seconds = time.perf_counter() - started
        sampled = sum(sum(r.env_mask) for r in rollouts)
        report[name] = {"seconds": round(seconds, 2), "batch_size": engine.batch_size, "sampled_tokens": sampled,
                        "tokens_per_second": round(sampled / seconds, 1)}
        print(name, report[name], flush=True)

    def forward_ms(policy: Any, batch: int = 16, context: int = 256) -> float:
        ids = torch.randint(0, 1000, (batch, context), device=args.device)
        with torch.inference_mode():
            out = policy(input_ids=ids, use_cache=True)
            cache = out.past_key_values
            step = ids[:, -1:]
            for _ in range(3):
                policy(input_ids=step, past_key_values=cache, use_cache=True)
            sync(args.device)
            started = time.perf_counter()
            for _ in range(10):
                policy(input_ids=step, past_key_values=cache, use_cache=True)
            sync(args.device)
        return round((time.perf_counter() - started) / 10 * 1000, 2)

    report["forward_ms_base"] = forward_ms(model)
    timed("base", model)
    lora = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))
    report["forward_ms_lora"] = forward_ms(lora)
    print("forward ms", report["forward_ms_base"], report["forward_ms_lora"], flush=True)
    timed("lora", lora)
    if not args.short:
        timed("lora-batch", lora, batch_size=len(questions))
    lora.merge_adapter()  # the LoRA folded into the weights for the decode, as TRL does before syncing vLLM
    report["forward_ms_merged"] = forward_ms(lora)
    timed("lora-merged", lora)
    lora.unmerge_adapter()
    if args.short:
        (args.output / "rollout_profile.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        return 0
    lora.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora.enable_input_require_grads()
    timed("lora-gc", lora)

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    engine = policy_engine(lora, tokenizer, token_ids, "auto", seed=0)
    with profile(activities=activities) as prof:
        Rollouts(engine, retriever, config).run(questions[:16])
    sort = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=15)
    cpu_table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    (args.output / "profile.txt").write_text(table + "\n\n" + cpu_table + "\n", encoding="utf-8")
    print(table, flush=True)
    print(cpu_table, flush=True)
    (args.output / "rollout_profile.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def trained(args: argparse.Namespace) -> int:
    """``--model``: a trained adapter's rollouts (the CPU recipe's settings), the LoRA policy against the same policy
    merged (``rollout.merge_lora``), alternating so that neither runs only first."""
    import platform

    from selfrag.config import load_config
    from selfrag.corpus import load_queries
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.inference.retrievers import build_bm25
    from selfrag.rl.config import RLConfig
    from selfrag.rl.merge import MergedLora
    from selfrag.rl.policy import load_policy
    from selfrag.rl.rollout import Rollouts, policy_engine

    recipe = ROOT / "configs" / "rl" / "smollm2-135m-cpu.yaml"
    config = load_config(RLConfig, str(recipe), [f"model={args.model}", f"queries={DEMO_QUERIES}",
                                                 f"output_dir={args.output / 'unused'}", "retriever.index=null",
                                                 f"retriever.corpus={DEMO_CORPUS}"])
    policy = load_policy(config)
    retriever = build_bm25(DEMO_CORPUS)
    questions = [q.question for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "train"][: args.rollouts]
    merged = MergedLora()
    report: dict[str, Any] = {"model": args.model, "device": f"CPU ({platform.machine()})", "rollouts": len(questions),
                              "rollout": vars(config.rollout), "lora": [], "merged": []}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for variant in ("lora", "merged"):
            engine = policy_engine(policy.model, policy.tokenizer, policy.token_ids, policy.meta.prompt_template,
                                  seed=repeat)
            if variant == "merged":
                merged.merge(policy.model)
            started = time.perf_counter()
            rollouts = Rollouts(engine, retriever, config.rollout).run(questions)
            seconds = time.perf_counter() - started
            if variant == "merged":
                merged.unmerge(policy.model)
            sampled = sum(sum(r.env_mask) for r in rollouts)
            row = {"seconds": round(seconds, 2), "sampled_tokens": sampled,
                   "tokens_per_second": round(sampled / seconds, 1)}
            print(repeat, variant, row, flush=True)
            if repeat:
                report[variant].append(row)
    for variant in ("lora", "merged"):
        rows = report[variant]
        report[f"{variant}_tokens_per_second"] = round(sum(r["sampled_tokens"] for r in rows)
                                                       / sum(r["seconds"] for r in rows), 1)
    report["merged_over_lora"] = round(report["merged_tokens_per_second"] / report["lora_tokens_per_second"], 2)
    print(json.dumps({k: report[k] for k in ("lora_tokens_per_second", "merged_tokens_per_second",
                                             "merged_over_lora")}), flush=True)
    (args.output / "rollout_profile.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
