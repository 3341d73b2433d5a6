"""The demo data shipped in data_gen/demo loads with the core readers and keeps its promises."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from selfrag.corpus import load_corpus, load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_DIR, DEMO_QUERIES


@pytest.fixture(scope="module")
def demo():  # type: ignore[no-untyped-def]
    passages = load_corpus(DEMO_CORPUS)
    return {p.id: p for p in passages}, load_queries(DEMO_QUERIES)


def test_counts_and_splits(demo) -> None:  # type: ignore[no-untyped-def]
    passages, queries = demo
    counts = Counter((q.meta["source"], q.meta["split"]) for q in queries)
    assert counts == {
        ("squad_v2", "train"): 2406,
        ("squad_v2", "test"): 1229,
        ("gsm8k", "train"): 50,
        ("gsm8k", "test"): 10,
        ("general", "train"): 30,
        ("general", "test"): 10,
    }
    squad = [q for q in queries if q.meta["source"] == "squad_v2"]
    unanswerable = sum(not q.answerable for q in squad) / len(squad)
    assert 0.17 < unanswerable < 0.23
    # >= 300 answerable test questions: enough items per class for the judgement evaluation
    assert sum(q.answerable for q in squad if q.meta["split"] == "test") >= 900
    assert 1500 <= len(passages) <= 2500
    assert len({q.id for q in queries}) == len(queries)


def test_files_are_small_and_sourced() -> None:
    assert sum(path.stat().st_size for path in Path(DEMO_DIR).iterdir()) < 3e6
    source = (Path(DEMO_DIR) / "SOURCE.md").read_text(encoding="utf-8")
    for needle in ("CC BY-SA 4.0", "Rajpurkar", "MIT", "GSM8K", "CS224n"):
        assert needle in source


def test_gold_passages_exist_and_contain_the_answer(demo) -> None:  # type: ignore[no-untyped-def]
    passages, queries = demo
    for query in queries:
        if query.meta["source"] != "squad_v2":
            continue
        assert query.needs_retrieval is True
        assert all(i in passages for i in query.meta["own_passage_ids"]), query.id
        if query.answerable:
            (gold,) = query.gold_passage_ids
            assert gold in query.meta["own_passage_ids"]
            assert query.answers[0] in passages[gold].text, query.id
        else:
            assert query.gold_passage_ids == () and query.answers == ()


def test_no_retrieval_questions_are_not_only_arithmetic(demo) -> None:  # type: ignore[no-untyped-def]
    _, queries = demo
    no_retrieval = [q for q in queries if q.needs_retrieval is False]
    general = [q for q in no_retrieval if q.meta["source"] == "general"]
    assert len(general) >= 30 and all(not q.answers[0].replace(".", "").isdigit() for q in general[:5])
    assert {q.meta["split"] for q in general} == {"train", "test"}


def test_test_articles_are_unseen_in_train(demo) -> None:  # type: ignore[no-untyped-def]
    _, queries = demo
    titles: dict[str, set[str]] = {"train": set(), "test": set()}
    for query in (q for q in queries if q.meta["source"] == "squad_v2"):
        titles[query.meta["split"]].add(query.meta["title"])
    assert len(titles["test"]) == 5 and len(titles["train"]) == 11
    assert not titles["train"] & titles["test"]


def test_gsm8k_queries_need_no_retrieval(demo) -> None:  # type: ignore[no-untyped-def]
    _, queries = demo
    for query in (q for q in queries if q.meta["source"] == "gsm8k"):
        assert query.needs_retrieval is False and query.gold_passage_ids == ()
        (answer,) = query.answers
        float(answer)  # the number after '####'


def test_test_paragraphs_are_unused_by_train(demo) -> None:  # type: ignore[no-untyped-def]
    _, queries = demo
    paragraphs: dict[str, set[str]] = {"train": set(), "test": set()}
    for query in (q for q in queries if q.meta["source"] == "squad_v2"):
        paragraphs[query.meta["split"]] |= set(query.meta["own_passage_ids"])
    assert not paragraphs["train"] & paragraphs["test"]


def test_passages_are_short(demo) -> None:  # type: ignore[no-untyped-def]
    passages, _ = demo
    words = [len(p.text.split()) for p in passages.values()]
    assert sum(words) / len(words) < 60
    assert sum(w > 60 for w in words) / len(words) < 0.05  # only single sentences longer than the limit
