"""Records -> ``input_ids`` + ``labels`` with the Self-RAG loss mask.

    example = encode_record(record, tokenizer, token_ids, "auto")
    encoded = build_dataset(records, tokenizer, token_ids, "auto", max_length=320)

Masked (label ``-100``): the prompt, and the ids strictly inside each ``<paragraph>…</paragraph>`` pair,
pair by pair. Trained: the markup tokens themselves, every reflection token, the answer text, and the
closing EOS -- except that a record with ``meta.untrained_text`` (the gold labeler's abstain sentence after an
``[Irrelevant]`` verdict, a support negative's wrong answer) has its segment text masked too: its reflection
tokens are trained, its words are not. A record longer than ``max_length`` is skipped and counted, never
truncated mid-passage.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfrag.errors import InputError
from selfrag.jsonl import read_jsonl
from selfrag.prompting import encode_pieces, encode_prompt
from selfrag.reflection import Group, ReflectionIds
from selfrag.splits import in_fraction
from selfrag.trajectory import Record

logger = logging.getLogger(__name__)

IGNORE = -100
#: The reflection types scored by evaluation (markup is trained but not a judgement).
SCORED_GROUPS: tuple[Group, ...] = (Group.RETRIEVE, Group.RELEVANCE, Group.SUPPORT, Group.UTILITY)


def encode_record(record: Record, tokenizer: Any, token_ids: ReflectionIds, template: str) -> dict[str, list[int]]:
    """One record as ``{"input_ids": [...], "labels": [...]}`` (same length; ``-100`` where masked)."""
    prompt = encode_prompt(tokenizer, record.instruction, template)
    target, inside = encode_pieces(tokenizer, token_ids, record.pieces())
    if tokenizer.eos_token_id is None:
        raise InputError("the tokenizer has no eos_token; set one (tokenizer.eos_token) so the model learns to stop")
    eos = int(tokenizer.eos_token_id)
    input_ids = prompt + target + [eos]
    if record.meta.get("untrained_text"):
        inside = [masked or token_ids.token(token) is None for token, masked in zip(target, inside, strict=True)]
    labels = [IGNORE] * len(prompt)
    labels += [IGNORE if masked else token for token, masked in zip(target, inside, strict=True)]
    labels.append(eos)
    return {"input_ids": input_ids, "labels": labels}


@dataclass(frozen=True)
class EncodedRecords:
    """Encoded examples (with their record ids) and how many records were too long to keep."""

    examples: list[dict[str, Any]]
    skipped: int

    def to_dataset(self) -> Any:
        """A ``datasets.Dataset`` with only the ``input_ids`` and ``labels`` columns (what the trainer reads)."""
        from datasets import Dataset

        return Dataset.from_dict(
            {
                "input_ids": [example["input_ids"] for example in self.examples],
                "labels": [example["labels"] for example in self.examples],
            }
        )


def encode_records(
    records: Iterable[Record], tokenizer: Any, token_ids: ReflectionIds, template: str, max_length: int
) -> EncodedRecords:
    """Encode records; skip (and log the count of) those longer than ``max_length`` ids."""
    examples: list[dict[str, Any]] = []
    skipped = 0
    for record in records:
        example = encode_record(record, tokenizer, token_ids, template)
        if len(example["input_ids"]) > max_length:
            skipped += 1
            logger.debug("record %s: %d ids > max_length %d; skipped", record.id, len(example["input_ids"]), max_length)
            continue
        examples.append({"id": record.id, **example})
    if skipped:
        logger.warning(
            "skipped %d of %d records longer than max_length=%d ids (raise training.max_length to keep them)",
            skipped, skipped + len(examples), max_length,
        )
    return EncodedRecords(examples, skipped)


def build_dataset(
    records: Iterable[Record], tokenizer: Any, token_ids: ReflectionIds, template: str, max_length: int
) -> tuple[Any, int]:
    """A ``datasets.Dataset`` of ``input_ids`` + ``labels``, and the number of records skipped as too long."""
    encoded = encode_records(records, tokenizer, token_ids, template, max_length)
    return encoded.to_dataset(), encoded.skipped


def question_of(record: Record) -> str:
    """The question a record belongs to: ``meta.query_id`` (gold and teacher records), else the id before its last
    ``/`` (``<query id>/gold``, ``<query id>/hard-0``), else the record id itself."""
    query_id = record.meta.get("query_id")
    if isinstance(query_id, str) and query_id:
        return query_id
    return record.id.rsplit("/", 1)[0]


def order_by_question(examples: Sequence[dict[str, Any]], records: Sequence[Record], seed: int) -> list[dict[str, Any]]:
    """``examples`` with each question's records next to each other, questions in a seeded random order.

    Read in order (sequential sampling), a batch then holds one question's gold passage beside its negatives:
    the gradient contrasts passages for the same question. Within a question the file order is kept.
    """
    return [example for group in question_groups(examples, records, seed) for example in group]


def question_groups(
    examples: Sequence[dict[str, Any]], records: Sequence[Record], seed: int
) -> list[list[dict[str, Any]]]:
    """Each question's examples (file order), the questions in a seeded random order."""
    import random

    question = {record.id: question_of(record) for record in records}
    groups: dict[str, list[dict[str, Any]]] = {}
    for example in examples:
        groups.setdefault(question.get(example["id"], example["id"]), []).append(example)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    return [groups[key] for key in keys]


