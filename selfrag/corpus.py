"""Corpora (passages) and query sets, read from JSONL or a folder of text files."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfrag.errors import InputError
from selfrag.jsonl import mapping_field, read_jsonl, require_fields, string_list
from selfrag.trajectory import Passage

TEXT_SUFFIXES = (".txt", ".md", ".pdf")


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
    output: str | None = None  # a long-form answer (the paper's "output"); labelled sentence by sentence
    ctxs: tuple[Passage, ...] = ()  # passages retrieved beforehand (the paper's ``ctxs``): searched instead of an index

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "answers": list(self.answers),
            "answerable": self.answerable,
            "gold_passage_ids": list(self.gold_passage_ids),
            "needs_retrieval": self.needs_retrieval,
            "meta": self.meta,
            **({"output": self.output} if self.output is not None else {}),
            **({"ctxs": [passage.to_json() for passage in self.ctxs]} if self.ctxs else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "a query") -> Query:
        """The query :meth:`to_json` wrote (checked input comes from :func:`load_queries`)."""
        return cls(
            str(data["id"]),
            str(data["question"]),
            tuple(data.get("answers") or ()),
            bool(data.get("answerable", True)),
            tuple(data.get("gold_passage_ids") or ()),
            data.get("needs_retrieval"),
            dict(data.get("meta") or {}),
            data.get("output"),
            parse_ctxs(data, where, str(data["id"])),
        )


def retrieval_needed(needs_retrieval: bool | None) -> bool:
    """Whether a question needs retrieval by its ``needs_retrieval`` field: only ``false`` says no, so a question
    without the field needs it. One rule for every stage: generate labels it ``[Retrieval]``, calibrate fits the
    threshold with it on the retrieving side."""
    return needs_retrieval is not False


@dataclass(frozen=True)
class Chunk:
    """A passage cut from a file of a corpus folder, with where it came from (words ``start``..``end``)."""

    passage: Passage
    source: str  # the file, relative to the folder
    index: int  # chunk number within the file
    start: int  # first word (0-based) of the file's text
    end: int  # one past the last word
    page: int | None = None  # PDF page (1-based) where the chunk starts

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {**self.passage.to_json(), "source": self.source, "chunk": self.index}
        data.update(start_word=self.start, end_word=self.end)
        if self.page is not None:
            data["page"] = self.page
        return data


def load_corpus(path: str | Path | Sequence[str | Path], chunk_words: int = 200,
                chunk_overlap: int = 40) -> list[Passage]:
    """Read a corpus into memory: JSONL lines ``{"id", "title", "text"}``, DPR's ``psgs_w100.tsv`` (a ``.tsv`` file
    with the header ``id text title``), or a folder of .txt/.md/.pdf files (see :func:`iter_corpus`); several of them
    (a list) are joined in order.

    Ids must be unique, across the files too. An index build does not come here: it streams :func:`iter_corpus` into
    its passage store.
    """
    passages = []
    seen: dict[str, str] = {}
    for one in ([path] if isinstance(path, str | Path) else path):
        for where, passage in iter_corpus(one, chunk_words, chunk_overlap):
            if passage.id in seen:
                raise InputError(duplicate_message(where, passage.id, seen[passage.id]))
            seen[passage.id] = where
            passages.append(passage)
    return passages


def iter_corpus(path: str | Path, chunk_words: int = 200, chunk_overlap: int = 40) -> Iterator[tuple[str, Passage]]:
    """The passages of a corpus, streamed in order, each with where it comes from (``file:line``, or the file of a
    folder's chunk).

    Every line is checked as it is read (a bad one raises ``InputError`` with file:line, what and the fix), except
    that ids are unique: that is the consumer's check (:func:`load_corpus` keeps the ids it saw; the index build
    lets its passage store's key refuse a second one: see :mod:`selfrag.corpus_stream`). Files of a
    folder are cut into chunks of ``chunk_words`` words, consecutive chunks sharing ``chunk_overlap`` words
    (see :func:`load_chunks`).
    """
    path = Path(path)
    if path.is_dir():
        for chunk in iter_chunks(path, chunk_words, chunk_overlap):
            yield f"{path / chunk.source}", chunk.passage
    elif path.suffix.lower() == ".tsv":
        yield from _iter_tsv(path)
    else:
        yield from _iter_jsonl(path)


def duplicate_message(where: str, passage_id: str, first: str) -> str:
    line = first.rsplit(":", 1)[-1] if first.rsplit(":", 1)[0] == where.rsplit(":", 1)[0] else None
    earlier = f"first on line {line}" if line and line.isdigit() else f"first at {first}"
    return f"{where}: duplicate passage id {passage_id!r} ({earlier}); ids must be unique, give it another id"


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Passage]]:
    check_utf8(path, "corpus")
    count = 0
    for number, row in read_jsonl(path, "corpus"):
        where = f"{path}:{number}"
        require_fields(row, ("id", "text"), where)
        if not isinstance(row.get("title", ""), str):
            raise InputError(f"{where}: field 'title' must be a string, got {row.get('title')!r}")
        if not row["text"].strip():
            raise InputError(f"{where}: field 'text' is empty; give the passage its text or delete the line")
        count += 1
        yield where, Passage(row["id"], row.get("title", ""), row["text"])
    if not count:
        raise InputError(f"corpus {str(path)!r} holds no passages; add JSONL lines with id, title, text")


def _iter_tsv(path: Path) -> Iterator[tuple[str, Passage]]:
    """Passages of a DPR-style TSV (``psgs_w100.tsv``: header ``id<TAB>text<TAB>title``, any column order),
    streamed line by line; fields quoted as DPR writes them (``"..."`` with ``""`` for a quote) are unquoted."""
    if not path.is_file():
        raise InputError(f"corpus {str(path)!r} does not exist; give a .jsonl or .tsv file or a folder")
    count = 0
    with path.open(encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quotechar='"')
        try:
            header = [name.strip().lower() for name in next(rows, [])]
            missing = [name for name in ("id", "text", "title") if name not in header]
            if missing:
                raise InputError(
                    f"{path}:1: the header must name the columns id, text and title (DPR's psgs_w100.tsv: "
                    f"id<TAB>text<TAB>title), got {header!r}; add or fix the header line"
                )
            columns = [header.index(name) for name in ("id", "text", "title")]
            for row in rows:
                where = f"{path}:{rows.line_num}"
                if len(row) != len(header):
                    raise InputError(
                        f"{where}: {len(row)} tab-separated fields, expected {len(header)} ({', '.join(header)}); "
                        "a tab or an unbalanced quote inside a field? quote it as DPR does (\"...\" with \"\")"
                    )
                passage_id, text, title = (row[index] for index in columns)
                if not text.strip():
                    raise InputError(f"{where}: field 'text' is empty; give the passage its text or delete the line")
                count += 1
                yield where, Passage(passage_id, title, text)
        except UnicodeDecodeError as error:
            raise InputError(
                f"{path}: near line {rows.line_num + 1}: a byte is not UTF-8 ({error.reason}); save the corpus as "
                "UTF-8 (e.g. iconv -f latin1 -t utf-8)"
            ) from None
        except csv.Error as error:
            raise InputError(f"{path}:{rows.line_num}: {error}; fix the quoting of this line") from None
    if not count:
        raise InputError(f"corpus {str(path)!r} holds no passages; add lines id<TAB>text<TAB>title under the header")


def load_chunks(folder: str | Path, chunk_words: int = 200, chunk_overlap: int = 40) -> list[Chunk]:
    """The chunks of :func:`iter_chunks` in a list."""
    return list(iter_chunks(folder, chunk_words, chunk_overlap))


def iter_chunks(folder: str | Path, chunk_words: int = 200, chunk_overlap: int = 40) -> Iterator[Chunk]:
    """Chunks of every .txt/.md/.pdf file under ``folder`` (sorted by path), with source file and position.

    A file that fits in one chunk keeps its relative path as passage id; longer files give ids
    ``<path>#<chunk number>``. PDFs are read with pypdf (pure Python), page by page.

    Titles (see :func:`_read_text`): a Markdown file's first heading, and where a chunk starts under a later heading,
    ``"<first heading> — <that heading>"``; heading lines are not part of the passage text. A text file's first line
    when it reads as a title (short, no closing punctuation, a blank line after it); a PDF's own title; else the
    file name, its ``_``/``-`` read as spaces.
    """
    folder = Path(folder)
    if chunk_words < 1 or not 0 <= chunk_overlap < chunk_words:
        raise InputError(
            f"chunk_overlap must be in [0, chunk_words), got chunk_words={chunk_words}, chunk_overlap={chunk_overlap}; "
            "e.g. chunk_words=200 chunk_overlap=40"
        )
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES and p.is_file())
    if not files:
        raise InputError(
            f"corpus folder {str(folder)!r} has no {'/'.join(TEXT_SUFFIXES)} files; add some or fix the path"
        )
    for file in files:  # one file's words in memory at a time
        relative = str(file.relative_to(folder))
        text = _read_text(file)
        if not text.words:
            raise InputError(f"{file}: no text in this file; delete it from the corpus folder or give it text")
        step = chunk_words - chunk_overlap
        starts = list(range(0, max(len(text.words) - chunk_overlap, 1), step))
        for index, start in enumerate(starts):
            end = min(start + chunk_words, len(text.words))
            passage_id = relative if len(starts) == 1 else f"{relative}#{index}"
            page = None if text.pages is None else text.pages[start]
            section = None if text.sections is None else text.sections[start]
            title = text.title if not section or section == text.title else f"{text.title} — {section}"
            passage = Passage(passage_id, title, " ".join(text.words[start:end]))
            yield Chunk(passage, relative, index, start, end, page)


@dataclass(frozen=True)
class _Text:
    """A file's words; per word its PDF page (1-based) and its Markdown section heading, where the file has them."""

    words: list[str]
    title: str
    pages: list[int] | None = None
    sections: list[str | None] | None = None


_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _read_text(file: Path) -> _Text:
    """The file's words and title (see :func:`load_chunks`)."""
    fallback = " ".join(file.stem.replace("_", " ").replace("-", " ").split()) or file.stem
    suffix = file.suffix.lower()
    if suffix == ".pdf":
        return _read_pdf(file, fallback)
    check_utf8(file, "corpus")
    content = file.read_text(encoding="utf-8")
    if suffix == ".md":
        return _read_markdown(content, fallback)
    lines = content.lstrip().splitlines()
    first = lines[0].strip() if lines else ""
    titled = len(lines) > 1 and not lines[1].strip() and 0 < len(first.split()) <= 12 and first[-1] not in ".!?:;,"
    return _Text(content.split(), first if titled else fallback)


def _read_markdown(content: str, fallback: str) -> _Text:
    """Words without heading lines (or YAML front matter); the first heading is the title."""
    lines = content.splitlines()
    if lines and lines[0].strip() == "---" and "---" in (line.strip() for line in lines[1:]):
        lines = lines[[line.strip() for line in lines].index("---", 1) + 1 :]
    words: list[str] = []
    sections: list[str | None] = []
    title: str | None = None
    section: str | None = None
    for line in lines:
        heading = _HEADING.match(line)
        if heading:
            section = heading.group(2).strip() or None
            title = title or section
            continue
        line_words = line.split()
        words += line_words
        sections += [section] * len(line_words)
    return _Text(words, title or fallback, sections=sections)


def _read_pdf(file: Path, fallback: str) -> _Text:
    """The PDF's words with the page of each, and its metadata title where it has one."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:  # pragma: no cover - pypdf is a dependency
        raise InputError(f"{file}: reading PDFs needs pypdf; pip install pypdf") from None
    try:
        reader = PdfReader(file)
        words: list[str] = []
        pages: list[int] = []
        for number, page in enumerate(reader.pages, start=1):
            page_words = (page.extract_text() or "").split()
            words += page_words
            pages += [number] * len(page_words)
        title = str(reader.metadata.get("/Title") or "").strip() if reader.metadata is not None else ""
    except (PdfReadError, ValueError, KeyError, OSError) as error:
        raise InputError(f"{file}: not a readable PDF ({error}); repair or remove it") from None
    return _Text(words, title or fallback, pages=pages)


def check_utf8(path: Path, what: str) -> None:
    """Raise ``InputError`` naming file:line:column of the first byte that is not UTF-8 (read a line at a time: a
    newline byte is never inside a UTF-8 sequence, so each line decodes on its own)."""
    if not path.is_file():
        return  # read_jsonl reports a missing file
    with path.open("rb") as handle:
        for line, data in enumerate(handle, start=1):
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InputError(
                    f"{path}:{line}: byte 0x{data[error.start]:02x} at column {error.start + 1} is not UTF-8; "
                    f"save the {what} file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None


def load_queries(path: str | Path) -> list[Query]:
    """Read queries: JSONL lines with ``question`` and optional ``id``, ``answers`` (or ``answer``), ``output``,
    ``answerable``, ``gold_passage_ids``, ``needs_retrieval``, ``meta``. Ids must be unique."""
    path = Path(path)
    check_utf8(path, "queries")
    queries = []
    seen: dict[str, int] = {}
    for number, row in read_jsonl(path, "queries"):
        where = f"{path}:{number}"
        require_fields(row, ("question",), where)
        if not row["question"].strip():
            raise InputError(f"{where}: field 'question' is empty; write the question or delete the line")
        output = row.get("output")
        if output is not None and (not isinstance(output, str) or not output.strip()):
            raise InputError(f"{where}: field 'output' must be a non-empty string or absent, got {output!r}")
        query_id = str(row.get("id", f"{path.stem}-{number}"))
        if query_id in seen:
            raise InputError(
                f"{where}: duplicate query id {query_id!r} (first on line {seen[query_id]}); ids must be unique"
            )
        seen[query_id] = number
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
                id=query_id,
                question=row["question"],
                answers=tuple(answers),
                answerable=answerable,
                gold_passage_ids=tuple(str(g) for g in gold),
                needs_retrieval=needs_retrieval,
                meta=dict(row.get("meta") or {}),
                output=output,
                ctxs=parse_ctxs(row, where, query_id),
            )
        )
    if not queries:
        raise InputError(f"queries file {str(path)!r} holds no queries; add JSONL lines with a 'question'")
    return queries


def parse_ctxs(row: Mapping[str, Any], where: str, owner_id: str) -> tuple[Passage, ...]:
    """A line's ``ctxs`` (the paper's and FlashRAG's precomputed passages: ``[{id?, title?, text}]``), in order.

    Shared by ``selfrag generate`` (queries) and ``selfrag eval`` (examples); a passage without an id gets
    ``<owner id>#<position>``.
    """
    ctxs = row.get("ctxs", [])
    if ctxs is None:
        return ()
    if not isinstance(ctxs, list):
        raise InputError(f"{where}: field 'ctxs' must be a list of {{title, text}} objects, got {ctxs!r}")
    passages = []
    for index, ctx in enumerate(ctxs):
        if not isinstance(ctx, Mapping) or not isinstance(ctx.get("text"), str):
            raise InputError(f"{where}: ctxs[{index}] must be an object with a string 'text', got {ctx!r}")
        title = ctx.get("title", "")
        if not isinstance(title, str):
            raise InputError(f"{where}: ctxs[{index}].title must be a string, got {title!r}")
        passages.append(Passage(str(ctx.get("id", f"{owner_id}#{index}")), title, ctx["text"]))
    return tuple(passages)
