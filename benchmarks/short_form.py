"""Short-form Self-RAG: what batching buys, measured on one trained model in one run.

    .venv/bin/python benchmarks/short_form.py --model selfrag-quickstart/model --questions 16

Three ways to answer the same held-out demo questions with the same engine and the same results:

* ``sequential``  — the baseline: every decode is its own engine call, one request at a time (what a
  loop over questions and passages does, and what prompted Self-RAG's one-call-per-critique does);
* ``per-question`` — ``SelfRAG.answer`` per question: its k passage continuations in one batch;
* ``batched``     — ``SelfRAG.answer_many``: all decisions in one call, all continuations in one call.

Prints wall time and the ratio to the baseline; every mode must give identical answers (greedy decoding).
Then, for an adapter directory, the same batched run with the LoRA kept as PEFT layers (``merge=False``,
the baseline) against ``HFEngine``'s default of folding it into the weights at load.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from selfrag.corpus import load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines.base import Generation, GenerationRequest
from selfrag.inference.engines.hf import HFEngine
from selfrag.inference.retrievers import build_bm25
from selfrag.inference.runtime import SelfRAG


class OneAtATime:
    """Wraps an engine so every request is decoded alone (the baseline)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.tokenizer, self.token_ids = engine.tokenizer, engine.token_ids
        self.prompt_template, self.name = engine.prompt_template, f"one-at-a-time:{engine.name}"
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        results = []
        for request in requests:
            self.calls += 1
            results.extend(self.engine.generate([request]))
        return results


def timed(label: str, answer: Any) -> tuple[str, float, list[str]]:
    started = time.perf_counter()
    answers = answer()
    return label, time.perf_counter() - started, [a.answer for a in answers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model directory trained by selfrag")
    parser.add_argument("--questions", type=int, default=16, help="held-out demo questions to answer")
    parser.add_argument("--top-k", type=int, default=3)
    args = parser.parse_args()

    engine = HFEngine(args.model, batch_size=64)
    retriever = build_bm25(DEMO_CORPUS)
    config = InferenceConfig(top_k=args.top_k)
    questions = [q.question for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "test"][: args.questions]
    SelfRAG(engine, retriever, config).answer(questions[0])  # warm-up

    baseline = OneAtATime(engine)
    runs = [
        timed("sequential", lambda: [SelfRAG(baseline, retriever, config).answer(q) for q in questions]),
        timed("per-question", lambda: [SelfRAG(engine, retriever, config).answer(q) for q in questions]),
        timed("batched", lambda: SelfRAG(engine, retriever, config).answer_many(questions)),
    ]
    reference = runs[0][2]
    print(f"{len(questions)} questions, top_k={args.top_k}, {baseline.calls} decodes in the sequential baseline")
    print(f"{'mode':<14}{'seconds':>9}{'s/question':>12}{'speed-up':>10}  same answers")
    for label, seconds, answers in runs:
        print(
            f"{label:<14}{seconds:>9.1f}{seconds / len(questions):>12.2f}{runs[0][1] / seconds:>9.2f}x"
            f"  {answers == reference}"
        )

    if (Path(args.model) / "adapter_config.json").is_file():
        compare_merge(args.model, questions, retriever, config, runs[2])


def compare_merge(model: str, questions: list[str], retriever: Any, config: InferenceConfig, merged: Any) -> None:
    unmerged_engine = HFEngine(model, batch_size=64, merge=False)
    SelfRAG(unmerged_engine, retriever, config).answer(questions[0])  # warm-up
    label, seconds, answers = timed(
        "unmerged", lambda: SelfRAG(unmerged_engine, retriever, config).answer_many(questions)
    )
    print(f"\nadapter as PEFT layers vs folded into the weights (batched, {len(questions)} questions)")
    print(f"{'unmerged':<14}{seconds:>9.1f}{seconds / len(questions):>12.2f}{1.0:>9.2f}x")
    same = sum(a == b for a, b in zip(answers, merged[2], strict=True))
    print(
        f"{'merged':<14}{merged[1]:>9.1f}{merged[1] / len(questions):>12.2f}{seconds / merged[1]:>9.2f}x"
        f"  {same}/{len(questions)} same answers"
    )


if __name__ == "__main__":
    main()
