"""Which queries a generate run labels, and where those without their own ctxs search.

Shared by the gold path (:mod:`selfrag.data_gen.gold_run`), the teacher path (:mod:`selfrag.data_gen.teacher_run`)
and the Ray executor, so none of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from selfrag.corpus import Query
from selfrag.data_gen.config import parse_shard
from selfrag.errors import InputError
from selfrag.retrieval import BM25Retriever, Retriever
from selfrag.splits import shard_of
from selfrag.trajectory import Passage


def select_queries(queries: Sequence[Query], split: str, shard: str, source: Path | str = "queries",
                   required: bool = True) -> list[Query]:
    """The queries of ``split`` (by ``meta.split``; ``all`` takes every query) that fall in ``shard``; with
    ``required``, ``InputError`` when none is in the split (a further file may have none: ``required=False``)."""
    index, count = parse_shard(shard)
    in_split = [query for query in queries if split == "all" or query.meta.get("split") == split]
    if not in_split and required:
        raise InputError(
            f"no query in {str(source)!r} has meta.split == {split!r}; "
            'set split=all to use every query, or add "meta": {"split": ...} to the lines'
        )
    return [query for query in in_split if shard_of(query.id, count) == index]


def fallback_retriever(prebuilt: Retriever | None, passages: list[Passage]) -> Retriever | None:
    """Where questions without ctxs search: the prebuilt index, else BM25 built here (small corpora), else none."""
    if prebuilt is not None:
        return prebuilt
    return BM25Retriever(passages) if passages else None
