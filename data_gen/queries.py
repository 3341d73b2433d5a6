"""Which queries a generate run labels, and where those without their own ctxs search.

Shared by the gold path (:mod:`selfrag.data_gen.gold_run`), the teacher path (:mod:`selfrag.data_gen.teacher_run`)
and the Ray executor, so none of them imports another for it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from selfrag.corpus import Query
from selfrag.data_gen.config import parse_shard
from selfrag.errors import InputError
from selfrag.jsonl import read_jsonl
from selfrag.retrieval import BM25Retriever, Retriever
from selfrag.splits import in_split, shard_of
from selfrag.trajectory import Passage


def select_queries(queries: Sequence[Query], split: str, shard: str, source: Path | str = "queries",
                   required: bool = True) -> list[Query]:
    """The queries of ``split`` (by ``meta.split``; ``all`` takes every query) that fall in ``shard``; with
    ``required``, ``InputError`` when none is in the split (a further file may have none: ``required=False``)."""
    index, count = parse_shard(shard)
    selected = [query for query in queries if in_split(query.meta.get("split"), split)]
    if not selected and required:
        raise InputError(
            f"no query in {str(source)!r} has meta.split == {split!r}; "
            'set split=all to use every query, or add "meta": {"split": ...} to the lines'
        )
    return [query for query in selected if shard_of(query.id, count) == index]


def check_gold_ids(queries: Sequence[Query], wanted: Callable[[Query], Sequence[str]], passage_ids: Collection[str],
                   files: Sequence[Path], corpus: str) -> None:
    """``InputError`` for the first gold passage id (of those ``wanted(query)`` names: the ones its labels need) that
    no passage has, as ``file:line`` of the query (found in ``files``), with the closest id and the fix. Called
    before any slow work, so the corrected file reruns into the same output."""
    for query in queries:
        missing = [passage_id for passage_id in wanted(query) if passage_id not in passage_ids]
        if not missing:
            continue
        close = difflib.get_close_matches(missing[0], list(passage_ids), n=1)
        hint = f" (the closest id there is {close[0]!r})" if close else ""
        raise InputError(
            f"{_line_of(query.id, files)}: gold_passage_ids names {missing[0]!r} (query {query.id!r}), but no passage "
            f"of {corpus} has that id{hint}; correct the id on that line, or add the passage to the corpus"
        )


def _line_of(query_id: str, files: Sequence[Path]) -> str:
    """``file:line`` of the query with ``query_id`` (an id-less line's id is ``<file stem>-<line>``)."""
    for path in files:
        for number, row in read_jsonl(path, "queries"):
            if str(row.get("id", f"{path.stem}-{number}")) == query_id:
                return f"{path}:{number}"
    return f"query {query_id!r}"


def fallback_retriever(prebuilt: Retriever | None, passages: list[Passage]) -> Retriever | None:
    """Where questions without ctxs search: the prebuilt index, else BM25 built here (small corpora), else none."""
    if prebuilt is not None:
        return prebuilt
    return BM25Retriever(passages) if passages else None
