"""The relevance verdict read at ``relevance_threshold``: the branch goes on from the verdict the policy acts on.

A scripted engine keyed by ``passage + verdict``: what follows ``[Relevant]`` and what follows ``[Irrelevant]`` differ,
so each test sees which verdict a branch was continued from, not only which token the trace names.
"""

from __future__ import annotations

import pytest
from runtime_scripts import FixedRetriever, KeyedEngine, Segments, logprobs, passage_key

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, PruningConfig, SkipConfig
from selfrag.inference.engines import Script
from selfrag.inference.engines.base import Generation
from selfrag.inference.runtime import SelfRAG
from selfrag.inference.scoring import relevance_verdict
from selfrag.prompting import encode_prompt
from selfrag.trajectory import Passage

PARIS = Passage("p-paris", "Paris", "Paris is the capital of France.")
LYON = Passage("p-lyon", "Lyon", "Lyon is a city in France.")
Q = "What is the capital of France?"
FULL = {rf.FULLY_SUPPORTED: 0.9, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.05}
NONE = {rf.FULLY_SUPPORTED: 0.05, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.9}
U5 = ("[Utility:5]", {"[Utility:5]": 0.9, "[Utility:1]": 0.1})
U1 = ("[Utility:1]", {"[Utility:1]": 1.0})
#: a passage the model ranks above chance but calls [Irrelevant]: relevance score 0.3
LOW = {rf.RELEVANT: 0.3, rf.IRRELEVANT: 0.7}


@pytest.fixture
def world(reflection_tokenizer, token_ids):  # type: ignore[no-untyped-def]
    """``make(first, after_relevant, after_irrelevant)``: PARIS's first step and the two continuations."""
    segments = Segments(reflection_tokenizer, token_ids)

    def make(first, passages=(PARIS,), **config):  # type: ignore[no-untyped-def]
        key = passage_key(reflection_tokenizer, token_ids, PARIS)
        relevant, irrelevant = token_ids.id(rf.RELEVANT), token_ids.id(rf.IRRELEVANT)
        table = {
            key: first,  # the branch's first step: only its first position is read before the verdict
            key + (relevant,): segments.script("Paris.", (rf.FULLY_SUPPORTED, FULL), U5),
            key + (irrelevant,): segments.script("Lyon.", (rf.NO_SUPPORT, NONE), U1),
        }
        for other in passages:
            if other is not PARIS:
                table[passage_key(reflection_tokenizer, token_ids, other)] = segments.script(
                    (rf.IRRELEVANT, {rf.RELEVANT: 0.05, rf.IRRELEVANT: 0.95}), "Nice.", (rf.NO_SUPPORT, NONE), U1
                )
        engine = KeyedEngine(reflection_tokenizer, token_ids, table, resume=0)
        config.setdefault("mode", "always")
        config.setdefault("max_rounds", 0)
        # these tests read what a branch goes on from after its verdict: a round below the cut is decoded to its end
        # (skip.relevance_gap would stop it there: tests/inference/test_runtime_skip.py)
        config.setdefault("skip", SkipConfig(relevance_gap=None))
        return SelfRAG(engine, FixedRetriever(list(passages)), InferenceConfig(**config)), engine

    return make, segments, token_ids


def whole(segments: Segments, relevance: dict[str, float], token: str) -> Script:
    """A whole branch as the model would generate it, starting with ``token`` (its first position ``relevance``)."""
    after = ("Paris.", (rf.FULLY_SUPPORTED, FULL), U5) if token == rf.RELEVANT else ("Lyon.", (rf.NO_SUPPORT, NONE), U1)
    return segments.script((token, relevance), *after)


def relevance_step(answer):  # type: ignore[no-untyped-def]
    return next(entry for entry in answer.to_json()["trace"] if entry["step"] == "relevance")


