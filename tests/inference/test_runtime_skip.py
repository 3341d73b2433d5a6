"""Rounds not worth their decode (``skip``), on a scripted engine: each skip is a trace entry with its rule and reason,
and what it saves is engine calls; both sides of each rule, and the settings that turn it off."""

from __future__ import annotations

import pytest
from runtime_scripts import FULL, LYON, NICE, NONE, PARIS, RELEVANT, UTILITY_5, keyed_runtime

from selfrag import reflection as rf
from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.inference.config import InferenceConfig, SkipConfig
from selfrag.inference.prompted import PromptedSelfRAG
from selfrag.inference.trace import Retrieve, Skip
from selfrag.trajectory import Passage

PARIS_COPY = Passage("p-paris-copy", "Paris", "Paris  is the capital of France.")  # the same text under another id
Q = "What is the capital of France?"
U5 = ("[Utility:5]", UTILITY_5)


def branch(text: str, relevance=RELEVANT, support=NONE):  # type: ignore[no-untyped-def]
    return [(max(relevance, key=relevance.get), relevance), text, (max(support, key=support.get), support), U5]


@pytest.fixture
def build(reflection_tokenizer, token_ids):  # type: ignore[no-untyped-def]
    def make(table: dict, passages, **config):  # type: ignore[no-untyped-def]
        config.setdefault("mode", "always")
        config.setdefault("top_k", 1)
        return keyed_runtime(reflection_tokenizer, token_ids, Q, table, passages, **config)

    return make


def skips(answer) -> list[Skip]:  # type: ignore[no-untyped-def]
    """The answer's skip entries: every rule's is a typed :class:`Skip`, in the JSON as ``step: skip``."""
    typed = [entry for entry in answer.trace if isinstance(entry, Skip)]
    assert [entry.to_dict() for entry in typed] == [e for e in answer.to_json()["trace"] if e["step"] == "skip"]
    return typed


def chosen(answer, name):  # type: ignore[no-untyped-def]
    return [entry.chosen for entry in answer.trace if entry.step == name]


# -- a rewritten query that repeats an earlier round's ------------------------------------------------------------


@pytest.mark.parametrize("repeated", [True, False])
def test_a_round_whose_query_repeats_an_earlier_one_is_not_run(build, repeated) -> None:  # type: ignore[no-untyped-def]
    """Round 0 and round 1 write the same unsupported text, so round 2's query would be round 1's again."""
    table = {PARIS: branch("Berlin."), LYON: branch("Berlin."), NICE: branch("Rome.")}
    rag, engine, retriever = build(table, (PARIS, LYON, NICE), max_rounds=2, skip=SkipConfig(repeated=repeated))
    answer = rag.answer(Q)
    assert answer.abstained
    if repeated:
        assert retriever.queries == [Q, f"{Q} Berlin."]  # the third search is never made
        [skip] = skips(answer)
        assert skip.rule == "repeated_query" and skip.round == 2 and skip.chosen == "give_up"
        assert "repeats round 1's query" in skip.reason
        assert chosen(answer, "support") == ["re-retrieve", "re-retrieve", "abstain"]
        assert "round 2 was not run" in answer.trace[-1].why
        assert len(engine.calls) == 4  # two rounds of (relevance step + the rest)
    else:  # as before: the same query searched again reaches the next passage
        assert retriever.queries == [Q, f"{Q} Berlin.", f"{Q} Berlin."] and not skips(answer)
        assert [c.passage.id for c in answer.candidates] == [PARIS.id, LYON.id, NICE.id]
        assert len(engine.calls) == 6


# -- passages that repeat one already read ---------------------------------------------------------------------


def test_a_duplicate_passage_is_decoded_once(build) -> None:  # type: ignore[no-untyped-def]
    table = {PARIS: branch("Paris.", support=FULL), LYON: branch("Lyon.")}
    rag, engine, _ = build(table, (PARIS, PARIS_COPY, LYON), top_k=3, max_rounds=0)
    answer = rag.answer(Q)
    [retrieve] = [entry for entry in answer.trace if isinstance(entry, Retrieve)]
    assert retrieve.chosen == (PARIS.id, LYON.id) and retrieve.repeated == (PARIS_COPY.id,)
    assert "1 repeat the text of a passage already read" in retrieve.reason
    assert [c.passage.id for c in answer.candidates] == [PARIS.id, LYON.id]
    assert sum(len(batch) for batch in engine.calls) == 2 + 2  # two branches (relevance step and rest), not three
    assert answer.answer == "Paris."


@pytest.mark.parametrize("repeated", [True, False])
def test_a_round_that_finds_only_repeats_is_not_run(build, repeated) -> None:  # type: ignore[no-untyped-def]
    table = {PARIS: branch("Berlin."), PARIS_COPY: branch("Berlin.")}
    rag, engine, _ = build(table, (PARIS, PARIS_COPY), max_rounds=1, skip=SkipConfig(repeated=repeated))
    answer = rag.answer(Q)
    assert answer.abstained
    if repeated:
        [skip] = skips(answer)
        assert skip.rule == "repeated_passages" and skip.round == 1 and PARIS_COPY.id in skip.reason
        assert len(engine.calls) == 2 and [c.passage.id for c in answer.candidates] == [PARIS.id]
    else:
        assert not skips(answer) and len(engine.calls) == 4
        assert [c.passage.id for c in answer.candidates] == [PARIS.id, PARIS_COPY.id]


# -- a round whose best relevance is far below the cut -----------------------------------------------------------


