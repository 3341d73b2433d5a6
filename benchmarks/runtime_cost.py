"""What single-pass Self-RAG costs against plain RAG on the same engine and questions, measured in one run.

    nice -n 5 .venv/bin/python benchmarks/runtime_cost.py --model selfrag-quickstart/model \
        --questions selfrag-quickstart/splits/test.jsonl --slice data_gen/slices/retrievalqa

Every question is answered alone (batch 1) by every column in turn, so CPU noise falls on all columns alike:

* ``plain RAG``   — the baseline: the trained model's base, one decode over the top-k passages (``selfrag eval``'s
  ``plain_rag``: the same hf engine, decode loop, retriever, top_k and max_tokens);
* ``no kept KV``  — single-pass with the hf engine's kept prompt KV off (``prefix_cache_mb=0``) and no skip rules;
* ``before``      — single-pass as it ran before the skip rules (kept KV on, ``skip.repeated=false``,
  ``skip.relevance_gap=null``, ``skip.unpaid_rounds=false``): the behaviour before issue 45;
* ``after``       — single-pass with the defaults (kept KV and the skip rules);
* ``--column NAME:key=value,...`` adds a single-pass column with those InferenceConfig overrides (an ablation).

Per column: latency p50 and p95 (and their ratio to plain RAG in this run), engine calls, prompt tokens sent and
computed (the hf engine prefills only what follows a kept prompt), generated tokens, answers that hold a gold answer,
unsupported claims (content-word overlap with the cited passages, the quickstart's judge), abstains, and questions
that went to a second round. The second set is ``--slice``'s questions the model never trained on (its
``trained-questions.json``), searched in that slice's corpus. Prints markdown tables and the CPU; ``--json`` writes
every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from selfrag.artifacts import load_trained_questions, question_key
from selfrag.config import apply_overrides, from_dict, to_dict
from selfrag.data_gen import DEMO_CORPUS
from selfrag.evaluation.claims import OverlapJudge
from selfrag.evaluation.counting import CountingEngine, base_model_of
from selfrag.evaluation.data import Example, load_examples
from selfrag.evaluation.metrics import match
from selfrag.evaluation.modes import ExampleRetriever, plain_runner, selfrag_runner
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import build_engine, build_plain_engine
from selfrag.inference.engines.hf import PrefixCache
from selfrag.inference.retrievers import build_bm25
from selfrag.inference.runtime import SelfRAG
from selfrag.sentences import split_sentences
from selfrag.trajectory import Passage

#: the single-pass columns: (prefix_cache_mb, InferenceConfig overrides)
BEFORE = ["skip.repeated=false", "skip.relevance_gap=null", "skip.unpaid_rounds=false"]
COLUMNS: dict[str, tuple[float, list[str]]] = {
    "no kept KV": (0, BEFORE),
    "before": (512, BEFORE),
    "after": (512, []),
}
BASELINE = "plain RAG"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a trained model directory (the quickstart's model/)")
    parser.add_argument("--questions", required=True, help="held-out questions (the quickstart's splits/test.jsonl)")
    parser.add_argument("--corpus", default=str(DEMO_CORPUS), help="the corpus the questions are searched in")
    parser.add_argument("--slice", default=None, help="a shipped slice directory (queries.jsonl + corpus.jsonl)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many questions per set")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96, help="the quickstart's evaluation setting")
    parser.add_argument("--column", action="append", default=[], help="NAME:key=value,... an extra single-pass column")
    parser.add_argument("--only", action="append", default=None, help="run only these columns (and plain RAG)")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args()

    columns = dict(COLUMNS)
    for spec in args.column:
        name, _, overrides = spec.partition(":")
        columns[name] = (512, [item for item in overrides.split(",") if item])
    if args.only:
        columns = {name: value for name, value in columns.items() if name in args.only}
    base = InferenceConfig(top_k=args.top_k, max_tokens=args.max_tokens)
    trained = CountingEngine(build_engine(base, args.model))
    plain = CountingEngine(build_plain_engine(base, base_model_of(args.model)))
    print(f"CPU: {_cpu()}; torch threads: {_threads()}; model {args.model}; base {plain.name}")

    sets = [("quickstart test", load_examples(args.questions, limit=args.limit), Path(args.corpus))]
    if args.slice:
        folder = Path(args.slice)
        sets.append((f"{folder.name} (never trained on)", untrained(folder, args.model, args.limit),
                     folder / "corpus.jsonl"))
    report: dict[str, Any] = {"cpu": _cpu(), "model": args.model, "columns": {k: v[1] for k, v in columns.items()}}
    for title, examples, corpus in sets:
        retriever = ExampleRetriever(examples, build_bm25(corpus))
        runners = {BASELINE: (plain, None, plain_runner(plain, retriever, args.top_k, args.max_tokens,
                                                        base.abstain_text, True))}
        for name, (cache_mb, overrides) in columns.items():
            config = from_dict(InferenceConfig, apply_overrides(to_dict(base), overrides))
            runners[name] = (trained, cache_mb, selfrag_runner(SelfRAG(trained, retriever, config)))
        rows = measure(runners, examples)
        summary = {name: summarize(records) for name, records in rows.items()}
        print(f"\n## {title}: {len(examples)} questions, batch 1, top_k {args.top_k}, max_tokens {args.max_tokens}\n")
        print(table(summary))
        report[title] = {"summary": summary, "records": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")


def untrained(folder: Path, model: str, limit: int | None) -> list[Example]:
    """The slice's questions ``model`` never trained on (all, where it does not say what it trained on)."""
    examples = load_examples(folder / "queries.jsonl")
    trained = load_trained_questions(model) or frozenset()
    kept = [example for example in examples if question_key(example.question) not in trained]
    print(f"{folder.name}: {len(kept)} of {len(examples)} questions were never trained on")
    return kept[:limit] if limit else kept