def question_batches(
    examples: Sequence[dict[str, Any]], records: Sequence[Record], seed: int, batch_size: int
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """``examples`` in :func:`order_by_question`'s order and the batches to read them in: whole questions only.

    Laid end to end in fixed batches, questions of 1, 3 and 4 records straddle batch boundaries (most steps then
    see parts of two questions). Here a batch is filled with whole questions in order (next fit) and closed when
    the next question does not fit, so batches hold 1 to ``batch_size`` examples and never split a question
    unless it alone has more than ``batch_size`` records (then it fills consecutive batches).
    """
    ordered: list[dict[str, Any]] = []
    batches: list[list[int]] = []
    current: list[int] = []
    for group in question_groups(examples, records, seed):
        for start in range(0, len(group), batch_size):
            chunk = list(range(len(ordered), len(ordered) + len(group[start : start + batch_size])))
            ordered.extend(group[start : start + batch_size])
            if current and len(current) + len(chunk) > batch_size:
                batches.append(current)
                current = []
            current = current + chunk
    if current:
        batches.append(current)
    return ordered, batches


def reflection_positions(example: dict[str, Sequence[int]], token_ids: ReflectionIds) -> dict[Group, list[int]]:
    """Positions whose label is a token of each scored group (Retrieve, IsREL, IsSUP, IsUSE).

    A position ``p`` is predicted by the logits at ``p - 1`` (labels are not shifted, as in transformers).
    """
    positions: dict[Group, list[int]] = {group: [] for group in SCORED_GROUPS}
    for position, label in enumerate(example["labels"]):
        if label == IGNORE:
            continue
        group = token_ids.group_of_id(int(label))
        if group in positions:
            positions[group].append(position)
    return positions


def read_records(path: str | Path) -> list[Record]:
    """Read trajectory records from JSONL; a bad line raises ``InputError`` naming file:line."""
    records = []
    for number, data in read_jsonl(path, what="records"):
        if "schema_version" not in data and isinstance(data.get("output"), str) and "instruction" in data:
            raise InputError(
                f"{path}:{number}: this is the paper's training-data form (instruction/output), not a trajectory "
                f"record; convert the file first: selfrag paper-data import {path} records.jsonl"
            )
        try:
            records.append(Record.from_json(data))
        except InputError as error:
            raise InputError(f"{path}:{number}: {error}") from None
    if not records:
        raise InputError(f"records file {str(path)!r} holds no records; generate some with `selfrag generate`")
    return records


def split_records(records: Sequence[Record], fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
    """``(train, held_out)`` **by question** (:func:`question_of`): a question's gold passage and its negatives
    fall on the same side, so held-out accuracy is measured on questions never trained on and ``order=question``
    keeps whole questions. At least one record stays in train."""
    held = {record.id: in_fraction(question_of(record), fraction, seed) for record in records}
    train = [record for record in records if not held[record.id]]
    held_out = [record for record in records if held[record.id]]
    if not train:
        raise InputError(
            f"training.eval_fraction={fraction} leaves no training records out of {len(records)}; lower it"
        )
    return train, held_out
