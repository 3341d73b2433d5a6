"""Prompted-critic mode: any instruct model (no reflection ids), one critic call per decision, strict parsing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from runtime_scripts import FixedRetriever

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import GenerationRequest, Script, ScriptedEngine
from selfrag.inference.prompted import PromptedSelfRAG, parse_verdict
from selfrag.prompting import encode_text
from selfrag.trajectory import Passage

PARIS = Passage("p-paris", "Paris", "Paris is the capital of France.")
LYON = Passage("p-lyon", "Lyon", "Lyon is a city in France.")
Q = "What is the capital of France?"


def engine(tokenizer, reply: Callable[[str], str]) -> ScriptedEngine:  # type: ignore[no-untyped-def]
    """A plain instruct model: no reflection ids (token_ids None); ``reply`` maps the prompt text to a reply."""

    def script(request: GenerationRequest) -> Script:
        prompt = tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        return Script(tuple(encode_text(tokenizer, reply(prompt))))

    return ScriptedEngine(tokenizer, None, script)  # type: ignore[arg-type]


def honest(prompt: str) -> str:
    if "Would looking up" in prompt:
        return "Yes."
    if "Does the passage contain" in prompt:
        return "yes" if "Paris is the capital" in prompt else "no"
    if "Answer the question using" in prompt:
        return "Paris."
    if "Is the statement supported" in prompt:
        return "fully"
    if "How useful" in prompt:
        return "5"
    raise AssertionError(prompt)


def test_one_critic_call_per_decision_and_an_answer(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    fake = engine(reflection_tokenizer, honest)
    rag = PromptedSelfRAG(fake, FixedRetriever([PARIS, LYON]), InferenceConfig(top_k=2))
    answer = rag.answer(Q)
    assert answer.answer == "Paris." and answer.citations == (PARIS,) and not answer.low_confidence
    # retrieve? (1) + relevant? (2) + one answer (only Paris is relevant) + supported? (1) + useful? (1)
    assert [len(batch) for batch in fake.calls] == [1, 2, 1, 1, 1]
    assert answer.engine_calls == 5 and answer.to_json()["trace"][-1]["critic_calls"] == 5
    relevance = next(e for e in answer.to_json()["trace"] if e["step"] == "relevance")
    assert relevance["chosen"] == [PARIS.id]
    assert answer.candidates[0].score.total == pytest.approx(1.0 + 1.0 + 0.5 * 1.0)


def test_answer_many_batches_each_phase(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    fake = engine(reflection_tokenizer, honest)
    answers = PromptedSelfRAG(fake, FixedRetriever([PARIS]), InferenceConfig(top_k=1)).answer_many([Q, Q, Q])
    assert [len(batch) for batch in fake.calls] == [3, 3, 3, 3, 3]
    assert all(a.answer == "Paris." for a in answers)


@pytest.mark.parametrize(("reply", "expected"), [
    ("yes", rf.RELEVANT), (" Yes. ", rf.RELEVANT), ("[Irrelevant]", rf.IRRELEVANT), ("yes, it does", None),
    ("Yes it is relevant", None), ("maybe", None), ("", None)])
def test_strict_parsing(reply, expected) -> None:  # type: ignore[no-untyped-def]
    assert parse_verdict(reply, {"yes": rf.RELEVANT, "no": rf.IRRELEVANT}) == expected


def test_malformed_reply_is_retried_then_falls_back(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    def stubborn(prompt: str) -> str:
        if "Is the statement supported" in prompt:
            return "I think so"  # never a valid verdict: retried once, then the fallback (no support)
        if "Does the passage contain" in prompt and "Nothing else." not in prompt:
            return "Sure, it helps"  # malformed once, fine when reminded
        return honest(prompt)

    fake = engine(reflection_tokenizer, stubborn)
    answer = PromptedSelfRAG(fake, FixedRetriever([PARIS]), InferenceConfig(top_k=1, max_rounds=0,
                                                                             on_unsupported="flag")).answer(Q)
    relevance = next(e for e in answer.to_json()["trace"] if e["step"] == "relevance")["critic"][PARIS.id]
    assert relevance["replies"][0].startswith("Sure") and relevance["replies"][1] == "yes"  # cut at max_tokens
    assert relevance["verdict"] == rf.RELEVANT and relevance["retried"] is True
    critique = next(e for e in answer.to_json()["trace"] if e["step"] == "critique")["critic"]["support"]
    assert critique["fallback"] is True and critique["verdict"] == rf.NO_SUPPORT and len(critique["replies"]) == 2
    assert answer.low_confidence and rf.NO_SUPPORT in answer.reasons[0]


def test_unsupported_re_retrieves_then_abstains(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    def doubtful(prompt: str) -> str:
        return "no" if "Is the statement supported" in prompt else honest(prompt)

    retriever = FixedRetriever([PARIS, LYON])
    answer = PromptedSelfRAG(engine(reflection_tokenizer, doubtful), retriever,
                             InferenceConfig(top_k=1, max_rounds=1)).answer(Q)
    assert retriever.queries == [Q, f"{Q} Paris."]
    assert answer.abstained and answer.answer == "The sources do not say." and answer.citations == ()


def test_no_retrieval_answers_alone(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    def alone(prompt: str) -> str:
        return "no" if "Would looking up" in prompt else "Four."

    answer = PromptedSelfRAG(engine(reflection_tokenizer, alone), FixedRetriever([PARIS])).answer("2 + 2?")
    assert answer.answer == "Four." and not answer.retrieved and answer.engine_calls == 2


def test_no_retrieval_without_answer_text_abstains(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """An empty reply (or reflection tokens only) is not an answer: abstain, as the single-pass runtime does."""
    def mute(prompt: str) -> str:
        return "no" if "Would looking up" in prompt else "[Utility:5]"

    answer = PromptedSelfRAG(engine(reflection_tokenizer, mute), FixedRetriever([PARIS])).answer("2 + 2?")
    assert answer.abstained and answer.answer == InferenceConfig().abstain_text and not answer.retrieved
    assert answer.segments == () and answer.to_json()["trace"][-1]["abstain"] == "the reply has no answer text"
    assert answer.reasons == ("abstained: the model wrote no answer without retrieval",)


def test_stream_sends_each_phase_as_it_ends_and_matches_answer(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from selfrag.inference.events import CitationEvent, FinalEvent, SegmentEvent, TraceEvent

    fake = engine(reflection_tokenizer, honest)
    rag = PromptedSelfRAG(fake, FixedRetriever([PARIS, LYON]), InferenceConfig(top_k=2))
    calls_when_sent: list[int] = []
    events = []
    for event in rag.stream(Q):
        events.append(event)
        calls_when_sent.append(len(fake.calls))
    final = events[-1]
    assert isinstance(final, FinalEvent) and sum(isinstance(e, FinalEvent) for e in events) == 1
    assert final.answer == rag.answer(Q)  # the same answer (and trace) as answer()
    assert "".join(e.text for e in events if isinstance(e, SegmentEvent)) == final.answer.answer == "Paris."
    assert [e.passage for e in events if isinstance(e, CitationEvent)] == [PARIS]
    assert [e.entry for e in events if isinstance(e, TraceEvent)] == list(final.answer.trace)
    # incremental: the retrieve decision goes out after the first critic call, before the other four are made
    first_trace = next(i for i, e in enumerate(events) if isinstance(e, TraceEvent))
    assert calls_when_sent[first_trace] == 1 and calls_when_sent[-1] == 5
    assert all(not isinstance(e, SegmentEvent) for e in events[: first_trace + 1])


def test_stream_re_retrieval_sends_no_withdrawn_text(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from selfrag.inference.events import FinalEvent, SegmentEvent

    def unsupported(prompt: str) -> str:
        return "no" if "Is the statement supported" in prompt else honest(prompt)

    rag = PromptedSelfRAG(engine(reflection_tokenizer, unsupported), FixedRetriever([PARIS]), InferenceConfig(top_k=1))
    events = list(rag.stream(Q))
    final = events[-1]
    assert isinstance(final, FinalEvent) and final.answer.abstained
    assert "".join(e.text for e in events if isinstance(e, SegmentEvent)) == final.answer.answer


def test_an_empty_question_is_refused_before_any_call_as_single_pass_does(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from selfrag.errors import InputError

    fake = engine(reflection_tokenizer, honest)
    rag = PromptedSelfRAG(fake, FixedRetriever([PARIS]), InferenceConfig(top_k=1))
    with pytest.raises(InputError, match="question 2: the question is empty; ask something"):
        rag.answer_many([Q, "  "])
    with pytest.raises(InputError, match="the question is empty"):
        list(rag.stream("\n"))
    assert fake.calls == []
