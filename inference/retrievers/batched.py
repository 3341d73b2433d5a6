"""Searches from many coroutines, gathered into batches and run in a worker thread, never on the event loop.

    searcher = BatchedSearcher(retriever)
    hits = await searcher.search("who wrote Hamlet?", k=3)     # from any number of tasks at once

A search (BM25 scoring, a query embedding, a database round trip) blocks for milliseconds to seconds; on the
event loop it would stall every teacher call in flight. Here the queries that arrive while a batch runs wait
for the next one, so under load each ``search_many`` call carries many queries (one embedding batch, one
database round trip) and the loop stays free.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from selfrag.retrieval import Hit, Retriever


class BatchedSearcher:
    """``await search(query, k)`` from any task; one ``search_many`` per batch of queries, in a thread."""

    def __init__(self, retriever: Retriever, max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.retriever = retriever
        self.max_batch = max_batch
        self.batches = 0  # search_many calls made, for stats and tests
        self._pending: list[tuple[str, int, asyncio.Future[list[Hit]]]] = []
        self._draining = False

    async def search(self, query: str, k: int) -> list[Hit]:
        future: asyncio.Future[list[Hit]] = asyncio.get_running_loop().create_future()
        self._pending.append((query, k, future))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # let the tasks scheduled beside this one add their queries first
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                by_k: dict[int, list[tuple[str, asyncio.Future[list[Hit]]]]] = defaultdict(list)
                for query, k, future in batch:
                    by_k[k].append((query, future))
                for k, items in by_k.items():
                    await self._run(k, items)
        finally:
            self._draining = False

    async def _run(self, k: int, items: list[tuple[str, asyncio.Future[list[Hit]]]]) -> None:
        try:
            results = await asyncio.to_thread(self.retriever.search_many, [query for query, _ in items], k)
            self.batches += 1
        except Exception as error:  # the searching tasks get the error, not the drain loop
            for _, future in items:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), hits in zip(items, results, strict=True):
            if not future.done():
                future.set_result(hits)
