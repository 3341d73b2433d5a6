"""``gpu_check.py --random-init --stages vllm``: the runtime on vLLM over the 8B shape, no weights needed.

    bash scripts/gpu_check.sh --random-init --strategies reserved --stages vllm     # on the lent GPU (vLLM carried in
                                                                                    # parts: gpu_wheels.sh --vllm)
    .venv/bin/python benchmarks/gpu_check.py --random-init --device cpu --shape 1b --scale ... --stages vllm

vLLM loads ``configs/models/<shape>`` with ``load_format=dummy`` (random weights, the real shape and its tokenizer)
and serves train-reserved's adapter (the ``reserved`` strategy: LoRA on the unchanged base) through a
``LoRARequest``. Measured, plain RAG's engine first (the base, no adapter), then single-pass's, one engine at a
time, each over the same demo test questions with BM25 top-k passages:

* decode tokens/s: one ``generate`` of 32 plain prompts, ``max_tokens`` 128 each;
* questions/s and the p50 seconds of a call, at batch 1 (each question alone) and batch 32, for plain RAG
  (``selfrag eval``'s ``plain_rag`` runner) and single-pass Self-RAG (``SelfRAG.answer_many``, the adapter's
  reflection tokens): the issue's bars are >= 20 questions/s at batch 32 and <= 1.2x plain RAG's p50 at batch 1.

Where vLLM is not installed (the CPU rehearsal) the same stage runs on the HF engine over the random-init shape in
memory, so everything but vLLM itself is exercised; the report names the engine.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DECODE_PROMPTS = 32
DECODE_TOKENS = 128
BATCHES = (1, 32)


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def engines(shape: Path, adapter: Path, device: str) -> tuple[str, Callable[[bool], Any]]:
    """``(engine name, build(plain) -> engine)``: vLLM with dummy weights on the GPU, else the HF engine."""
    if device != "cpu" and vllm_available():
        from selfrag.inference.engines.vllm import VLLMEngine

        settings = {"vllm_args": {"load_format": "dummy"}, "gpu_memory_utilization": 0.45, "max_model_len": 4096,
                    "dtype": "bfloat16"}
        return "vllm", lambda plain: VLLMEngine.plain(shape, **settings) if plain else VLLMEngine(adapter, **settings)
    from transformers import AutoTokenizer

    from selfrag.inference.engines.hf import HFEngine
    from selfrag.loading import load_base_model
    from selfrag.training.tokens import prepare_tokens

    where = "cuda" if device != "cpu" else "cpu"

    def build(plain: bool) -> Any:
        tokenizer = AutoTokenizer.from_pretrained(str(shape))
        model = load_base_model(str(shape), "bfloat16" if where == "cuda" else "float32", random_init=True,
                                device=where)
        token_ids = prepare_tokens(model, tokenizer, "reserved")
        return HFEngine.from_model(model, tokenizer, token_ids, device=where, batch_size=64, name=shape.name)

    return "hf", build


def decode_rate(engine: Any) -> dict[str, Any]:
    """Generated tokens/s of one call of ``DECODE_PROMPTS`` prompts (up to ``DECODE_TOKENS`` each)."""
    from selfrag.inference.engines import GenerationRequest
    from selfrag.prompting import encode_prompt

    prompts = [f"Write about the history of place number {index}." for index in range(DECODE_PROMPTS)]
    requests = [GenerationRequest(tuple(encode_prompt(engine.tokenizer, prompt, engine.prompt_template)),
                                  max_tokens=DECODE_TOKENS) for prompt in prompts]
    engine.generate(requests[:2])  # warm-up
    started = time.perf_counter()
    generations = engine.generate(requests)
    seconds = time.perf_counter() - started
    tokens = sum(len(generation.token_ids) for generation in generations)
    return {"prompts": len(requests), "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_second": round(tokens / seconds, 1)}


def timed_batches(run: Callable[[Sequence[Any]], Any], examples: Sequence[Any], batch: int,
                  counted: Any = None) -> dict[str, Any]:
    """Questions/s and the p50 seconds of a call, ``examples`` answered ``batch`` at a time (after one warm-up); with
    ``counted`` (the runner's CountingEngine) also the tokens generated a question and the engine calls a question,
    without which a p50 says little where random weights stop at random."""
    run(examples[:batch])
    if counted is not None:
        counted.reset()
    calls = []
    started = time.perf_counter()
    for start in range(0, len(examples), batch):
        begun = time.perf_counter()
        run(examples[start:start + batch])
        calls.append(time.perf_counter() - begun)
    seconds = time.perf_counter() - started
    row = {"batch": batch, "questions": len(examples), "seconds": round(seconds, 3),
           "questions_per_second": round(len(examples) / seconds, 2), "p50_call_seconds": round(
               statistics.median(calls), 4)}
    if counted is not None:
        usage = counted.reset()
        row["generated_tokens_per_question"] = round(usage.generated_tokens / len(examples), 1)
        row["engine_calls_per_question"] = round(usage.calls / len(examples), 2)
    return row


def serving_stage(shape: Path, adapter: Path, device: str, questions: int, top_k: int = 5,
                  max_tokens: int = 32, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The stage of the module docstring: one row per (mode, batch), the decode rate of each engine (``log``: where
    progress lines go, gpu_random_init's log when it runs the stage)."""
    from selfrag.corpus import load_queries
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.evaluation.counting import CountingEngine
    from selfrag.evaluation.data import Example
    from selfrag.evaluation.modes import plain_runner, selfrag_runner
    from selfrag.inference.config import InferenceConfig
    from selfrag.inference.retrievers import build_bm25
    from selfrag.inference.runtime import SelfRAG

    name, build = engines(shape, adapter, device)
    asked = [query.question for query in load_queries(DEMO_QUERIES) if query.meta.get("split") == "test"]
    examples = [Example(f"q{index}", question, ()) for index, question in enumerate(asked[:questions])]
    retriever = build_bm25(DEMO_CORPUS)
    config = InferenceConfig(top_k=top_k, max_tokens=max_tokens)
    report: dict[str, Any] = {"engine": name, "shape": shape.name, "top_k": top_k, "max_tokens": max_tokens,
                              "adapter": str(adapter) if name == "vllm" else None, "rows": [], "decode": {}}
    for mode in ("plain RAG", "single-pass"):
        log(f"vllm stage: {mode} on the {name} engine ({len(examples)} questions, batches {BATCHES})")
        started = time.monotonic()
        engine = build(mode == "plain RAG")
        report.setdefault("load_seconds", {})[mode] = round(time.monotonic() - started, 1)
        log(f"vllm stage: {mode} engine ready in {report['load_seconds'][mode]} s")
        try:
            report["decode"][mode] = decode_rate(engine)
            log(f"vllm stage: {mode} decode {json.dumps(report['decode'][mode])}")
            counted = CountingEngine(engine)
            run = (plain_runner(counted, retriever, top_k, max_tokens, config.abstain_text, True)
                   if mode == "plain RAG" else selfrag_runner(SelfRAG(counted, retriever, config)))
            for batch in BATCHES:  # each row logged as it is measured: a call cut at its limit keeps it
                report["rows"].append({"mode": mode, **timed_batches(run, examples, batch, counted)})
                log(f"vllm stage: {json.dumps(report['rows'][-1])}")
        finally:
            close = getattr(engine, "close", None)
            if callable(close):
                close()
            del engine
    by = {(row["mode"], row["batch"]): row for row in report["rows"]}
    plain_p50 = by[("plain RAG", 1)]["p50_call_seconds"]
    report["single_pass_p50_over_plain_batch_1"] = round(by[("single-pass", 1)]["p50_call_seconds"] / plain_p50, 3)
    return report


def serving_lines(report: dict[str, Any]) -> list[str]:
    """The stage's rows for gpu_check.md."""
    lines = ["", f"serving on the {report['engine']} engine ({report['shape']}"
                 + (", load_format=dummy, reserved adapter as a LoRARequest" if report["engine"] == "vllm" else
                    ", in-memory random weights: vLLM not installed here")
                 + f"), top_k {report['top_k']}, max_tokens {report['max_tokens']}:", "",
             "| mode | batch | questions/s | p50 s a call | tokens generated a question | engine calls a question "
             "| decode tokens/s (32 x 128) |", "|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        decode = report["decode"][row["mode"]]["tokens_per_second"]
        lines.append(f"| {row['mode']} | {row['batch']} | {row['questions_per_second']} | {row['p50_call_seconds']} "
                     f"| {row.get('generated_tokens_per_question', '')} | {row.get('engine_calls_per_question', '')} "
                     f"| {decode} |")
    lines.append(f"single-pass p50 / plain RAG p50 at batch 1: {report['single_pass_p50_over_plain_batch_1']}x "
                 "(bar: <= 1.2x; single-pass >= 20 questions/s at batch 32)")
    return lines