@pytest.mark.parametrize("pruning", [True, False])
def test_threshold_below_the_score_continues_from_relevant(world, pruning) -> None:  # type: ignore[no-untyped-def]
    make, segments, _ = world
    rag, engine = make(whole(segments, LOW, rf.IRRELEVANT), relevance_threshold=0.25,
                       pruning=PruningConfig(enabled=pruning, relevance_bound=0.0, margin=1.0))
    answer = rag.answer(Q)
    assert answer.answer == "Paris." and not answer.abstained and [p.id for p in answer.citations] == ["p-paris"]
    entry = relevance_step(answer)
    assert entry["relevance"]["p-paris"] == pytest.approx(0.3)
    assert entry["chosen"] == {"p-paris": rf.RELEVANT} and entry["generated"] == {"p-paris": rf.IRRELEVANT}
    assert entry["overridden"] == ["p-paris"] and entry["relevance_threshold"] == 0.25
    chosen = answer.candidates[answer.chosen]
    assert chosen.score.relevance_token == rf.RELEVANT and f"</paragraph>{rf.RELEVANT}Paris." in chosen.trajectory
    assert chosen.score.relevance == pytest.approx(0.3)  # the score is the model's, the verdict the threshold's
    # pruning: the relevance step, then the rest; without: the whole branch, then again from the overridden verdict
    assert [len(batch) for batch in engine.calls] == [1, 1]


@pytest.mark.parametrize("pruning", [True, False])
def test_default_threshold_keeps_the_models_verdict(world, pruning) -> None:  # type: ignore[no-untyped-def]
    make, segments, _ = world
    rag, engine = make(whole(segments, LOW, rf.IRRELEVANT), pruning=PruningConfig(enabled=pruning, relevance_bound=0.0))
    answer = rag.answer(Q)
    assert answer.abstained and rf.IRRELEVANT in answer.reasons[0]
    entry = relevance_step(answer)
    assert entry["relevance_threshold"] == 0.5 and entry["overridden"] == []
    assert f"</paragraph>{rf.IRRELEVANT}Lyon." in answer.candidates[0].trajectory
    # without pruning nothing was overridden: one call decoded every branch whole
    assert [len(batch) for batch in engine.calls] == ([1, 1] if pruning else [1])


@pytest.mark.parametrize(("threshold", "verdict"), [(0.3, rf.RELEVANT), (0.31, rf.IRRELEVANT)])
def test_threshold_both_sides_and_equality(world, threshold, verdict) -> None:  # type: ignore[no-untyped-def]
    make, segments, _ = world
    relevance = {rf.RELEVANT: 0.3, rf.IRRELEVANT: 0.7}  # exactly 0.3 after renormalising
    rag, _ = make(whole(segments, relevance, rf.IRRELEVANT), relevance_threshold=threshold)
    answer = rag.answer(Q)
    assert relevance_step(answer)["chosen"] == {"p-paris": verdict}
    assert answer.abstained is (verdict == rf.IRRELEVANT)


def test_a_high_threshold_overrides_a_generated_relevant(world) -> None:  # type: ignore[no-untyped-def]
    make, segments, _ = world
    rag, _ = make(whole(segments, {rf.RELEVANT: 0.6, rf.IRRELEVANT: 0.4}, rf.RELEVANT), relevance_threshold=0.7)
    answer = rag.answer(Q)
    assert relevance_step(answer)["overridden"] == ["p-paris"]
    assert answer.abstained and "Lyon." in answer.candidates[0].trajectory  # continued from [Irrelevant]


def test_a_first_token_that_is_no_verdict_becomes_one(world) -> None:  # type: ignore[no-untyped-def]
    """The model wrote text (or stopped) where its verdict belongs; the score is readable, so the verdict is set and
    the branch goes on from it instead of shipping a candidate with no relevance verdict."""
    make, segments, token_ids = world
    first = Script(segments.script("Paris.").token_ids[:1], (logprobs(token_ids, {rf.RELEVANT: 0.8,
                                                                                  rf.IRRELEVANT: 0.2}),))
    rag, _ = make(first)
    answer = rag.answer(Q)
    entry = relevance_step(answer)
    assert entry["generated"] == {"p-paris": None} and entry["chosen"] == {"p-paris": rf.RELEVANT}
    assert entry["overridden"] == ["p-paris"] and answer.answer == "Paris." and not answer.abstained


def test_ask_shows_each_verdict_and_what_the_model_wrote(world) -> None:  # type: ignore[no-untyped-def]
    from selfrag.inference.ask import format_trace

    make, segments, _ = world
    rag, _ = make(whole(segments, LOW, rf.IRRELEVANT), relevance_threshold=0.25)
    lines = format_trace(rag.answer(Q).trace)
    at = lines.index("relevance: at >= 0.25")
    assert lines[at + 1] == f"    p-paris: {rf.RELEVANT} 0.300  (the model wrote {rf.IRRELEVANT})"


