"""Encoding and masking: the prompt and passage contents are masked pair by pair; the rest is trained."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from training_records import no_retrieval_record, three_passage_record, training_records

from selfrag import reflection as rf
from selfrag.errors import InputError
from selfrag.prompting import encode_prompt
from selfrag.reflection import Group
from selfrag.training.dataset import (
    IGNORE,
    build_dataset,
    encode_record,
    question_of,
    read_records,
    reflection_positions,
    split_records,
)
from selfrag.trajectory import Record

GOLDEN = Path(__file__).parents[1] / "assets" / "golden" / "training_text.txt"


def test_mask_covers_exactly_the_passage_contents(prepared) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer, token_ids, _ = prepared
    example = encode_record(three_passage_record(), tokenizer, token_ids, "auto")
    ids, labels = example["input_ids"], example["labels"]
    assert len(ids) == len(labels)
    prompt_length = len(encode_prompt(tokenizer, three_passage_record().instruction, "auto"))
    opens = [i for i, t in enumerate(ids) if t == token_ids.id(rf.PARAGRAPH_OPEN)]
    closes = [i for i, t in enumerate(ids) if t == token_ids.id(rf.PARAGRAPH_CLOSE)]
    assert len(opens) == len(closes) == 3
    masked = set(range(prompt_length))
    for start, end in zip(opens, closes, strict=True):
        assert start < end
        masked |= set(range(start + 1, end))  # strictly inside each pair
    for position, (token, label) in enumerate(zip(ids, labels, strict=True)):
        assert label == (IGNORE if position in masked else token), position
    assert ids[-1] == labels[-1] == tokenizer.eos_token_id
    # The sentences and reflection tokens between passages are trained (the reference code hid them).
    trained = [token_ids.token(t) for t in labels if t != IGNORE and token_ids.token(t)]
    assert trained.count(rf.RETRIEVAL) == 3 and rf.IRRELEVANT in trained and rf.UTILITY_TOKENS[4] in trained


def test_literal_reflection_text_in_a_passage_yields_no_reflection_ids(prepared) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer, token_ids, _ = prepared
    record = three_passage_record(passage_text="Tricky </paragraph>[Fully supported] text.")
    ids = encode_record(record, tokenizer, token_ids, "auto")["input_ids"]
    first_open = ids.index(token_ids.id(rf.PARAGRAPH_OPEN))
    first_close = ids.index(token_ids.id(rf.PARAGRAPH_CLOSE))
    inside = ids[first_open + 1 : first_close]
    assert not set(inside) & set(token_ids.all_ids)
    assert "</paragraph>[Fully supported]" in tokenizer.decode(inside)


def test_rendered_training_text_matches_golden_file(prepared) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer, token_ids, _ = prepared
    blocks = []
    for record in (three_passage_record(), no_retrieval_record()):
        for template in ("chat", "paper"):
            example = encode_record(record, tokenizer, token_ids, template)
            trained = [t if label != IGNORE else None for t, label in zip(example["input_ids"], example["labels"],
                                                                           strict=True)]
            text = tokenizer.decode(example["input_ids"])
            # Show the loss mask too: masked ids as one '·' run per masked span.
            shown, run = [], False
            for token, label in zip(example["input_ids"], trained, strict=True):
                if label is None:
                    if not run:
                        shown.append("·")
                    run = True
                else:
                    shown.append(tokenizer.decode([token]))
                    run = False
            blocks.append(f"=== {record.id} / {template} ===\n{text}\n--- trained ---\n{''.join(shown)}\n")
    rendered = "\n".join(blocks)
    if not GOLDEN.exists():  # written once; review it, then it pins the format
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(rendered, encoding="utf-8")
    assert rendered == GOLDEN.read_text(encoding="utf-8")


def test_too_long_records_are_skipped_counted_and_logged(prepared, caplog) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer, token_ids, _ = prepared
    records = [no_retrieval_record("short"), three_passage_record("long")]
    short = len(encode_record(records[0], tokenizer, token_ids, "auto")["input_ids"])
    with caplog.at_level(logging.WARNING):
        dataset, skipped = build_dataset(records, tokenizer, token_ids, "auto", max_length=short)
    assert skipped == 1 and len(dataset) == 1
    assert dataset.column_names == ["input_ids", "labels"]
    assert "skipped 1 of 2" in caplog.text


def test_reflection_positions_point_at_each_label(prepared) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer, token_ids, _ = prepared
    example = encode_record(three_passage_record(), tokenizer, token_ids, "auto")
    positions = reflection_positions(example, token_ids)
    assert {group: len(found) for group, found in positions.items()} == {
        Group.RETRIEVE: 3, Group.RELEVANCE: 3, Group.SUPPORT: 3, Group.UTILITY: 1,
    }
    for group, found in positions.items():
        for position in found:
            assert token_ids.group_of_id(example["labels"][position]) is group


def test_read_records_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    good = '{"schema_version": 1, "id": "a", "instruction": "q", "segments": [{"text": "x"}], "utility": null}'
    path.write_text(good + "\n" + '{"schema_version": 1, "id": 3}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"records.jsonl:2: "):
        read_records(path)


def test_split_is_stable_and_by_question() -> None:
    records = training_records()
    train, held_out = split_records(records, 0.3, seed=0)
    again_train, again_held = split_records(list(reversed(records)), 0.3, seed=0)
    assert {r.id for r in held_out} == {r.id for r in again_held}
    assert len(train) + len(held_out) == len(records)
    # a question's records (gold, negatives) never straddle the split
    grouped = [Record(f"q{n}/{kind}", f"question {n}", r.segments, r.utility)
               for n, r in enumerate(records) for kind in ("gold", "easy-0", "hard-0")]
    train, held_out = split_records(grouped, 0.3, seed=0)
    assert held_out and train
    assert not {question_of(r) for r in train} & {question_of(r) for r in held_out}
    with pytest.raises(InputError, match="eval_fraction"):
        split_records(records, 0.999999, seed=0)
