"""A question that cannot fit the model's context, or an empty one, is refused before any decoding."""

from __future__ import annotations

import httpx
import pytest
from runtime_scripts import FixedRetriever
from server_harness import MODEL, ScriptedBackendEngine, serving

from selfrag.errors import InputError
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines.base import context_limit, context_problem
from selfrag.inference.runtime import SelfRAG
from selfrag.prompting import encode_prompt


def limited_engine(tokenizer, ids, limit: int) -> ScriptedBackendEngine:  # type: ignore[no-untyped-def]
    engine = ScriptedBackendEngine(tokenizer, ids)
    engine.max_context = limit  # type: ignore[attr-defined]
    return engine


def test_context_problem_names_the_lengths_and_the_fix() -> None:
    assert context_problem(10, 5, None) is None and context_problem(10, 5, 15) is None
    assert context_problem(12, 5, 15) == (
        "the question is 12 tokens as a prompt; with max_tokens=5 it exceeds the model's context of 15 tokens; "
        "shorten the question (at most 10 prompt tokens) or lower max_tokens"
    )


def test_engines_without_a_known_limit_check_nothing(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    assert context_limit(ScriptedBackendEngine(reflection_tokenizer, token_ids)) is None
    assert context_limit(limited_engine(reflection_tokenizer, token_ids, 64)) == 64


@pytest.mark.parametrize("form", ["short", "long"])
def test_runtime_refuses_an_overlong_or_empty_question_before_decoding(
    reflection_tokenizer, token_ids, form: str  # type: ignore[no-untyped-def]
) -> None:
    engine = limited_engine(reflection_tokenizer, token_ids, 60)
    rag = SelfRAG(engine, FixedRetriever([]), InferenceConfig(max_tokens=20, form=form))
    question = "why " * 50
    prompt = len(encode_prompt(reflection_tokenizer, question, engine.prompt_template))
    with pytest.raises(InputError) as error:
        rag.answer(question)
    assert str(error.value) == (
        f"the question is {prompt} tokens as a prompt; with max_tokens=20 it exceeds the model's context of 60 "
        "tokens; shorten the question (at most 40 prompt tokens) or lower max_tokens"
    )
    with pytest.raises(InputError, match="the question is empty"):
        list(rag.stream("   "))
    if form == "short":
        with pytest.raises(InputError, match="^question 2: the question is"):
            rag.answer_many(["What is 2+2?", question])
    assert engine.calls == []  # nothing was decoded


def test_server_answers_400_context_length_exceeded(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    engine = limited_engine(reflection_tokenizer, token_ids, 60)
    with serving(engine) as live:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "why " * 50}], "max_tokens": 20}
        response = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "messages" and error["code"] == "context_length_exceeded"
        assert error["message"].startswith("the last user message is ") and "context of 60 tokens" in error["message"]
        assert engine.calls == []
