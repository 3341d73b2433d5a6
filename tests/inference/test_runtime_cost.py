"""benchmarks/runtime_cost.py's wiring on scripted engines: columns per engine, each question answered cold by each
column, prompt ids sent and computed, the shared-prefix count, and ratios over the same engine's plain RAG."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from runtime_scripts import FULL, RELEVANT, UTILITY_5, FixedRetriever, KeyedEngine, Segments, passage_key

from selfrag import reflection as rf
from selfrag.evaluation.data import Example
from selfrag.evaluation.modes import ExampleRetriever
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import Generation, GenerationRequest, Script, ScriptedEngine
from selfrag.inference.engines.hf import PrefixCache
from selfrag.prompting import encode_prompt, encode_text
from selfrag.trajectory import Passage

ROOT = Path(__file__).resolve().parents[2]
PARIS = Passage("p-paris", "Paris", "Paris is the capital of France.")
LYON = Passage("p-lyon", "Lyon", "Lyon is a city in France.")
EXAMPLES = [Example("q1", "What is the capital of France?", ("Paris",)),
            Example("q2", "Which city is the capital of France?", ("Paris",))]


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("runtime_cost", ROOT / "benchmarks" / "runtime_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["runtime_cost"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class FakeLLM:
    """vLLM's prefix cache as the benchmark sees it: prompts seen since the last reset serve their longest prefix."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []
        self.resets = 0

    def reset_prefix_cache(self) -> bool:
        self.seen, self.resets = [], self.resets + 1
        return True

    def cached(self, prompt: tuple[int, ...]) -> int:
        shared = [next((i for i, (a, b) in enumerate(zip(s, prompt, strict=False)) if a != b), min(len(s), len(prompt)))
                  for s in self.seen]
        self.seen.append(prompt)
        return min(max(shared, default=0), len(prompt) - 1)


class PrefixCachingEngine(KeyedEngine):
    """A scripted trained model behind a vLLM-like prefix cache (``llm``) that reports the ids it computed."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.llm = FakeLLM()

    def generate(self, requests):  # type: ignore[no-untyped-def]
        generations = super().generate(requests)
        return [Generation(g.token_ids, g.text, g.score_logprobs, g.finish_reason, g.prompt_tokens, g.seconds,
                           computed_prompt_tokens=g.prompt_tokens - self.llm.cached(tuple(r.prompt_ids)))
                for r, g in zip(requests, generations, strict=True)]


class KeptKVEngine(KeyedEngine):
    """A scripted trained model with the hf engine's ``prefixes`` attribute (what the benchmark swaps per column)."""

    prefixes = PrefixCache(0)


@pytest.fixture
def engines(bench, reflection_tokenizer, token_ids):  # type: ignore[no-untyped-def]
    segments = Segments(reflection_tokenizer, token_ids)
    branch = segments.script((rf.RELEVANT, RELEVANT), "Paris.", (rf.FULLY_SUPPORTED, FULL), ("[Utility:5]", UTILITY_5))
    table = {passage_key(reflection_tokenizer, token_ids, p): branch for p in (PARIS, LYON)}
    retrieve = segments.script((rf.RETRIEVAL, {rf.RETRIEVAL: 0.9, rf.NO_RETRIEVAL: 0.1}))
    answer = Script((*encode_text(reflection_tokenizer, "Paris."), reflection_tokenizer.eos_token_id))

    def plain() -> ScriptedEngine:
        return ScriptedEngine(reflection_tokenizer, None, lambda request: answer)  # type: ignore[arg-type]

    def trained(kind):  # type: ignore[no-untyped-def]
        return kind(reflection_tokenizer, token_ids, table, fallback=lambda request: retrieve)

    return {"hf": (bench.RecordingEngine(trained(KeptKVEngine)), bench.RecordingEngine(plain())),
            "vllm": (bench.RecordingEngine(trained(PrefixCachingEngine)), bench.RecordingEngine(plain()))}


