"""The paper's released training data (selfrag_train_data) in and out of trajectory records.

    selfrag paper-data import train.jsonl runs/paper/records.jsonl     # then: selfrag train records=...
    selfrag paper-data export runs/data/records.jsonl runs/paper-form.jsonl

A line of the paper's data (JSONL, or one JSON array) is ``{"instruction", "input", "output", "id",
"dataset_name"}``; ``output`` holds the reflection tokens and the passages inline::

    [Retrieval]<paragraph>Title\\ntext</paragraph>[Relevant]Sentence.[Fully supported][Utility:5]

Import parses ``output`` into segments (passage, labels) with the project's own parser and keeps what the paper's
grammar allows beside the strict one: text before the first retrieve token or after a support verdict (a segment
without a retrieve label), ``[Irrelevant]`` text with no support verdict, no utility token. A line whose ``output``
would not render back to exactly the same text (an unclosed ``<paragraph>``, text after the utility token, a
relevance token without a passage) is refused as ``file:line: what — the fix``, as is a missing or non-string field
and a broken token in the text (``[Utility:7]``, ``[Fully Supported]``: it would be read as answer text).
The prompt is the paper's: ``instruction``, and when ``input`` is not empty ``\\n\\n### Input:\\n{input}`` after it,
so the paper template (``### Instruction:\\n...\\n\\n### Response:\\n``) gives exactly the paper's prompt. Every
other field is kept under ``meta.paper``, so export writes each imported line back as it was read.

Export writes any record in the same form (``instruction``, ``input``, ``output`` = the rendered target, ``id``,
``dataset_name``) for trainers that read the paper's format. Round trip: ``render(import(line)) == line.output``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfrag.errors import InputError
from selfrag.fsutil import decode_utf8
from selfrag.jsonl import read_jsonl, write_jsonl_atomic
from selfrag.reflection import FULLY_SUPPORTED, RELEVANT, UTILITY_TOKENS, lookalikes
from selfrag.trajectory import Label, Passage, Record, Segment, parse_trajectory

LABELER = "paper"
INPUT_MARK = "\n\n### Input:\n"


@dataclass
class ImportReport:
    """What an import read: records, and how many used each of the paper's looser forms."""

    records: int = 0
    datasets: Counter[str] = field(default_factory=Counter)
    loose: Counter[str] = field(default_factory=Counter)

    def summary(self, path: Path) -> str:
        lines = [f"imported {self.records} records into {path}"]
        lines.append("by data set: " + ", ".join(f"{name} {count}" for name, count in self.datasets.most_common()))
        if self.loose:
            forms = ", ".join(f"{name} x{count}" for name, count in self.loose.most_common())
            lines.append(f"records kept as the paper wrote them: {forms}")
        return "\n".join(lines)