def measure(runners: dict[str, tuple[CountingEngine, float | None, Callable[..., Any]]],
            examples: Sequence[Example]) -> dict[str, list[dict[str, Any]]]:
    """Each question by every column in turn (one warm-up question first, not counted)."""
    caches = {name: PrefixCache(int(mb * 2**20)) for name, (_, mb, _) in runners.items() if mb is not None}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    for index, example in enumerate([examples[0], *examples]):
        for name, (engine, _, runner) in runners.items():
            if name in caches:
                engine.inner.prefixes = caches[name]  # each column keeps its own KV (or none)
                caches[name].clear()  # nothing kept from an earlier question: each is answered cold
            engine.reset()
            started = time.perf_counter()
            [record] = runner([example])
            seconds = time.perf_counter() - started
            usage = engine.reset()
            if index == 0:
                continue
            record.update(seconds=seconds, engine_calls=usage.calls, prompt_tokens=usage.prompt_tokens,
                          prompt_tokens_computed=usage.prompt_tokens_computed,
                          generated_tokens=usage.generated_tokens, claims=judge(record))
            rows[name].append(record)
        if index:
            print(f"  {index}/{len(examples)}", end="\r", flush=True)
    return rows


def judge(record: dict[str, Any]) -> list[bool]:
    """Each sentence of the answer against the passages it cites (plain RAG: all it read): overlap >= 0.5."""
    if record["abstained"]:
        return []
    overlap = OverlapJudge(0.5)
    passages = [Passage(p["id"], p["title"], p["text"]) for p in record["cited"]]
    return [any(overlap.overlap(sentence, p) >= overlap.threshold for p in passages)
            for sentence in split_sentences(record["answer"]) if len(sentence) >= 2]


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    seconds = sorted(r["seconds"] for r in records)
    claims = [c for r in records for c in r["claims"]]
    answerable = [r for r in records if r["answerable"]]
    n = len(records)
    return {
        "p50": statistics.median(seconds),
        "p95": seconds[min(n - 1, round(0.95 * (n - 1)))],
        "calls": sum(r["engine_calls"] for r in records) / n,
        "prompt": sum(r["prompt_tokens"] for r in records) / n,
        "computed": sum(r["prompt_tokens_computed"] for r in records) / n,
        "generated": sum(r["generated_tokens"] for r in records) / n,
        "gold": sum(not r["abstained"] and match(r["answer"], r["gold_answers"]) for r in answerable),
        "answerable": len(answerable),
        "unsupported": sum(not c for c in claims),
        "claims": len(claims),
        "abstained": sum(r["abstained"] for r in records),
        "rounds_2": sum(r["retrieval_rounds"] > 1 for r in records),
        "skips": sum(step.get("step") == "skip" for r in records for step in r["trace"]),
    }


def table(summary: dict[str, dict[str, Any]]) -> str:
    names = list(summary)
    base = summary[BASELINE]
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]

    def row(title: str, cell: Callable[[dict[str, Any]], str]) -> None:
        lines.append(f"| {title} | " + " | ".join(cell(summary[name]) for name in names) + " |")

    row("latency p50 (s)", lambda s: f"{s['p50']:.2f}")
    row("latency p95 (s)", lambda s: f"{s['p95']:.2f}")
    row("p50 / plain RAG", lambda s: f"{s['p50'] / base['p50']:.2f}x")
    row("p95 / plain RAG", lambda s: f"{s['p95'] / base['p95']:.2f}x")
    row("engine calls / question", lambda s: f"{s['calls']:.2f}")
    row("prompt tokens sent / question", lambda s: f"{s['prompt']:.0f}")
    row("prompt tokens computed / question", lambda s: f"{s['computed']:.0f}")
    row("generated tokens / question", lambda s: f"{s['generated']:.1f}")
    row("answers holding gold (answerable)", lambda s: f"{s['gold']}/{s['answerable']}")
    row("unsupported claims (overlap judge)", lambda s: f"{s['unsupported']}/{s['claims']}")
    row("abstained", lambda s: str(s["abstained"]))
    row("questions with a second round", lambda s: str(s["rounds_2"]))
    row("skip entries in traces", lambda s: str(s["skips"]))
    return "\n".join(lines)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
