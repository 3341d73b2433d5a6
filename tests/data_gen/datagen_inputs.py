"""The data_gen tests' hand-made corpus and queries, small enough to check every label by eye (imported by
conftest.py and by tests by this module's own name: two modules named conftest shadow each other)."""

from __future__ import annotations

import json
from pathlib import Path

PASSAGES = [
    {"id": "paris-0-0", "title": "Paris", "text": "Paris is the capital of France. It lies on the Seine."},
    {"id": "paris-0-1", "title": "Paris", "text": "The Eiffel Tower in the capital was built in 1889 for a fair."},
    {"id": "rome-0-0", "title": "Rome", "text": "Rome is the capital of Italy. The Colosseum stands in Rome."},
    {"id": "rome-0-1", "title": "Rome", "text": "Legend says Rome was founded in 753 BC by Romulus."},
    {"id": "berlin-0-0", "title": "Berlin", "text": "Berlin is the capital of Germany and its largest city."},
    {"id": "quiz-0-0", "title": "Quizzes", "text": "Which city is the capital of France? Every quiz says PARIS."},
    {"id": "towers-0-0", "title": "Towers", "text": "The leaning tower of Pisa was built over two centuries."},
    {"id": "rivers-0-0", "title": "Rivers", "text": "The Danube flows through many a capital city of Europe."},
]

QUERIES = [
    {
        "id": "q-answerable",
        "question": "What is the capital of France?",
        "answers": ["Paris"],
        "answerable": True,
        "gold_passage_ids": ["paris-0-0"],
        "needs_retrieval": True,
        "meta": {"split": "train", "source": "hand", "own_passage_ids": ["paris-0-0", "paris-0-1"]},
    },
    {
        "id": "q-unanswerable",
        "question": "When was the Eiffel Tower taken down?",
        "answers": [],
        "answerable": False,
        "gold_passage_ids": [],
        "needs_retrieval": True,
        "meta": {"split": "train", "source": "hand", "own_passage_ids": ["paris-0-0", "paris-0-1"]},
    },
    {
        "id": "q-math",
        "question": "What is six times seven?",
        "answers": ["42"],
        "needs_retrieval": False,
        "meta": {"split": "train", "source": "hand"},
    },
    {
        "id": "q-rome",
        "question": "Who founded Rome, the capital of Italy?",
        "answers": ["Romulus"],
        "gold_passage_ids": ["rome-0-1"],
        "needs_retrieval": True,
        "meta": {"split": "test", "source": "hand", "own_passage_ids": ["rome-0-0", "rome-0-1"]},
    },
] + [
    {
        "id": f"q-extra-{number}",
        "question": f"Which capital city is number {number} on the list?",
        "answers": ["Berlin"],
        "gold_passage_ids": ["berlin-0-0"],
        "meta": {"split": "train", "source": "hand", "own_passage_ids": ["berlin-0-0"]},
    }
    for number in range(12)
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path