def read_examples(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` of a JSONL file, or of each element of a JSON array (with the line it starts on)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"paper data file {str(path)!r} not found; check the path (JSONL or a JSON array)")
    with path.open("rb") as handle:
        head = handle.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"["):
        yield from read_jsonl(path, what="paper data")
        return
    text = decode_utf8(path.read_bytes(), path)
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    while True:
        position = _skip(text, position, ",")
        if position >= len(text) or text[position] == "]":
            return
        line = text.count("\n", 0, position) + 1
        try:
            data, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            raise InputError(
                f"{path}:{text.count(chr(10), 0, error.pos) + 1}: not valid JSON ({error.msg}) — fix that element"
            ) from None
        if not isinstance(data, dict):
            raise InputError(f"{path}:{line}: expected a JSON object, got {type(data).__name__} — fix that element")
        yield line, data


def _skip(text: str, position: int, separators: str) -> int:
    while position < len(text) and (text[position].isspace() or text[position] in separators):
        position += 1
    return position


def to_record(example: Mapping[str, Any], record_id: str) -> tuple[Record, list[str]]:
    """One paper example as a record, and the looser forms of the paper's grammar it used.

    Raises ``ValueError`` with what is wrong (the caller adds file:line).
    """
    for name in ("instruction", "output"):
        if not isinstance(example.get(name), str) or not example[name].strip():
            raise ValueError(f"field {name!r} must be a non-empty string, got {example.get(name)!r}")
    for name in ("input", "id", "dataset_name"):
        if example.get(name) is not None and not isinstance(example[name], str):
            raise ValueError(f"field {name!r} must be a string, got {example[name]!r}")
    output, given_input = str(example["output"]), str(example.get("input") or "")
    parsed = parse_trajectory(output)
    for piece in parsed.segments:  # a broken token would be read as answer text
        for broken in lookalikes(piece.text):
            raise ValueError(f"output holds {broken!r} at character {output.index(broken) + 1}, which is not a "
                             "reflection token")
    segments = []
    for number, piece in enumerate(parsed.segments):
        passage = None if piece.passage is None else _passage(f"{record_id}/p{number}", piece.passage)
        segments.append(
            Segment(piece.text, _label(piece.retrieve), passage, _label(piece.relevance), _label(piece.support))
        )
    instruction = str(example["instruction"]) + (INPUT_MARK + given_input if given_input else "")
    meta = {
        "query_id": record_id,
        "kind": "paper",
        "paper": {key: value for key, value in example.items() if key != "output"},
        "paper_keys": list(example),
    }
    source = str(example.get("dataset_name") or "")
    record = Record(record_id, instruction, tuple(segments), _label(parsed.utility), source, meta)
    if parsed.trailing or record.render() != output:
        raise ValueError(f"output does not read as a reflection trajectory ({'; '.join(parsed.problems)})")
    return record, _loose(parsed.problems)


def _label(value: str | None) -> Label | None:
    return None if value is None else Label(value, LABELER)


def _passage(passage_id: str, content: str) -> Passage:
    """``Title\\ntext`` (the paper's form) -> title and text; content without a title line stays whole."""
    title, newline, text = content.partition("\n")
    return Passage(passage_id, title, text) if newline and title.strip() else Passage(passage_id, "", content)


#: Problems of the strict parser that the paper's own data has (the record still renders to the same text).
LOOSE = {
    "has no retrieve token": "a segment without a retrieve token",
    "has a passage but no support token": "a passage without a support verdict",
    "no utility token at the end": "no utility token",
    "has no text": "a segment without text",
}


def _loose(problems: tuple[str, ...]) -> list[str]:
    found = []
    for problem in problems:
        name = next((name for key, name in LOOSE.items() if problem.endswith(key)), None)
        if name is None:
            raise ValueError(f"output does not read as a reflection trajectory ({problem})")
        found.append(name)
    return found


def import_file(source: str | Path, target: str | Path) -> ImportReport:
    """Every example of ``source`` as a record in ``target`` (JSONL), in file order; ids stay unique."""
    report = ImportReport()
    rows = []
    seen: Counter[str] = Counter()
    for line, example in read_examples(source):
        base = str(example.get("id") or f"line-{line}")
        seen[base] += 1
        record_id = f"paper/{base}" + (f"#{seen[base]}" if seen[base] > 1 else "")
        try:
            record, loose = to_record(example, record_id)
        except ValueError as error:
            raise InputError(f"{source}:{line}: {error} — {_fix(str(error))}") from None
        rows.append(record.to_json())
        report.records += 1
        report.datasets[record.source or "-"] += 1
        report.loose.update(set(loose))  # records that use each form
    if not rows:
        raise InputError(f"{source}: holds no example — give the paper's train file (JSONL or a JSON array)")
    write_jsonl_atomic(target, rows)
    return report


def _fix(error: str) -> str:
    if "not a reflection token" in error:
        return (f"write the token exactly as the paper does ({', '.join(UTILITY_TOKENS[:1])} … {UTILITY_TOKENS[-1]}, "
                f"{FULLY_SUPPORTED}, {RELEVANT}, ...) or delete that line")
    if error.startswith("field"):
        return "give each line instruction and output (strings), and input, id, dataset_name as strings or omit them"
    return "correct or delete that line (each <paragraph> closed, nothing after the [Utility:k] token)"


def to_example(record: Record) -> dict[str, Any]:
    """A record in the paper's form; an imported record comes back with every field it was read with, in order."""
    paper, keys = record.meta.get("paper"), record.meta.get("paper_keys")
    if isinstance(paper, Mapping) and isinstance(keys, list):
        return {str(key): record.render() if key == "output" else paper.get(key) for key in keys}
    return {
        "instruction": record.instruction,
        "input": "",
        "output": record.render(),
        "id": record.id,
        "dataset_name": record.source,
    }


def export_file(source: str | Path, target: str | Path) -> int:
    """Records (JSONL) -> the paper's form (JSONL); returns how many."""
    rows = []
    for line, data in read_jsonl(source, what="records"):
        try:
            rows.append(to_example(Record.from_json(data)))
        except InputError as error:
            raise InputError(f"{source}:{line}: {error}") from None
    return write_jsonl_atomic(target, rows)
