"""What a generate run's output was made from, by content: the corpus, the sentence splitter, and each question.

    digests = {"corpus": passages_digest(passages), "queries": file_digest(queries_path), "sentences": SPLITTER}
    changed = input_changes(output, digests)     # ["corpus: content changed (3f2a91c0 -> 77b0e1d4)"]
    write_inputs(output, digests)

A path names a file, not what is in it: a corpus or query file edited in place (same path, new lines) must
not resume as if nothing happened. ``inputs.json`` in the output directory holds the SHA-256 of each input's
content (and ``selfrag.sentences.SPLITTER``: labels split into other sentences are other records); a rerun
compares them. The teacher path also keeps one digest per question in its journal
(:func:`query_digest`), so a question whose text or answer changed is labelled again while the unchanged ones
resume.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from selfrag.corpus import Query
from selfrag.fsutil import write_json
from selfrag.trajectory import Passage

INPUTS_FILE = "inputs.json"


def _digest(data: object) -> str:
    payload = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()


def passages_digest(passages: Sequence[Passage]) -> str:
    """The corpus as read (a file, or a folder's chunks): ids, titles and texts in order."""
    return _digest([passage.to_json() for passage in passages])


def query_digest(query: Query, seed_passage: Passage | None = None) -> str:
    """One question as the labeler sees it (and, for a teacher-written question, the passage it comes from)."""
    return _digest({"query": query.to_json(), "seed": None if seed_passage is None else seed_passage.to_json()})


def read_inputs(output: Path) -> dict[str, str]:
    path = output / INPUTS_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {str(key): str(value) for key, value in data.items()} if isinstance(data, dict) else {}


#: What a run that recorded its inputs but not this one used: sentences were split by regular expressions until
#: ``selfrag.sentences`` (whose ``SPLITTER`` generate records as ``sentences``).
UNRECORDED = {"sentences": "regex"}


def input_changes(output: Path, digests: Mapping[str, str]) -> list[str]:
    """Inputs whose content differs from what the run in ``output`` read (none when there was no earlier run)."""
    before = read_inputs(output)
    before = {**UNRECORDED, **before} if before else {}
    return [
        f"{name}: content changed since the run in {str(output)!r} ({_short(before[name])} -> {_short(now)})"
        if now.startswith("sha256:") else f"{name}: {before[name]} in the run in {str(output)!r}, {now} now"
        for name, now in digests.items()
        if name in before and before[name] != now
    ]


def write_inputs(output: Path, digests: Mapping[str, str]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    write_json(output / INPUTS_FILE, dict(digests))


def _short(digest: str) -> str:
    return digest.split(":", 1)[-1][:12]
