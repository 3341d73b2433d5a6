"""generate over a prebuilt index: no corpus and no BM25 built per shard, the same records as the in-memory way."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from teacher_inputs import write_inputs
from teacher_server import TeacherServer

from selfrag.config import load_config
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.outputs import OUTPUT_FILES
from selfrag.data_gen.run import run
from selfrag.errors import ConfigError
from selfrag.inference.retrievers.batched import BatchedSearcher
from selfrag.inference.retrievers.index import IndexConfig
from selfrag.inference.retrievers.index_build import run as build_index
from selfrag.retrieval import BM25Retriever, Hit
from selfrag.trajectory import Passage

QUERIES = [
    {"id": "q1", "question": "What is the capital of France?", "answer": "Paris is the capital of France."},
    {"id": "q2", "question": "When was the Eiffel Tower in Paris built?", "answer": "It was built in 1889."},
    {"id": "q4", "question": "What is the capital of Italy?", "answer": "Rome"},
]


def _config(url: str, output: Path, *extra: str) -> GenerateConfig:
    settings = ["labeler=llm", "teacher.model=scripted-teacher", f"teacher.engine_options.base_url={url}", "split=all",
                f"output={output}", *extra]
    return load_config(GenerateConfig, None, settings)


def test_llm_shards_share_one_index_and_write_what_the_in_memory_way_writes(tmp_path: Path) -> None:
    corpus, queries = write_inputs(tmp_path, QUERIES)
    build_index(IndexConfig(corpus=str(corpus), output=str(tmp_path / "index")))
    with TeacherServer() as server:
        run(_config(server.url, tmp_path / "memory", f"passages={corpus}", f"queries={queries}"))
        for shard in range(2):  # two workers, one index, no corpus at all
            run(_config(server.url, tmp_path / f"shard-{shard}", f"queries={queries}",
                        f"retriever.index={tmp_path / 'index'}", f"shard={shard}/2"))
        run(_config(server.url, tmp_path / "whole", f"queries={queries}", f"retriever.index={tmp_path / 'index'}"))
    for name in OUTPUT_FILES:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "memory" / name).read_bytes(), name
    lines = sorted(
        line for shard in range(2) for line in (tmp_path / f"shard-{shard}" / "records.jsonl").read_text().splitlines()
    )
    assert lines == sorted((tmp_path / "whole" / "records.jsonl").read_text().splitlines()) and len(lines) == 3


def test_gold_run_over_a_prebuilt_index_matches_bm25_in_memory(tmp_path: Path) -> None:
    corpus, queries = write_inputs(tmp_path, [{**q, "meta": {"split": "train"}} for q in QUERIES])
    build_index(IndexConfig(corpus=str(corpus), output=str(tmp_path / "index")))
    common = [f"passages={corpus}", f"queries={queries}", "distractors=1"]
    run(load_config(GenerateConfig, None, [*common, f"output={tmp_path / 'memory'}"]))
    run(load_config(GenerateConfig, None, [*common, f"output={tmp_path / 'index-run'}",
                                           f"retriever.index={tmp_path / 'index'}"]))
    assert (tmp_path / "index-run" / "records.jsonl").read_text() == (tmp_path / "memory" / "records.jsonl").read_text()
    # resuming the in-memory run's output with a prebuilt index is another retrieval: refused, in one line each
    with pytest.raises(ConfigError, match=r"retriever.index=.* \(was None\)"):
        run(load_config(GenerateConfig, None, [*common, f"output={tmp_path / 'memory'}",
                                               f"retriever.index={tmp_path / 'index'}"]))


def test_contradictory_retriever_settings_are_refused(tmp_path: Path) -> None:
    corpus, queries = write_inputs(tmp_path, QUERIES)
    with pytest.raises(ConfigError, match="set one of index, url, corpus, got index and url"):
        load_config(GenerateConfig, None, [f"queries={queries}", "labeler=llm", "teacher.model=m", "output=o",
                                           "retriever.index=x", "retriever.url=postgresql://h/db?table=t"])
    with pytest.raises(ConfigError, match="drop retriever.corpus"):
        load_config(GenerateConfig, None, [f"passages={corpus}", f"queries={queries}", "output=o",
                                           f"retriever.corpus={corpus}"])
    with pytest.raises(ConfigError, match="passages is required with labeler=gold"):
        load_config(GenerateConfig, None, [f"queries={queries}", "output=o", "retriever.index=x"])


class _SlowRetriever:
    """BM25 that records each batch and the thread it ran on, and takes 50 ms a call."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.inner = BM25Retriever(passages)
        self.calls: list[tuple[int, str]] = []

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls.append((len(queries), threading.current_thread().name))
        time.sleep(0.05)
        return self.inner.search_many(queries, k)


def test_batched_searcher_runs_off_the_loop_in_batches() -> None:
    passages = [Passage(f"p{i}", "", text) for i, text in enumerate(["Paris is in France", "Rome is in Italy",
                                                                      "Berlin is in Germany"])]
    slow = _SlowRetriever(passages)
    questions = [f"where is {city}?" for city in ("Paris", "Rome", "Berlin")] * 10

    async def main() -> tuple[list[list[Hit]], int]:
        searcher = BatchedSearcher(slow, max_batch=16)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        beat = asyncio.create_task(ticker())
        results = await asyncio.gather(*(searcher.search(q, 1) for q in questions))
        beat.cancel()
        return list(results), ticks

    results, ticks = asyncio.run(main())
    assert [hits[0].passage.id for hits in results] == ["p0", "p1", "p2"] * 10
    assert [size for size, _ in slow.calls] == [16, 14]  # 30 searches in two calls, not thirty
    assert all(thread != threading.main_thread().name for _, thread in slow.calls)
    assert ticks >= 10  # the loop kept running during the 100 ms of searching


def test_precomputed_ctxs_need_no_corpus_and_no_index(tmp_path: Path) -> None:
    ctxs = [{"id": "c-1", "title": "Lyon", "text": "Lyon is a city in France on the Rhone."},
            {"title": "Lyon", "text": "Lyon is known for its cuisine."}]
    rows = [{**QUERIES[0], "question": "Where is Lyon?", "answer": "Lyon is in France.", "ctxs": ctxs}]
    _, queries = write_inputs(tmp_path, rows)
    with TeacherServer() as server:
        run(_config(server.url, tmp_path / "out", f"queries={queries}"))
    import json

    records = [json.loads(line) for line in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    used = {segment["passage"]["id"] for record in records for segment in record["segments"] if segment.get("passage")}
    assert records and used and used <= {"c-1", "q1#1"}  # the question's own passages, nothing else
    _, queries = write_inputs(tmp_path, [QUERIES[1]])  # no ctxs, no corpus, no index: one line naming the fix
    with TeacherServer() as server, pytest.raises(ConfigError, match="have no ctxs and no retriever is set"):
        run(_config(server.url, tmp_path / "none", f"queries={queries}"))
