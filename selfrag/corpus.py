"""Corpora (passages) and query sets, read from JSONL or a folder of text files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfrag.errors import InputError
from selfrag.jsonl import mapping_field, read_jsonl, require_fields, string_list
from selfrag.trajectory import Passage

TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Query:
    """One question; ``answers`` are gold answers (empty when unknown), ``answerable`` False for SQuAD-v2 style."""

    id: str
    question: str
    answers: tuple[str, ...] = ()
    answerable: bool = True
    gold_passage_ids: tuple[str, ...] = ()
    needs_retrieval: bool | None = None  # gold retrieve decision when the data set knows it (None: unknown)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "answers": list(self.answers),
            "answerable": self.answerable,
            "gold_passage_ids": list(self.gold_passage_ids),
            "needs_retrieval": self.needs_retrieval,
            "meta": self.meta,
        }


def load_corpus(path: str | Path) -> list[Passage]:
    """Read a corpus: JSONL lines ``{"id", "title", "text"}``, or a folder of .txt/.md files (one passage each)."""
    path = Path(path)
    if path.is_dir():
        return _load_folder(path)
    passages = []
    seen: dict[str, int] = {}
    for number, row in read_jsonl(path, "corpus"):
        where = f"{path}:{number}"
        require_fields(row, ("id", "text"), where)
        if not isinstance(row.get("title", ""), str):
            raise InputError(f"{where}: field 'title' must be a string, got {row.get('title')!r}")
        if row["id"] in seen:
            raise InputError(
                f"{where}: duplicate passage id {row['id']!r} (first on line {seen[row['id']]}); ids must be unique"
            )
        seen[row["id"]] = number
        passages.append(Passage(row["id"], row.get("title", ""), row["text"]))
    if not passages:
        raise InputError(f"corpus {str(path)!r} holds no passages; add JSONL lines with id, title, text")
    return passages


def _load_folder(path: Path) -> list[Passage]:
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES and p.is_file())
    if not files:
        raise InputError(f"corpus folder {str(path)!r} has no {'/'.join(TEXT_SUFFIXES)} files")
    return [Passage(str(p.relative_to(path)), p.stem, p.read_text(encoding="utf-8").strip()) for p in files]


def load_queries(path: str | Path) -> list[Query]:
    """Read queries: JSONL lines with ``question`` and optional ``id``, ``answers`` (or ``answer``), ``answerable``."""
    path = Path(path)
    queries = []
    for number, row in read_jsonl(path, "queries"):
        where = f"{path}:{number}"
        require_fields(row, ("question",), where)
        answers = row.get("answers", [row["answer"]] if "answer" in row else [])
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise InputError(f"{where}: field 'answers' must be a list of strings, got {answers!r}")
        answerable = row.get("answerable", True)
        if not isinstance(answerable, bool):
            raise InputError(f"{where}: field 'answerable' must be true or false, got {answerable!r}")
        gold = string_list(row, "gold_passage_ids", where)
        mapping_field(row, "meta", where)  # a meta that is not a JSON object is refused with file:line
        needs_retrieval = row.get("needs_retrieval")
        if needs_retrieval is not None and not isinstance(needs_retrieval, bool):
            raise InputError(f"{where}: field 'needs_retrieval' must be true, false or null, got {needs_retrieval!r}")
        queries.append(
            Query(
                id=str(row.get("id", f"{path.stem}-{number}")),
                question=row["question"],
                answers=tuple(answers),
                answerable=answerable,
                gold_passage_ids=tuple(str(g) for g in gold),
                needs_retrieval=needs_retrieval,
                meta=dict(row.get("meta") or {}),
            )
        )
    if not queries:
        raise InputError(f"queries file {str(path)!r} holds no queries; add JSONL lines with a 'question'")
    return queries