@pytest.mark.parametrize(
    ("relevance", "gap", "skipped"),
    [(0.45, 0.0, True), (0.45, 0.04, True), (0.45, 0.1, False), (0.5, 0.0, False), (0.45, None, False)],
)
def test_a_round_far_below_the_relevance_cut_stops_after_its_verdicts(build, relevance, gap, skipped) -> None:  # type: ignore[no-untyped-def]
    low = {rf.RELEVANT: relevance, rf.IRRELEVANT: 1 - relevance}
    table = {PARIS: branch("Lyon.", relevance=low), LYON: branch("Nice.", relevance=low)}
    rag, engine, _ = build(table, (PARIS, LYON), top_k=2, max_rounds=0, relevance_threshold=0.5,
                           skip=SkipConfig(relevance_gap=gap))
    answer = rag.answer(Q)
    assert answer.abstained or relevance >= 0.5
    if skipped:
        [skip] = skips(answer)
        assert skip.rule == "relevance_gap" and skip.round == 0
        assert skip.chosen == (PARIS.id, LYON.id)  # the branches pruning had let through
        assert f"best relevance {relevance:.4f} is more than {gap} below relevance_threshold 0.5000" in skip.reason
        assert len(engine.calls) == 1  # the relevance step only
        assert all(c.pruned for c in answer.candidates)
    else:
        assert not skips(answer) and len(engine.calls) == 2  # the relevance step, then the survivors' rest


def test_the_relevance_gap_leaves_flagged_answers_alone(build) -> None:  # type: ignore[no-untyped-def]
    """on_unsupported=flag ships the best unsupported text, so a round below the cut is still written."""
    low = {rf.RELEVANT: 0.2, rf.IRRELEVANT: 0.8}
    rag, engine, _ = build({PARIS: branch("Lyon.", relevance=low)}, (PARIS,), max_rounds=0, on_unsupported="flag",
                           relevance_threshold=0.5, skip=SkipConfig(relevance_gap=0.0))
    answer = rag.answer(Q)
    assert answer.low_confidence and answer.answer == "Lyon." and not skips(answer) and len(engine.calls) == 2


def test_a_skipped_round_then_a_repeated_query_gives_up_with_both_reasons(build) -> None:  # type: ignore[no-untyped-def]
    """Round 0's branches stop at their verdicts: nothing was written, so the rewritten query is the question."""
    low = {rf.RELEVANT: 0.1, rf.IRRELEVANT: 0.9}
    rag, engine, retriever = build({PARIS: branch("Lyon.", relevance=low)}, (PARIS, LYON), max_rounds=2)
    answer = rag.answer(Q)
    assert [entry.rule for entry in skips(answer)] == ["relevance_gap", "repeated_query"]
    assert retriever.queries == [Q] and len(engine.calls) == 1 and answer.abstained


def test_the_prompted_critic_skips_a_repeated_query_too(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The rounds are shared: the prompted critic's re-retrieval obeys skip.repeated."""
    from runtime_scripts import FixedRetriever as Fixed
    from runtime_scripts import critic_engine

    engine = critic_engine(reflection_tokenizer, "no", "Berlin.")
    retriever = Fixed([PARIS, LYON, NICE])
    answer = PromptedSelfRAG(engine, retriever, InferenceConfig(mode="always", top_k=1, max_rounds=2)).answer(Q)
    assert retriever.queries == [Q, f"{Q} Berlin."] and [s.rule for s in skips(answer)] == ["repeated_query"]


def test_skip_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"skip.relevance_gap must be in \[0, 1\], got 1.5; skip.relevance_gap=null"):
        load_config(InferenceConfig, None, ["skip.relevance_gap=1.5"])
    assert load_config(InferenceConfig, None, ["skip.relevance_gap=null"]).skip.relevance_gap is None


def test_every_request_of_a_question_extends_its_prompt_token_for_token(build, reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Every passage branch, its continuation and a later round's branches start with the question's own prompt ids
    (as the decision's prompt is them): the prefix an engine computes once (the hf engine's kept KV, vLLM's prefix
    caching)."""
    from selfrag.prompting import encode_prompt

    table = {PARIS: branch("Berlin."), LYON: branch("Paris.", support=FULL)}
    rag, engine, _ = build(table, (PARIS, LYON), mode="always", max_rounds=1)
    answer = rag.answer(Q)
    assert [c.round for c in answer.candidates] == [0, 1] and not answer.abstained
    prompt = tuple(encode_prompt(reflection_tokenizer, Q))
    requests = [request for batch in engine.calls for request in batch]
    assert len(requests) == 4 and all(request.prompt_ids[: len(prompt)] == prompt for request in requests)


@pytest.mark.parametrize(("answered", "setting", "rounds"),
                         [(0, True, 1), (1, True, 2), (0, False, 2), (None, True, 2), (0, "uncalibrated", 2)])
def test_no_re_retrieval_where_the_calibration_measured_it_never_paid(build, answered, setting, rounds) -> None:  # type: ignore[no-untyped-def]
    """calibrate measures how many dev questions re-retrieval answered (None: an uncalibrated model)."""
    table = {PARIS: branch("Berlin."), LYON: branch("Paris.", support=FULL)}
    rag, engine, retriever = build(table, (PARIS, LYON), max_rounds=1, skip=SkipConfig(unpaid_rounds=bool(setting)),
                                   use_calibration=setting != "uncalibrated")  # calibrate measures it so
    if answered is not None:
        engine.calibration = {"measured": {"re_retrieved": 7, "rescued_by_re_retrieval": answered}}
    answer = rag.answer(Q)
    assert len(retriever.queries) == rounds
    if rounds == 1:
        [skip] = skips(answer)
        assert skip.rule == "unpaid_rounds" and skip.round == 1
        assert "none of the 7 dev questions" in skip.reason
        assert answer.abstained and len(engine.calls) == 2
    else:
        assert answer.answer == "Paris." and not skips(answer)
