"""``answer_form=template``: the gold labeler trains a one-sentence template reply built from the question and the
gold answer (no model) instead of the bare span; answers files still win; a changed form does not resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.corpus import Query, load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.data_gen.answer_forms import template_reply, with_answer_form
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.run import run
from selfrag.errors import ConfigError
from selfrag.runs import RunMismatchError
from selfrag.trajectory import Record


def _config(output: Path, *overrides: str) -> GenerateConfig:
    return load_config(GenerateConfig, None, ["limit=30", "heldout=0", *overrides], passages=str(DEMO_CORPUS),
                       queries=str(DEMO_QUERIES), output=str(output))


def test_template_replies_hold_the_answer() -> None:
    assert template_reply("What is the capital of France?", "Paris") == "The capital of France is Paris."
    assert template_reply("Who was the first king?", "Rollo.") == "The first king was Rollo."
    assert template_reply("How many legs does a spider have?", "eight") == "The answer is eight."
    queries = [Query("a", "Who is he?", ("Bob",)), Query("b", "Who?", ("X",), output="Given."),
               Query("c", "Who?", (), answerable=False)]
    assert [q.output for q in with_answer_form(queries, "template")] == ["He is Bob.", "Given.", None]
    assert with_answer_form(queries, "output") == queries


def test_the_gold_labeler_trains_the_template_reply(tmp_path: Path) -> None:
    result = run(_config(tmp_path / "out", "answer_form=template"))
    by_id = {q.id: q for q in load_queries(DEMO_QUERIES)}
    records = [Record.from_json(json.loads(line))
               for line in result.records_path.read_text().splitlines()]
    gold = [r for r in records if r.meta.get("kind") == "gold"]
    assert gold and result.stats["run"]["answers_templated"] >= len(gold)
    for record in gold:
        query = by_id[str(record.meta["query_id"])]
        assert "".join(s.text for s in record.segments) == template_reply(query.question, query.answers[0])

    with pytest.raises(RunMismatchError, match="answer_form"):  # another form is another data set
        run(_config(tmp_path / "out"))


def test_answer_form_is_for_the_gold_labeler() -> None:
    with pytest.raises(ConfigError, match="answer_form=template is for labeler=gold"):
        load_config(GenerateConfig, None, ["labeler=llm", "answer_form=template", "output=o", "passages=c.jsonl",
                                           "queries=q.jsonl"])
