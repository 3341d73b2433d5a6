"""Answer forms of ``python -m selfrag.app.distill``: the model's one-sentence reply given the gold answer (kept only
where it holds the gold, cached), the deterministic template reply, and the copied sentence they fall back to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.app.distill import keep_reply, main, replies, reply_prompt, template_reply
from selfrag.corpus import Query
from selfrag.data_gen.cache import CallCache
from selfrag.inference.engines.fake import Script, ScriptedEngine
from selfrag.trajectory import Passage

PASSAGES = {
    "p1": Passage("p1", "France", "France is in Europe. Its capital is Paris, on the Seine."),
    "p2": Passage("p2", "Yuan", "The dynasty began in 1271. It was founded by Kublai Khan."),
}
QUERIES = [
    Query("q1", "What is the capital of France?", ("Paris",), gold_passage_ids=("p1",)),
    Query("q2", "Who founded the Yuan dynasty?", ("Kublai Khan",), gold_passage_ids=("p2",)),
    Query("q3", "Is there an answer?", (), answerable=False),
]


def test_template_reply_states_the_answer_as_a_sentence() -> None:
    assert template_reply("What is the capital of France?", "Paris") == "The capital of France is Paris."
    assert template_reply("who were the Beatles", "a band.") == "The Beatles were a band."
    assert template_reply("When did the war end?", "1945") == "The answer is 1945."


def test_keep_reply_takes_the_first_sentence_holding_the_gold_and_refuses_abstentions() -> None:
    assert keep_reply("The capital of France is Paris. It is big.", ["paris"], "No idea.") == (
        "The capital of France is Paris.")
    assert keep_reply("France is big. Paris is its capital.", ["Paris"], "No idea.") is None  # first sentence only
    assert keep_reply("The sources do not say Paris.", ["Paris"], "The sources do not say.") is None
    assert keep_reply("", ["Paris"], "No idea.") is None
    france = PASSAGES["p1"]
    assert keep_reply("The capital of France is Paris.", ["Paris"], "No idea.", france) == (
        "The capital of France is Paris.")
    assert keep_reply("Paris was founded by aliens in 1809.", ["Paris"], "No idea.", france) is None  # unsupported


def _engine(tokenizer, texts: dict[str, str]) -> ScriptedEngine:  # type: ignore[no-untyped-def]
    """Replies by the question found in the prompt; the eos id ends each."""

    def script(request):  # type: ignore[no-untyped-def]
        prompt = tokenizer.decode(list(request.prompt_ids))
        text = next(reply for question, reply in texts.items() if question in prompt)
        return Script(tuple(tokenizer.encode(text)) + (tokenizer.eos_token_id,))

    return ScriptedEngine(tokenizer, None, script, name="scripted")  # type: ignore[arg-type]


def test_reply_kept_where_it_holds_the_gold_else_the_copied_sentence_and_cached(tiny_tokenizer, tmp_path: Path) -> None:
    engine = _engine(tiny_tokenizer, {"capital of France": "The capital of France is Paris.",
                                      "Yuan dynasty": "I am not sure about that."})
    cache = CallCache(tmp_path / "calls.sqlite")
    rows = replies(QUERIES, PASSAGES, engine, cache)
    assert [(row["id"], row["how"], row["output"]) for row in rows] == [
        ("q1", "reply", "The capital of France is Paris."),
        ("q2", "sentence", "It was founded by Kublai Khan."),
    ]
    assert len(engine.calls) == 1 and len(cache) == 2
    asked = tiny_tokenizer.decode(list(engine.calls[0][0].prompt_ids))
    assert "Correct answer: Paris" in asked and "Its capital is Paris" in asked

    again = _engine(tiny_tokenizer, {})  # every prompt is cached: no decode (its script would raise)
    assert replies(QUERIES, PASSAGES, again, cache) == rows
    assert again.calls == []


def test_reply_prompt_names_question_answer_and_passage() -> None:
    text = reply_prompt("Who?", "Kublai Khan", PASSAGES["p2"])
    assert "Question: Who?" in text and "Correct answer: Kublai Khan" in text and "founded by Kublai Khan" in text
    assert "Passage: (none)" in reply_prompt("Who?", "X", None)


@pytest.mark.parametrize(("form", "expected"), [
    ("template", {"q1": ("The capital of France is Paris.", "template"),
                  "q2": ("The answer is Kublai Khan.", "template")}),
    ("sentence", {"q1": ("Its capital is Paris, on the Seine.", "sentence"),
                  "q2": ("It was founded by Kublai Khan.", "sentence")}),
])
def test_the_command_writes_each_form(tmp_path: Path, form: str, expected: dict[str, tuple[str, str]]) -> None:
    queries, corpus, output = tmp_path / "q.jsonl", tmp_path / "c.jsonl", tmp_path / "answers.jsonl"
    queries.write_text("".join(json.dumps(q.to_json()) + "\n" for q in QUERIES))
    corpus.write_text("".join(json.dumps(p.to_json()) + "\n" for p in PASSAGES.values()))
    assert main([str(queries), str(corpus), str(output), "--split", "all", "--form", form]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert {row["id"]: (row["output"], row["how"]) for row in rows} == expected
