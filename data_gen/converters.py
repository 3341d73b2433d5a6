"""Gold sources: public QA data sets -> the queries + corpus JSONL that ``selfrag generate`` reads.

    python -m selfrag.data_gen.converters hotpotqa hotpot_dev_distractor_subset.json runs/hotpot --limit 50

Each converter keeps the data set's own evidence annotation, so the gold labeler's rule (a passage is
``[Relevant]`` exactly when it holds the evidence) can be applied without reading the text:

* ``hotpotqa``  — every context paragraph is a passage; the supporting-fact paragraphs are the gold
  passages, the other (distractor) paragraphs of the same question are its own non-gold passages.
* ``nq-open``   — NQ-open with oracle passages (lost-in-the-middle): the gold passage (``isgold``).
* ``retrievalqa`` — RetrievalQA: the context passages that contain a gold answer are the gold passages.
  ``retrievalqa_gpt4.jsonl`` (the shipped slice's source) holds only questions the model's own knowledge lacks
  and has no label for it: ``needs_retrieval: true``. The full ``retrievalqa.jsonl`` (upstream since 2024-05)
  labels each question ``param_knowledge_answerable`` (1: answerable from parametric knowledge): those become
  ``needs_retrieval: false``.
* ``begin``     — BEGIN: a dialogue turn, the knowledge snippet, and a response judged attributable to it or
  not: ``output`` is the response, the knowledge is the gold passage, ``meta.support`` the gold IsSUP
  label (``[Fully supported]`` / ``[No support / Contradictory]``; "Generic" responses are skipped). The gold
  labeler writes one record per response with that label (see :mod:`selfrag.data_gen.gold`).

Every query carries ``meta.source`` and ``meta.split`` (a stable hash: about 10% ``test``).
"""

from __future__ import annotations

import argparse
import ast
import csv
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selfrag import reflection as rf
from selfrag.errors import InputError
from selfrag.jsonl import write_jsonl_atomic
from selfrag.splits import in_fraction

Converted = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (queries, passages)


def split_of(query_id: str, test_fraction: float = 0.1) -> str:
    """``meta.split`` of a converted question: ``test`` for a stable ``test_fraction`` of ids (no seed), else
    ``train``."""
    return "test" if in_fraction(query_id, test_fraction) else "train"


def _query(query_id: str, source: str, question: str, **fields: Any) -> dict[str, Any]:
    meta = {"source": source, "split": split_of(query_id), **fields.pop("meta", {})}
    return {"id": query_id, "question": question, **fields, "meta": meta}


def _contains_answer(text: str, answers: list[str]) -> bool:
    folded = text.casefold()
    return any(answer.strip() and answer.strip().casefold() in folded for answer in answers)


def hotpotqa(path: Path, limit: int | None = None) -> Converted:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error.msg} at line {error.lineno}); expected HotpotQA") from None
    queries: list[dict[str, Any]] = []
    passages: list[dict[str, Any]] = []
    for number, row in enumerate(data[:limit]):
        query_id = f"hotpotqa-{row.get('id', number)}"
        titles, sentences = row["context"]["title"], row["context"]["sentences"]
        ids = [f"{query_id}/{index}" for index in range(len(titles))]
        for passage_id, title, lines in zip(ids, titles, sentences, strict=True):
            passages.append({"id": passage_id, "title": title, "text": "".join(lines).strip()})
        supporting = set(row["supporting_facts"]["title"])
        gold = [passage_id for passage_id, title in zip(ids, titles, strict=True) if title in supporting]
        queries.append(
            _query(
                query_id,
                "hotpotqa",
                row["question"],
                answers=[row["answer"]],
                gold_passage_ids=gold,
                needs_retrieval=True,
                meta={"own_passage_ids": ids, "type": row.get("type"), "level": row.get("level")},
            )
        )
    return queries, passages


def nq_open(path: Path, limit: int | None = None) -> Converted:
    queries: list[dict[str, Any]] = []
    passages: list[dict[str, Any]] = []
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            if limit is not None and number >= limit:
                break
            row = json.loads(line)
            query_id = f"nq-{number}"
            gold = [ctx for ctx in row["ctxs"] if ctx.get("isgold")] or row["ctxs"][:1]
            gold_ids = []
            for index, ctx in enumerate(gold):
                passage_id = f"{query_id}/{index}"
                gold_ids.append(passage_id)
                passages.append({"id": passage_id, "title": ctx.get("title", ""), "text": ctx["text"]})
            queries.append(
                _query(
                    query_id,
                    "nq-open",
                    row["question"],
                    answers=row["answers"],
                    gold_passage_ids=gold_ids,
                    needs_retrieval=True,
                )
            )
    return queries, passages


