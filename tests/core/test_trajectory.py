from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from selfrag.errors import InputError, TrajectoryParseError
from selfrag.jsonl import read_jsonl
from selfrag.trajectory import (
    Record,
    lex_text,
    parse_trajectory,
    render_segments,
    require_well_formed,
    to_parsed,
    trajectory_pieces,
)

GOLDEN = Path(__file__).parents[1] / "assets" / "golden"


def golden_records() -> list[Record]:
    return [Record.from_json(row) for _, row in read_jsonl(GOLDEN / "records.jsonl")]


def test_rendered_text_matches_golden_file() -> None:
    rendered = "\n".join(f"{r.id}\t{json.dumps(r.render(), ensure_ascii=False)}" for r in golden_records()) + "\n"
    path = GOLDEN / "records.rendered.txt"
    if os.environ.get("SELFRAG_UPDATE_GOLDEN"):
        path.write_text(rendered, encoding="utf-8")
    assert rendered == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("record", golden_records(), ids=lambda r: r.id)
def test_render_parse_round_trip_is_exact(record: Record) -> None:
    text = record.render()
    parsed = parse_trajectory(text) if "</paragraph>[" not in str(record.segments) else None
    if parsed is not None:
        assert parsed.well_formed, parsed.problems
        assert parsed == to_parsed(record)
        assert render_segments(parsed) == text
    # Structure-based pieces always round-trip, even for passages holding literal token strings.
    assert parse_trajectory(trajectory_pieces(to_parsed(record))) == to_parsed(record)
    assert Record.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_passage_with_literal_tokens_stays_text_in_pieces() -> None:
    record = next(r for r in golden_records() if r.id == "q2/three")
    pieces = record.pieces()
    literal = [content for content, is_token in pieces if "[Fully supported]" in content and not is_token]
    assert literal == ["Weather\nIt rained in Paris </paragraph>[Fully supported] all day."]
    # Lexing the rendered *text* would (wrongly) see tokens there: which is why training encodes pieces.
    assert ("[Fully supported]", True) in lex_text(literal[0])


def test_label_provenance_survives_json() -> None:
    record = next(r for r in golden_records() if r.id == "q2/three")
    support = record.segments[0].support
    assert support is not None and (support.labeler, support.model, support.prompt_hash) == ("llm", "teacher-x", "ab12")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("France[Utility:5]", "no retrieve token"),
        ("[Retrieval]<paragraph>x</paragraph>[Relevant]France[Utility:5]", "no support token"),
        ("[Retrieval]<paragraph>x</paragraph>France[Fully supported][Utility:5]", "no relevance token"),
        ("[Retrieval]<paragraph>x</paragraph>[Relevant][Fully supported][Utility:5]", "no text"),
        ("[No Retrieval]France", "no utility token"),
        ("[No Retrieval]France[Utility:5][Relevant]", "after the utility token"),
        ("[No Retrieval]France[Utility:5] more", "text after the utility token"),
        ("[Retrieval]<paragraph>x", "never closed"),
        ("[No Retrieval]France[Fully supported][Utility:5]", "support token without evidence"),
        ("", "no segment"),
    ],
)
def test_malformed_outputs_are_reported(text: str, problem: str) -> None:
    trajectory = parse_trajectory(text)
    assert not trajectory.well_formed
    assert any(problem in p for p in trajectory.problems), trajectory.problems
    if problem != "never closed":  # an unclosed passage is closed when rendered; all else is exact
        assert render_segments(trajectory) == text
    with pytest.raises(TrajectoryParseError):
        require_well_formed(text)


def test_a_segment_without_a_retrieve_token_is_reported_once() -> None:
    trajectory = parse_trajectory("[No Retrieval]The capital is[Fully supported]Madrid.[Utility:4]")
    assert trajectory.problems == ("segment 1 has a support token without evidence",
                                   "segment 2 has no retrieve token")


def test_answer_strips_tokens_and_passages() -> None:
    text = "[Retrieval]<paragraph>T\nbody</paragraph>[Relevant]Denver Broncos[Fully supported][Utility:5]"
    assert parse_trajectory(text).answer == "Denver Broncos"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"schema_version": 9}, "schema_version"),
        ({"schema_version": 1, "id": "a", "instruction": 3}, "instruction"),
        ({"schema_version": 1, "id": "a", "instruction": "q", "segments": []}, "segments"),
        (
            {
                "schema_version": 1,
                "id": "a",
                "instruction": "q",
                "segments": [{"text": "x", "retrieve": {"value": "[Relevant]", "labeler": "gold"}}],
            },
            "segments[0].retrieve.value",
        ),
    ],
)
def test_bad_records_name_the_field(row: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Record.from_json(row)
