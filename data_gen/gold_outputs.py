"""The gold path's critic rows, and the critic files rendered from its records.

    rows = critic_rows(records_of_one_query)           # one row per distinct gold decision
    counts = write_critic(output)                      # critic.jsonl / critic-heldout.jsonl from the records files

Every gold label of a record is a decision with its inputs (question, passage, answer) and one reflection token,
written in the teacher path's critic schema (:func:`selfrag.data_gen.assembly.critic_row`; ``labeler`` is
``gold``, ``model`` and ``prompt_hash`` are null):

    retrieve   question                      -> [Retrieval] / [No Retrieval]
    relevance  question, passage             -> [Relevant] / [Irrelevant]
    support    question, passage, segment    -> [Fully supported] / [No support / Contradictory]
    utility    question, answer              -> [Utility:k]

A query's records repeat some decisions (every retrieving record of a question says ``[Retrieval]``; the
gold record and a support negative judge the same passage ``[Relevant]``): each distinct decision is written
once. The critic files are rendered from ``records.jsonl`` / ``heldout.jsonl`` after each run, a query's
records taken in id order and the queries sorted by id, so an interrupted and resumed run, an uninterrupted
run and a merge of shards all write the same bytes.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from selfrag.data_gen.assembly import Outcome, critic_row
from selfrag.data_gen.labelers import LabelItem
from selfrag.jsonl import read_jsonl, write_jsonl_atomic
from selfrag.trajectory import Label, Passage, Record

RECORDS_FILE = "records.jsonl"
HELDOUT_FILE = "heldout.jsonl"
CRITIC_FILE = "critic.jsonl"
CRITIC_HELDOUT_FILE = "critic-heldout.jsonl"
#: records file -> the critic file rendered from it
CRITIC_OF = {RECORDS_FILE: CRITIC_FILE, HELDOUT_FILE: CRITIC_HELDOUT_FILE}


def decisions(record: Record) -> list[tuple[LabelItem, Label]]:
    """The labelled decisions of one record, each with the inputs a critic sees (as the teacher path asks them)."""
    question = record.instruction
    found: list[tuple[LabelItem, Label]] = []
    evidence: Passage | None = None
    for index, segment in enumerate(record.segments):
        sentence = segment.text.strip()
        preceding = "".join(s.text for s in record.segments[:index]).strip()
        if segment.retrieve is not None:
            item = (
                LabelItem("retrieve", question)
                if index == 0
                else LabelItem("retrieve_sentence", question, evidence, sentence, preceding)
            )
            found.append((item, segment.retrieve))
        evidence = segment.passage or evidence
        if segment.passage is not None and segment.relevance is not None:
            found.append((LabelItem("relevance", question, segment.passage), segment.relevance))
        if segment.support is not None and evidence is not None:
            found.append((LabelItem("support", question, evidence, sentence, preceding), segment.support))
    if record.utility is not None:
        answer = "".join(segment.text for segment in record.segments).strip()
        found.append((LabelItem("utility", question, output=answer), record.utility))
    return found


def critic_rows(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Critic rows of one query's records (taken in id order), each distinct decision once."""
    if not records:
        return []
    first = records[0]
    outcome = Outcome(str(first.meta.get("query_id", first.id.rsplit("/", 1)[0])), first.source)
    seen: set[str] = set()
    for record in sorted(records, key=lambda record: record.id):
        for item, label in decisions(record):
            row = critic_row(outcome, item, label)
            key = json.dumps({k: v for k, v in row.items() if k != "id"}, sort_keys=True)
            if key not in seen:
                seen.add(key)
                outcome.critic.append(row)
    return outcome.critic


def render_critic(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Critic rows of every query in JSON record rows (any order), sorted by query id."""
    by_query: dict[str, list[Record]] = defaultdict(list)
    for row in rows:
        record = Record.from_json(row)
        by_query[str(record.meta.get("query_id", record.id.rsplit("/", 1)[0]))].append(record)
    return [critic for query_id in sorted(by_query) for critic in critic_rows(by_query[query_id])]


def write_critic(output: Path) -> dict[str, Any]:
    """Write ``critic.jsonl`` and ``critic-heldout.jsonl`` from the records files in ``output``; returns counts."""
    counts: dict[str, int] = {}
    labels: dict[str, Counter[str]] = defaultdict(Counter)
    for records_name, critic_name in CRITIC_OF.items():
        path = output / records_name
        rows = render_critic(row for _, row in read_jsonl(path, "records")) if path.exists() else []
        write_jsonl_atomic(output / critic_name, rows)
        counts["train" if records_name == RECORDS_FILE else "heldout"] = len(rows)
        for row in rows:
            labels[row["type"]][row["target"]] += 1
    return {
        "critic_records": counts,
        "critic_labels": {kind: dict(sorted(counter.items())) for kind, counter in sorted(labels.items())},
    }