def _literal(value: Any) -> Any:
    """RetrievalQA stores some lists as Python reprs inside strings."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def retrievalqa(path: Path, limit: int | None = None) -> Converted:
    queries: list[dict[str, Any]] = []
    passages: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            if limit is not None and len(queries) >= limit:
                break
            row = json.loads(line)
            answers = _literal(row["ground_truth"])
            answers = [str(a) for a in (answers if isinstance(answers, list) else [answers])]
            context = _literal(row.get("context")) or []
            query_id = f"retrievalqa-{row.get('question_id', number)}"
            parametric = row.get("param_knowledge_answerable", 0)
            if parametric not in (0, 1) or isinstance(parametric, bool):
                raise InputError(
                    f"{path}:{number + 1}: field 'param_knowledge_answerable' must be 0 or 1, got {parametric!r}; "
                    "fix that line (1: answerable from the model's own knowledge) or remove the field"
                )
            ids, gold = [], []
            for index, ctx in enumerate(context if isinstance(context, list) else []):
                # toolqa gives plain strings; a few freshqa items have a title and no text (skipped)
                title, text = ("", ctx) if isinstance(ctx, str) else (str(ctx.get("title", "")), ctx.get("text"))
                if not isinstance(text, str) or not text.strip():
                    continue
                passage_id = f"{query_id}/{index}"
                ids.append(passage_id)
                passages.append({"id": passage_id, "title": title, "text": text.strip()})
                if _contains_answer(text, answers):
                    gold.append(passage_id)
            queries.append(
                _query(
                    query_id,
                    "retrievalqa",
                    row["question"],
                    answers=answers,
                    answerable=bool(gold) or parametric == 1,
                    gold_passage_ids=gold,
                    needs_retrieval=parametric == 0,
                    meta={"own_passage_ids": ids, "data_source": row.get("data_source")},
                )
            )
    return queries, passages


BEGIN_SUPPORT = {"Fully attributable": rf.FULLY_SUPPORTED, "Not fully attributable": rf.NO_SUPPORT}


def begin(path: Path, limit: int | None = None) -> Converted:
    queries: list[dict[str, Any]] = []
    passages: list[dict[str, Any]] = []
    with path.open(encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), start=2):
            if limit is not None and len(queries) >= limit:
                break
            support = BEGIN_SUPPORT.get(row.get("begin_label", ""))
            if support is None:  # "Generic": no claim to attribute
                continue
            query_id = f"begin-{path.stem}-{number}"
            passages.append({"id": f"{query_id}/knowledge", "title": "", "text": row["knowledge"].strip()})
            queries.append(
                _query(
                    query_id,
                    "begin",
                    row["message"].strip(),
                    output=row["response"].strip(),
                    gold_passage_ids=[f"{query_id}/knowledge"],
                    needs_retrieval=True,
                    meta={"support": support, "data_source": row.get("data_source"), "model": row.get("model_name")},
                )
            )
    return queries, passages


CONVERTERS: dict[str, Callable[[Path, int | None], Converted]] = {
    "hotpotqa": hotpotqa,
    "nq-open": nq_open,
    "retrievalqa": retrievalqa,
    "begin": begin,
}


def convert(name: str, source: Path, output: Path, limit: int | None = None, skip: int = 0) -> tuple[int, int]:
    """Write ``output/queries.jsonl`` and ``output/corpus.jsonl``; returns (queries, passages).

    ``skip``: leave out the first ``skip`` questions (and their passages), so a second slice of one file never holds
    a question of the first: ``limit`` then counts from there."""
    if name not in CONVERTERS:
        raise InputError(f"unknown source {name!r}; use one of {sorted(CONVERTERS)}")
    if not source.is_file():
        raise InputError(f"{name} file {str(source)!r} not found; see ../shared/data/PROVENANCE.md for the files")
    if skip < 0:
        raise InputError(f"--skip must be >= 0, got {skip}")
    queries, passages = CONVERTERS[name](source, None if limit is None else skip + limit)
    if skip:
        queries = queries[skip:]
        kept = {query["id"] for query in queries}
        # every converter names a question's passages "<question id>/<n>"
        passages = [passage for passage in passages if passage["id"].rsplit("/", 1)[0] in kept]
    unique = list({passage["id"]: passage for passage in passages}.values())
    write_jsonl_atomic(output / "queries.jsonl", queries)
    write_jsonl_atomic(output / "corpus.jsonl", unique)
    return len(queries), len(unique)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Convert a public QA data set into queries + corpus JSONL.")
    parser.add_argument("source", choices=sorted(CONVERTERS))
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--limit", type=int, default=None, help="first N questions only (after --skip)")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N questions")
    args = parser.parse_args(argv)
    queries, passages = convert(args.source, args.input, args.output, args.limit, args.skip)
    print(f"{queries} queries and {passages} passages written to {args.output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
