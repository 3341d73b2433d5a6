"""The tiny corpus the teacher-run tests label (loopback HTTP teacher and the real vLLM teacher), and a writer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CORPUS = [
    {"id": "paris-0", "title": "Paris", "text": "Paris is the capital of France. It lies on the Seine."},
    {"id": "paris-1", "title": "Paris", "text": "The Eiffel Tower in Paris was built in 1889 for a world fair."},
    {"id": "rome-0", "title": "Rome", "text": "Rome is the capital of Italy. The Colosseum stands in Rome."},
    {"id": "berlin-0", "title": "Berlin", "text": "Berlin is the capital of Germany and its largest city."},
    {"id": "rain-0", "title": "Rain", "text": "Rain is liquid water falling from clouds in drops."},
]


def write_inputs(folder: Path, queries: Sequence[dict[str, Any]]) -> tuple[Path, Path]:
    """``corpus.jsonl`` (:data:`CORPUS`) and ``queries.jsonl`` in ``folder``."""
    corpus, query_file = folder / "corpus.jsonl", folder / "queries.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    query_file.write_text("".join(json.dumps(row) + "\n" for row in queries))
    return corpus, query_file
