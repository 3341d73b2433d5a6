"""Single-pass Self-RAG vs plain RAG vs prompted-critic Self-RAG: one run, same questions, engine and model.

    nice -n 10 .venv/bin/python benchmarks/runtime_modes.py --model selfrag-quickstart/model --questions 12

Each question is answered alone (``answer``), one after the other, in every mode:

* ``plain-rag``       — the baseline: one generation over the prompt with the same top-k passages inlined;
* ``single-pass``     — ``SelfRAG`` (adaptive, pruning on): the model's own reflection tokens decide;
* ``single-always``   — ``SelfRAG`` with ``mode=always`` (retrieves every time, like plain RAG);
* ``single-no-prune`` — ``single-pass`` with pruning off: every branch decodes in one call (pruning's second call
  resumes each surviving branch from the KV its first call kept; ``--prefix-cache-mb 0`` prefills it again);
* ``prompted-critic`` — ``PromptedSelfRAG``: the same policy with one critic call per decision.

Prints per mode the median and p95 latency per query, engine calls (batches), requests and generated tokens
per query, and the latency ratio against plain RAG measured in this same process.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from selfrag.corpus import load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines.base import Generation, GenerationRequest
from selfrag.inference.engines.hf import HFEngine
from selfrag.inference.prompted import PromptedSelfRAG
from selfrag.inference.retrievers import build_bm25
from selfrag.inference.runtime import SelfRAG
from selfrag.prompting import encode_prompt
from selfrag.retrieval import Retriever

PLAIN_RAG = "Answer the question using the passages.\n\n{passages}\n\nQuestion: {question}"


class Counting:
    """Wraps an engine and counts engine calls, requests and generated tokens."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.tokenizer, self.token_ids = engine.tokenizer, engine.token_ids
        self.prompt_template, self.name = engine.prompt_template, engine.name
        self.calls = self.requests = self.tokens = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        generations = self.engine.generate(requests)
        self.calls += 1
        self.requests += len(requests)
        self.tokens += sum(len(g.token_ids) for g in generations)
        return generations


def plain_rag(engine: Counting, retriever: Retriever, config: InferenceConfig) -> Callable[[str], str]:
    def answer(question: str) -> str:
        hits = retriever.search(question, config.top_k)
        passages = "\n\n".join(f"[{i + 1}] {hit.passage.render()}" for i, hit in enumerate(hits))
        prompt = encode_prompt(
            engine.tokenizer, PLAIN_RAG.format(passages=passages, question=question), engine.prompt_template
        )
        [generation] = engine.generate([GenerationRequest(tuple(prompt), config.max_tokens)])
        return engine.tokenizer.decode(list(generation.token_ids), skip_special_tokens=True)

    return answer


def measure(label: str, engine: Counting, answer: Callable[[str], Any], questions: list[str]) -> dict[str, Any]:
    answer(questions[0])  # warm-up (not counted)
    engine.calls = engine.requests = engine.tokens = 0
    seconds = []
    for question in questions:
        started = time.perf_counter()
        answer(question)
        seconds.append(time.perf_counter() - started)
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    n = len(questions)
    return {
        "mode": label,
        "median": statistics.median(seconds),
        "p95": p95,
        "calls": engine.calls / n,
        "requests": engine.requests / n,
        "tokens": engine.tokens / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model directory trained by selfrag")
    parser.add_argument("--questions", type=int, default=12, help="held-out demo questions to answer")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--prefix-cache-mb", type=float, default=512,
                        help="the transformers engine's kept prompt KV (0: off, every call prefills in full)")
    parser.add_argument("--modes", default="plain-rag,single-pass,single-always,single-no-prune,prompted-critic",
                        help="comma-separated modes to run, plain-rag first (the ratios' baseline)")
    parser.add_argument("--max-rounds", type=int, default=2,
                        help="re-retrieval rounds of the Self-RAG modes (the runtime's default 2; 0: none)")
    args = parser.parse_args()
    if args.max_rounds < 0:
        parser.error(f"--max-rounds must be >= 0, got {args.max_rounds}")

    engine = Counting(HFEngine(args.model, batch_size=64, prefix_cache_mb=args.prefix_cache_mb))
    retriever = build_bm25(DEMO_CORPUS)
    config = InferenceConfig(top_k=args.top_k, max_tokens=args.max_tokens, max_rounds=args.max_rounds)
    always = InferenceConfig(top_k=args.top_k, max_tokens=args.max_tokens, mode="always", max_rounds=args.max_rounds)
    no_prune = InferenceConfig(top_k=args.top_k, max_tokens=args.max_tokens, max_rounds=args.max_rounds)
    no_prune.pruning.enabled = False
    questions = [q.question for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "test"][: args.questions]
    modes = [
        ("plain-rag", plain_rag(engine, retriever, config)),
        ("single-pass", SelfRAG(engine, retriever, config).answer),
        ("single-always", SelfRAG(engine, retriever, always).answer),
        ("single-no-prune", SelfRAG(engine, retriever, no_prune).answer),
        ("prompted-critic", PromptedSelfRAG(engine, retriever, config).answer),
    ]
    wanted = args.modes.split(",")
    unknown = sorted(set(wanted) - {label for label, _ in modes})
    if unknown or wanted[0] != "plain-rag":
        parser.error(f"--modes: unknown {unknown} or plain-rag not first; choose from {[m for m, _ in modes]}")
    modes = [(label, answer) for label, answer in modes if label in wanted]
    print(f"{len(questions)} questions, top_k={args.top_k}, max_tokens={args.max_tokens}, "
          f"max_rounds={args.max_rounds}, engine {engine.name}, prefix cache {args.prefix_cache_mb:g} MB")
    print(
        f"{'mode':<17}{'median s':>9}{'p95 s':>8}{'calls':>7}{'requests':>9}{'tokens':>8}"
        f"{'median/plain':>13}{'p95/plain':>10}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for label, answer in modes:  # each row is printed as soon as its mode is measured
        row = measure(label, engine, answer, questions)
        rows.append(row)
        base = rows[0]
        print(
            f"{row['mode']:<17}{row['median']:>9.2f}{row['p95']:>8.2f}{row['calls']:>7.1f}{row['requests']:>9.1f}"
            f"{row['tokens']:>8.1f}{row['median'] / base['median']:>12.2f}x{row['p95'] / base['p95']:>9.2f}x",
            flush=True,
        )
    by_mode = {row["mode"]: row for row in rows}
    if "single-pass" in by_mode and "prompted-critic" in by_mode:
        single, critic = by_mode["single-pass"], by_mode["prompted-critic"]
        print(
            f"prompted-critic / single-pass: median {critic['median'] / single['median']:.2f}x, "
            f"p95 {critic['p95'] / single['p95']:.2f}x"
        )


if __name__ == "__main__":
    main()
