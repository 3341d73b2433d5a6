"""What ships when the answer is cut by max_tokens or malformed (issue 44, defect 3), on the scripted engine.

Before: an answer cut by ``max_tokens`` before its support verdict came back as an abstention with
``finish_reason: stop``; a malformed answer without retrieval came back unflagged, its reflection tokens stripped
without a space ("capital of Spain isMadrid").
"""

from __future__ import annotations

from test_runtime import PARIS, Scenario, continuation, decision

from selfrag import reflection as rf
from selfrag.inference.engines import Script
from selfrag.inference.server.format import ChunkWriter, completion
from selfrag.prompting import encode_text
from selfrag.trajectory import parse_trajectory

LONG = "Paris is the capital of France and its largest city by far."


def test_an_answer_cut_by_max_tokens_before_its_verdict_is_flagged_with_finish_reason_length(
    reflection_tokenizer, token_ids  # type: ignore[no-untyped-def]
) -> None:
    passages = {PARIS.id: continuation(reflection_tokenizer, token_ids, LONG)}
    scenario = Scenario(reflection_tokenizer, token_ids, passages=passages)
    answer = scenario.rag(mode="always", top_k=1, max_rounds=0, max_tokens=6).answer("q?")
    assert not answer.abstained and answer.low_confidence
    assert answer.answer and LONG.startswith(answer.answer) and answer.answer != LONG
    assert answer.citations == (PARIS,)
    assert len(answer.reasons) == 1 and "cut at max_tokens=6 before its support verdict" in answer.reasons[0]
    assert answer.to_json()["trace"][-1]["step"] == "length" and answer.to_json()["trace"][-1]["chosen"] == "flag"
    body = completion(answer, "m", 3)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["selfrag"]["low_confidence"] and "max_tokens=6" in body["selfrag"]["reasons"][0]
    final = ChunkWriter("m").event(_final(scenario, max_tokens=6))
    assert final["choices"][0]["finish_reason"] == "length"
    # with room for the verdict, the same answer is accepted as before
    whole = scenario.rag(mode="always", top_k=1, max_rounds=0).answer("q?")
    assert whole.answer == LONG and not whole.low_confidence and completion(whole, "m", 3)["choices"][0][
        "finish_reason"] == "stop"


def _final(scenario: Scenario, **config: object):  # type: ignore[no-untyped-def]
    return list(scenario.rag(mode="always", top_k=1, max_rounds=0, **config).stream("q?"))[-1]


def test_an_answer_without_retrieval_cut_by_max_tokens_is_flagged(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    first = decision(reflection_tokenizer, token_ids, 0.1, 0.9, rf.NO_RETRIEVAL, text=LONG)
    answer = Scenario(reflection_tokenizer, token_ids, first).rag(max_tokens=5).answer("q?")
    assert not answer.abstained and answer.low_confidence and LONG.startswith(answer.answer)
    assert any("cut at max_tokens=5" in reason for reason in answer.reasons)
    assert completion(answer, "m", 3)["choices"][0]["finish_reason"] == "length"


def test_a_malformed_answer_without_retrieval_is_flagged_and_keeps_its_word_boundaries(
    reflection_tokenizer, token_ids  # type: ignore[no-untyped-def]
) -> None:
    # "[No Retrieval]The capital of Spain is[Fully supported]Madrid.[Utility:4]": a support verdict without evidence
    tokens = (token_ids.id(rf.NO_RETRIEVAL), *encode_text(reflection_tokenizer, "The capital of Spain is"),
              token_ids.id(rf.FULLY_SUPPORTED), *encode_text(reflection_tokenizer, "Madrid."),
              token_ids.id("[Utility:4]"))
    first = decision(reflection_tokenizer, token_ids, 0.1, 0.9, rf.NO_RETRIEVAL)
    scenario = Scenario(reflection_tokenizer, token_ids, Script(tokens, first.logprobs))
    answer = scenario.rag().answer("What is the capital of Spain?")
    assert answer.answer == "The capital of Spain is Madrid."
    assert answer.low_confidence and not answer.abstained
    assert answer.reasons == ("flagged: the answer is malformed (segment 1 has a support token without evidence; "
                              "segment 2 has no retrieve token)",)
    assert completion(answer, "m", 3)["selfrag"]["reasons"] == list(answer.reasons)
    # a well-formed answer without retrieval is not flagged
    plain = decision(reflection_tokenizer, token_ids, 0.1, 0.9, rf.NO_RETRIEVAL, text="Madrid.")
    answer = Scenario(reflection_tokenizer, token_ids, plain).rag().answer("What is the capital of Spain?")
    assert answer.answer == "Madrid." and not answer.low_confidence and answer.reasons == ()


def test_stripping_tokens_keeps_words_apart_and_adds_no_space_where_one_is() -> None:
    assert parse_trajectory("[No Retrieval]Spain is[Fully supported]Madrid[Utility:4]").answer == "Spain is Madrid"
    assert parse_trajectory("[No Retrieval]Spain is [Fully supported]Madrid[Utility:4]").answer == "Spain is Madrid"
    assert parse_trajectory("[No Retrieval]One.[Retrieval]<paragraph>p</paragraph>[Relevant] Two."
                            "[Fully supported][Utility:4]").answer == "One. Two."
