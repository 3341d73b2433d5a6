"""Which passages may stand as evidence for a question: BM25 distractors and the best own passage.

A distractor is a top-ranked BM25 passage for the question that is safe to label ``[Irrelevant]``:
not a gold passage, not from the question's own paragraph (SQuAD v2 keeps those in
``meta.own_passage_ids``), and not containing any gold answer (case-insensitive). For an
unanswerable question, its own paragraph's best BM25 match is the passage it is labelled against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from selfrag.corpus import Query
from selfrag.retrieval import Retriever
from selfrag.trajectory import Passage

#: How many BM25 hits to look through per question for distractors and the own passage.
SEARCH_DEPTH = 50


@dataclass(frozen=True)
class Evidence:
    """The passages one question is labelled against, besides its gold passage."""

    distractors: tuple[Passage, ...]
    own: Passage | None = None  # best-matching passage of the question's own paragraph


def own_passage_ids(query: Query) -> frozenset[str]:
    """Passages of the question's own paragraph: ``meta.own_passage_ids`` plus the gold passages."""
    own = query.meta.get("own_passage_ids") or ()
    return frozenset(str(passage_id) for passage_id in own) | frozenset(query.gold_passage_ids)


def is_distractor(query: Query, passage: Passage) -> bool:
    """Whether ``passage`` can be labelled irrelevant to ``query`` without reading it."""
    if passage.id in own_passage_ids(query):
        return False
    content = f"{passage.title}\n{passage.text}".casefold()
    return not any(answer.strip() and answer.strip().casefold() in content for answer in query.answers)


def find_evidence(
    queries: Sequence[Query],
    retriever: Retriever,
    passages_by_id: Mapping[str, Passage],
    distractors: int,
    depth: int = SEARCH_DEPTH,
) -> list[Evidence]:
    """Distractors (and, for unanswerable questions, the own passage) for each query, in one batched search."""
    hits_per_query = retriever.search_many([query.question for query in queries], max(depth, distractors))
    evidence = []
    for query, hits in zip(queries, hits_per_query, strict=True):
        chosen = [hit.passage for hit in hits if is_distractor(query, hit.passage)][:distractors]
        own = None
        if not query.answerable:
            own = _best_own(query, [hit.passage for hit in hits], passages_by_id)
        evidence.append(Evidence(tuple(chosen), own))
    return evidence


def _best_own(query: Query, ranked: Sequence[Passage], passages_by_id: Mapping[str, Passage]) -> Passage | None:
    """The highest-ranked passage of the question's own paragraph; its first passage when none ranks."""
    own = own_passage_ids(query)
    for passage in ranked:
        if passage.id in own:
            return passage
    # Not in the top hits (the question shares no word with it): fall back to the paragraph's first passage.
    listed = [str(i) for i in query.meta.get("own_passage_ids") or () if str(i) in passages_by_id]
    return passages_by_id[listed[0]] if listed else None
