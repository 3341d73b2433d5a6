"""One long-form segment (inference/segments.py): the decision rule serving and RL share, read by two deciders."""

from __future__ import annotations

import pytest

from selfrag import reflection as rf
from selfrag.inference.engines.base import Generation
from selfrag.inference.segments import SampledDecider, SegmentGrammar, ThresholdDecider, decide


def _generation(token_ids, written: str, p_retrieval: float | None) -> Generation:  # type: ignore[no-untyped-def]
    import math

    logprobs = {} if p_retrieval is None else {token_ids.id(rf.RETRIEVAL): math.log(p_retrieval),
                                               token_ids.id(rf.NO_RETRIEVAL): math.log(1 - p_retrieval)}
    return Generation(token_ids=(token_ids.id(written),), text=written, score_logprobs=(logprobs,),
                      finish_reason="stop", prompt_tokens=1, seconds=0.0)


@pytest.mark.parametrize(("written", "p_retrieval", "threshold_wants", "sampled_wants"), [
    (rf.RETRIEVAL, 0.9, True, True),
    (rf.RETRIEVAL, 0.1, False, True),  # serving reads the distribution; RL keeps the sampled choice
    (rf.NO_RETRIEVAL, 0.9, True, False),
    (rf.PARAGRAPH_OPEN, None, True, True),  # no log-prob for either retrieve token: the written token decides
    (rf.CONTINUE_EVIDENCE, None, False, False),
])
def test_the_deciders_read_the_same_decision_two_ways(token_ids, written: str, p_retrieval: float | None,
                                                       threshold_wants: bool, sampled_wants: bool) -> None:
    generation = _generation(token_ids, written, p_retrieval)
    assert ThresholdDecider(token_ids, 0.5).wants(written, generation)[0] is threshold_wants
    assert SampledDecider().wants(written, generation) == (sampled_wants, None)


def test_one_rule_after_the_decider() -> None:
    rule = {"retrievals": 0, "depth": 2, "holds_passage": False}
    assert decide(rf.RETRIEVAL, True, mode="adaptive", **rule) == rf.RETRIEVAL
    assert decide(rf.RETRIEVAL, True, mode="never", **rule) == rf.NO_RETRIEVAL
    assert decide(rf.RETRIEVAL, True, mode="adaptive", **{**rule, "retrievals": 2}) == rf.NO_RETRIEVAL  # depth
    assert decide(rf.PARAGRAPH_OPEN, False, mode="always", **{**rule, "retrievals": 2}) == rf.RETRIEVAL
    assert decide(rf.CONTINUE_EVIDENCE, False, mode="adaptive", **rule) == rf.NO_RETRIEVAL  # nothing to continue
    assert decide(rf.CONTINUE_EVIDENCE, False, mode="adaptive", **{**rule, "holds_passage": True}) == \
        rf.CONTINUE_EVIDENCE


def test_a_segment_is_read_into_body_stop_text_and_end(reflection_tokenizer, token_ids) -> None:
    grammar = SegmentGrammar(token_ids, segment_tokens=8)
    text = tuple(reflection_tokenizer.encode(" the cat", add_special_tokens=False))
    decode = reflection_tokenizer.decode
    utility = token_ids.id(rf.UTILITY_TOKENS[4])
    def generation(ids: tuple[int, ...], finish: str) -> Generation:
        return Generation(ids, "", (), finish, 1, 0.0)  # type: ignore[arg-type]

    read = grammar.read(generation(text + (utility,), "stop"), decode)
    assert (read.body, read.stop, read.text, read.end) == (text, utility, "the cat", "utility")
    read = grammar.read(generation(text + (token_ids.id(rf.RETRIEVAL),), "stop"), decode)
    assert read.end is None and read.body == text  # a decision follows
    assert grammar.read(generation(text, "length"), decode).end == "length"
    request = grammar.request((1, token_ids.id(rf.NO_RETRIEVAL)))
    assert request.min_tokens == 1 and token_ids.id(rf.FULLY_SUPPORTED) in request.banned_token_ids
    assert grammar.start("always") == (token_ids.id(rf.RETRIEVAL),) and grammar.start("adaptive") == ()