def test_each_engine_gets_its_own_plain_rag_and_every_column_answers_cold(bench, engines, reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    base = InferenceConfig(top_k=2, max_tokens=16)
    retriever = ExampleRetriever(EXAMPLES, FixedRetriever([PARIS, LYON]))
    columns = {name: overrides for name, (overrides, _) in bench.COLUMNS.items()}
    built = [column for name, (trained, plain) in engines.items()
             for column in bench.engine_columns(name, trained, plain, retriever, base, columns)]
    assert [column.label for column in built] == [
        "hf plain RAG", "hf no kept KV", "hf before", "hf after", "vllm plain RAG", "vllm before", "vllm after"]

    kept = {}
    for column in built[1:4]:  # the hf single-pass columns: each a fresh PrefixCache, off for "no kept KV"
        column.cold()
        kept[column.name] = column.engine.inner.prefixes
    assert not kept["no kept KV"].enabled and kept["before"].enabled and kept["after"].enabled
    assert kept["before"] is not kept["after"] and not kept["after"].entries

    rows = bench.measure(built, EXAMPLES)
    llm = engines["vllm"][0].inner.llm
    assert llm.resets == 2 * (len(EXAMPLES) + 1)  # vllm before and after, every question and the warm-up: cold
    for label, records in rows.items():
        assert [r["id"] for r in records] == ["q1", "q2"]  # the warm-up question is not counted
        for record in records:
            if label.endswith("plain RAG"):
                assert record["engine_calls"] == 1 and record["prompts_later"] == 0
                continue
            # the decision, then per passage a verdict step and its continuation, all extending the question
            assert record["engine_calls"] >= 3 and record["prompts_extending"] == record["prompts_later"] == 4
            if label.startswith("vllm"):  # the question's ids are computed once (cold), then served by the cache
                question = len(encode_prompt(reflection_tokenizer, record["question"], "auto"))
                assert record["prompt_tokens_computed"] <= record["prompt_tokens"] - 4 * question
            else:  # the scripted hf stand-in does not say: every id counts as computed
                assert record["prompt_tokens_computed"] == record["prompt_tokens"]
    # the same question answered cold by each column costs each column the same ids
    assert [r["prompt_tokens_computed"] for r in rows["vllm before"]] == \
        [r["prompt_tokens_computed"] for r in rows["vllm after"]]

    summary = {label: bench.summarize(records) for label, records in rows.items()}
    assert summary["vllm after"]["gold"] == 2 and summary["hf plain RAG"]["gold"] == 2
    text = bench.table(summary, {column.label: f"{column.engine_name} {bench.BASELINE}" for column in built})
    assert "| prompts extending the first (shared prefix) | 0/0 | 8/8 | 8/8 | 8/8 | 0/0 | 8/8 | 8/8 |" in text


def test_ratios_are_over_the_same_engines_plain_rag(bench) -> None:  # type: ignore[no-untyped-def]
    def figures(p50: float, p95: float) -> dict:  # type: ignore[type-arg]
        return {"p50": p50, "p95": p95, "calls": 1.0, "prompt": 100, "computed": 50, "generated": 3.0, "extending": 0,
                "later": 0, "gold": 1, "answerable": 2, "unsupported": 0, "claims": 1, "abstained": 0, "rounds_2": 0,
                "skips": 0}

    summary = {"hf plain RAG": figures(1.0, 2.0), "hf after": figures(1.5, 3.0),
               "vllm plain RAG": figures(0.5, 1.0), "vllm after": figures(1.0, 1.2)}
    baselines = {label: label.split()[0] + " plain RAG" for label in summary}
    lines = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in bench.table(summary, baselines).splitlines()}
    assert [cell.strip() for cell in lines["p50 / plain RAG (same engine)"]] == ["1.00x", "1.50x", "1.00x", "2.00x"]
    assert [cell.strip() for cell in lines["p95 / plain RAG (same engine)"]] == ["1.00x", "1.50x", "1.00x", "1.20x"]


def test_extending_first_counts_prompts_that_start_with_the_first_id_for_id(bench) -> None:  # type: ignore[no-untyped-def]
    assert bench.extending_first([]) == (0, 0)
    assert bench.extending_first([(1, 2, 3)]) == (0, 0)
    # a branch re-encoded with one id changed at the seam shares nothing a prefix cache can use
    assert bench.extending_first([(1, 2, 3), (1, 2, 3, 7), (1, 2, 4, 7), (1, 2)]) == (1, 3)


def test_pooled_slices_search_each_question_in_its_own_corpus(bench) -> None:  # type: ignore[no-untyped-def]
    paris, lyon = FixedRetriever([PARIS]), FixedRetriever([LYON])
    retriever = bench.SliceRetriever({"Where is Paris?": paris, "Where is Lyon?": lyon})
    hits = retriever.search_many(["Where is Lyon?", "Where is Paris? It is in France."], 1)
    assert [h[0].passage.id for h in hits] == ["p-lyon", "p-paris"]  # a rewritten query keeps its question's corpus
    with pytest.raises(ValueError, match="none of the slices' questions"):
        retriever.search("Where is Nice?", 1)


def test_recording_engine_keeps_the_prompts_since_its_reset(bench, reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    scripted = ScriptedEngine(reflection_tokenizer, None, lambda request: Script((5,)))  # type: ignore[arg-type]
    recording = bench.RecordingEngine(scripted)
    recording.generate([GenerationRequest((1, 2), 1), GenerationRequest((1, 2, 3), 1)])
    assert recording.prompts == [(1, 2), (1, 2, 3)] and recording.usage.calls == 1
    assert recording.reset().prompt_tokens == 5 and recording.prompts == []