def test_an_unreadable_score_leaves_the_generated_token(token_ids) -> None:  # type: ignore[no-untyped-def]
    generated = Generation((token_ids.id(rf.IRRELEVANT),), rf.IRRELEVANT, ({},), "length", 5, 0.0)
    verdict = relevance_verdict(generated, token_ids, 0.1)
    assert verdict.generation is generated and verdict.score is None and verdict.token == rf.IRRELEVANT
    assert not verdict.overridden


def test_an_overridden_verdict_keeps_only_the_first_position(token_ids) -> None:  # type: ignore[no-untyped-def]
    scores = ({token_ids.id(rf.RELEVANT): -0.1, token_ids.id(rf.IRRELEVANT): -2.5}, {7: -1.0})
    generated = Generation((token_ids.id(rf.IRRELEVANT), 7), "[Irrelevant]x", scores, "eos", 5, 0.5, (-3.0, -4.0))
    verdict = relevance_verdict(generated, token_ids, 0.5)
    assert verdict.overridden and verdict.token == rf.RELEVANT
    out = verdict.generation
    assert out.token_ids == (token_ids.id(rf.RELEVANT),) and out.text == rf.RELEVANT
    assert out.score_logprobs == scores[:1] and out.score_bounds == (-3.0,) and out.finish_reason == "length"


def test_pruning_reads_the_score_not_the_verdict(world, reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    """A branch forced to [Relevant] is still pruned on its score when that is below the bound."""
    make, segments, _ = world
    rag, _ = make(whole(segments, {rf.RELEVANT: 0.05, rf.IRRELEVANT: 0.95}, rf.IRRELEVANT), relevance_threshold=0.01,
                  pruning=PruningConfig(relevance_bound=0.1))
    answer = rag.answer(Q)
    assert relevance_step(answer)["chosen"] == {"p-paris": rf.RELEVANT}
    assert answer.candidates[0].pruned and answer.abstained  # pruned after its verdict: no support verdict


def test_calibrated_relevance_threshold_reaches_the_runtime(world) -> None:  # type: ignore[no-untyped-def]
    make, segments, _ = world
    rag, engine = make(whole(segments, LOW, rf.IRRELEVANT))
    engine.calibration = {"relevance_threshold": 0.2}  # type: ignore[attr-defined]  # as HFEngine reads selfrag.json
    calibrated = SelfRAG(engine, rag.retriever, InferenceConfig(mode="always", max_rounds=0))
    assert calibrated.config.relevance_threshold == 0.2 and calibrated.answer(Q).answer == "Paris."
    explicit = SelfRAG(engine, rag.retriever, InferenceConfig(mode="always", max_rounds=0, relevance_threshold=0.4))
    assert explicit.config.relevance_threshold == 0.4 and explicit.answer(Q).abstained  # the user's value wins
    engine.calibration = {"relevance_threshold": True}  # type: ignore[attr-defined]  # not a number: ignored
    assert SelfRAG(engine, rag.retriever, InferenceConfig(mode="always")).config.relevance_threshold == 0.5


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_relevance_threshold_out_of_range_is_refused(value) -> None:  # type: ignore[no-untyped-def]
    problems = InferenceConfig(relevance_threshold=value).validate()
    assert any(p.startswith("relevance_threshold must be in [0, 1]") for p in problems)


def test_long_form_continues_from_the_threshold_verdict(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    segments = Segments(reflection_tokenizer, token_ids)
    key = passage_key(reflection_tokenizer, token_ids, PARIS)
    decide = {rf.RETRIEVAL: 0.9, rf.NO_RETRIEVAL: 0.1}
    table = {
        tuple(encode_prompt(reflection_tokenizer, Q)): segments.script((rf.RETRIEVAL, decide)),
        key: whole(segments, LOW, rf.IRRELEVANT),
        key + (token_ids.id(rf.RELEVANT),): segments.script("Paris.", (rf.FULLY_SUPPORTED, FULL), U5),
        key + (token_ids.id(rf.IRRELEVANT),): segments.script("Lyon.", (rf.NO_SUPPORT, NONE), U1),
    }
    engine = KeyedEngine(reflection_tokenizer, token_ids, table, resume=0)
    config = InferenceConfig(form="long", relevance_threshold=0.25, max_rounds=0)
    answer = SelfRAG(engine, FixedRetriever([PARIS]), config).answer(Q)
    entry = relevance_step(answer)
    assert entry["overridden"] == ["p-paris"] and entry["segment"] == 0
    assert answer.answer == "Paris." and [p.id for p in answer.citations] == ["p-paris"]
