"""Long form: segment beam search on a scripted engine (order, evidence carried forward, streaming)."""

from __future__ import annotations

import pytest
from runtime_scripts import FULL, LYON, NICE, NONE, PARIS, RELEVANT, UTILITY_5, keyed_runtime, passage_key

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, LongFormConfig, PruningConfig
from selfrag.inference.events import CitationEvent, FinalEvent, SegmentEvent, TraceEvent
from selfrag.inference.trace import Retrieve, SegmentSupport

QUESTION = "Tell me about French cities."
DECIDE = {rf.RETRIEVAL: 0.9, rf.NO_RETRIEVAL: 0.1}
AGAIN = {rf.RETRIEVAL: 0.8, rf.NO_RETRIEVAL: 0.2}
OFF = PruningConfig(enabled=False)


@pytest.fixture
def build(reflection_tokenizer, token_ids):  # type: ignore[no-untyped-def]
    def make(table, passages=(PARIS, LYON, NICE), **config):  # type: ignore[no-untyped-def]
        config.setdefault("form", "long")
        return keyed_runtime(reflection_tokenizer, token_ids, QUESTION, table, passages, **config)

    return make


PARIS_THEN_RETRIEVE = [
    (rf.RELEVANT, RELEVANT), "Paris is the capital.", (rf.FULLY_SUPPORTED, FULL), (rf.RETRIEVAL, AGAIN)]


def test_second_retrieval_uses_prefix_and_keeps_earlier_evidence(build, reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    rag, engine, retriever = build({
        "prompt": [(rf.RETRIEVAL, DECIDE)],
        PARIS: PARIS_THEN_RETRIEVE,
        LYON: [(rf.RELEVANT, RELEVANT), "Lyon is second.", (rf.FULLY_SUPPORTED, FULL), ("[Utility:5]", UTILITY_5)],
    }, top_k=1, long_form=LongFormConfig(width=1))
    answer = rag.answer(QUESTION)
    assert answer.answer == "Paris is the capital. Lyon is second."
    assert [(s.text, s.passage.id if s.passage else None) for s in answer.segments] == [
        ("Paris is the capital.", PARIS.id), ("Lyon is second.", LYON.id)]
    assert [p.id for p in answer.citations] == [PARIS.id, LYON.id]
    assert retriever.queries[0] == QUESTION
    assert retriever.queries[1] == f"{QUESTION} Paris is the capital."  # the question plus the generated prefix
    lyon_prompt = next(r.prompt_ids for batch in engine.calls for r in batch
                       if r.prompt_ids[-len(passage_key(reflection_tokenizer, token_ids, LYON)):]
                       == passage_key(reflection_tokenizer, token_ids, LYON))
    paris = passage_key(reflection_tokenizer, token_ids, PARIS)
    assert any(lyon_prompt[i:i + len(paris)] == paris for i in range(len(lyon_prompt)))  # earlier evidence stays
    # the utility score is real: the final beam's score includes 0.5 * utility read at [Utility:5]
    utility = (0.9 * 1 + 0.1 * -1) / 1.0
    segment = 1.0 * 0.9 + 1.0 * (0.9 + 0.5 * 0.05)
    final = next(e for e in reversed(answer.to_json()["trace"]) if e["step"] == "beam")["chosen"][0]
    assert final["score"] == pytest.approx(2 * segment + 0.5 * utility)
    assert not answer.low_confidence and not answer.abstained and answer.retrieved


def test_beam_order_keeps_the_best_and_drops_the_rest(build) -> None:  # type: ignore[no-untyped-def]
    weak = {rf.RELEVANT: 0.55, rf.IRRELEVANT: 0.45}
    rag, _, _ = build({
        PARIS: [(rf.RELEVANT, RELEVANT), "Paris.", (rf.FULLY_SUPPORTED, FULL), ("[Utility:5]", UTILITY_5)],
        LYON: [(rf.RELEVANT, weak), "Lyon.", (rf.FULLY_SUPPORTED, FULL), ("[Utility:5]", UTILITY_5)],
        NICE: [(rf.RELEVANT, {rf.RELEVANT: 0.7, rf.IRRELEVANT: 0.3}), "Nice.", (rf.FULLY_SUPPORTED, FULL),
               ("[Utility:5]", UTILITY_5)],
    }, mode="always", top_k=3, long_form=LongFormConfig(width=2), pruning=OFF)
    answer = rag.answer(QUESTION)
    beam = next(e for e in answer.to_json()["trace"] if e["step"] == "beam")
    assert [b["evidence"] for b in beam["chosen"]] == [[PARIS.id], [NICE.id]]  # sorted by score, width 2
    assert [b["evidence"] for b in beam["dropped"]] == [[LYON.id]]
    assert beam["chosen"][0]["score"] > beam["chosen"][1]["score"]
    assert answer.answer == "Paris." and answer.citations == (PARIS,)


def test_continue_to_use_evidence_keeps_the_passage_without_retrieving(build) -> None:  # type: ignore[no-untyped-def]
    keep = {rf.CONTINUE_EVIDENCE: 0.9, rf.RETRIEVAL: 0.01, rf.NO_RETRIEVAL: 0.5}
    first = [(rf.RELEVANT, RELEVANT), "Paris is the capital.", (rf.FULLY_SUPPORTED, FULL)]
    rag, _, retriever = build([
        (PARIS, [*first, (rf.CONTINUE_EVIDENCE, keep)]),
        ((PARIS, (*first, rf.CONTINUE_EVIDENCE), rf.CONTINUE_EVIDENCE), [
            "It has the Louvre.", (rf.PARTIALLY_SUPPORTED, FULL), (rf.NO_RETRIEVAL, {rf.NO_RETRIEVAL: 0.9})]),
        ((PARIS, (*first, rf.CONTINUE_EVIDENCE, "It has the Louvre.", rf.PARTIALLY_SUPPORTED, rf.NO_RETRIEVAL),
          rf.NO_RETRIEVAL), ["That is all.", ("[Utility:4]", {"[Utility:4]": 1.0})]),
    ], mode="always", top_k=1, long_form=LongFormConfig(width=1))
    answer = rag.answer(QUESTION)
    assert [(s.text, s.passage.id if s.passage else None, s.support) for s in answer.segments] == [
        ("Paris is the capital.", PARIS.id, rf.FULLY_SUPPORTED),
        ("It has the Louvre.", PARIS.id, rf.PARTIALLY_SUPPORTED),  # [Continue to Use Evidence] keeps the passage
        ("That is all.", None, None),  # [No Retrieval]: written without evidence, cites nothing
    ]
    assert len(retriever.queries) == 1
    decisions = [e for e in answer.to_json()["trace"] if e["step"] == "decide"]
    assert [d["chosen"] for d in decisions] == [rf.CONTINUE_EVIDENCE, rf.NO_RETRIEVAL]
    assert decisions[0]["probabilities"]["p_retrieve"] == pytest.approx(0.01 / 0.51)
    dropped = rag.__class__(rag.engine, rag.retriever, InferenceConfig(
        form="long", mode="always", top_k=1, long_form=LongFormConfig(width=1), on_partial="drop")).answer(QUESTION)
    assert dropped.answer == "Paris is the capital. That is all."


def test_threshold_at_a_no_retrieval_token_triggers_retrieval(build) -> None:  # type: ignore[no-untyped-def]
    # the model wrote [No Retrieval] but p_retrieve = 0.3 / 0.9 > 0.2: the runtime retrieves there
    rag, _, retriever = build({
        PARIS: [(rf.RELEVANT, RELEVANT), "Paris.", (rf.FULLY_SUPPORTED, FULL),
                (rf.NO_RETRIEVAL, {rf.RETRIEVAL: 0.3, rf.NO_RETRIEVAL: 0.6})],
        LYON: [(rf.RELEVANT, RELEVANT), "Lyon.", (rf.FULLY_SUPPORTED, FULL), ("[Utility:5]", UTILITY_5)],
    }, mode="always", top_k=1, long_form=LongFormConfig(width=1))
    answer = rag.answer(QUESTION)
    assert answer.answer == "Paris. Lyon." and len(retriever.queries) == 2
    decide = next(e for e in answer.to_json()["trace"] if e["step"] == "decide")
    assert decide["first_token"] == rf.NO_RETRIEVAL and decide["chosen"] == rf.RETRIEVAL


def test_stream_sends_segments_as_they_become_final_and_never_a_rejected_one(build) -> None:  # type: ignore[no-untyped-def]
    rag, _, _ = build({
        PARIS: PARIS_THEN_RETRIEVE,
        LYON: [(rf.RELEVANT, RELEVANT), "Lyon is in Italy.", (rf.NO_SUPPORT, NONE), ("[Utility:1]", {"[Utility:1]": 1})
               ],
        NICE: [(rf.RELEVANT, RELEVANT), "Nice is on the coast.", (rf.FULLY_SUPPORTED, FULL),
               ("[Utility:5]", UTILITY_5)],
    }, mode="always", top_k=1, long_form=LongFormConfig(width=1), pruning=OFF)
    events = list(rag.stream(QUESTION))
    texts = [e.text for e in events if isinstance(e, SegmentEvent)]
    assert texts == ["Paris is the capital.", " Nice is on the coast."]
    assert not any("Italy" in text for text in texts)
    final = events[-1]
    assert isinstance(final, FinalEvent) and "".join(texts) == final.answer.answer
    first_segment = next(i for i, e in enumerate(events) if isinstance(e, SegmentEvent))
    retrieves = [i for i, e in enumerate(events) if isinstance(e, TraceEvent) and isinstance(e.entry, Retrieve)]
    second_retrieve = retrieves[1]
    assert first_segment < second_retrieve  # sent before the answer was complete
    assert [e.passage.id for e in events if isinstance(e, CitationEvent)] == [PARIS.id, NICE.id]
    support = [e.entry for e in events if isinstance(e, TraceEvent) and isinstance(e.entry, SegmentSupport)]
    assert support[0].chosen == "re-retrieve" and rf.NO_SUPPORT in support[0].reason


@pytest.mark.parametrize("action", ["abstain", "flag"])
def test_unsupported_after_the_last_round(build, action) -> None:  # type: ignore[no-untyped-def]
    unsupported = [(rf.RELEVANT, RELEVANT), "Made up.", (rf.NO_SUPPORT, NONE), ("[Utility:1]", {"[Utility:1]": 1})]
    rag, _, retriever = build({PARIS: unsupported, LYON: unsupported}, mode="always", top_k=1, max_rounds=1,
                              on_unsupported=action, long_form=LongFormConfig(width=1), pruning=OFF)
    answer = rag.answer(QUESTION)
    assert len(retriever.queries) == 2 and "Made up." in retriever.queries[1]  # rewritten query
    if action == "abstain":
        assert answer.abstained and answer.answer == rag.config.abstain_text and answer.segments == ()
    else:
        assert answer.low_confidence and answer.answer == "Made up." and answer.reasons[0].startswith("flagged")


IRRELEVANT_ONLY = [(rf.IRRELEVANT, {rf.RELEVANT: 0.1, rf.IRRELEVANT: 0.9}), "Off topic.", (rf.NO_SUPPORT, NONE),
                   ("[Utility:1]", {"[Utility:1]": 1})]


@pytest.mark.parametrize("setting", ["no_retrieval", "unsupported"])
def test_every_passage_irrelevant_writes_the_segment_without_retrieval(build, setting) -> None:  # type: ignore[no-untyped-def]
    rag, engine, retriever = build({
        PARIS: IRRELEVANT_ONLY, LYON: IRRELEVANT_ONLY,
        "no_retrieval": ["Two plus two is four.", ("[Utility:5]", UTILITY_5)],
    }, passages=(PARIS, LYON), mode="always", top_k=1, max_rounds=1, on_all_irrelevant=setting,
        long_form=LongFormConfig(width=1), pruning=OFF)
    answer = rag.answer(QUESTION)
    support = [e for e in answer.to_json()["trace"] if e["step"] == "support"]
    if setting == "unsupported":  # as before: re-retrieve, then abstain
        assert len(retriever.queries) == 2 and answer.abstained
        assert [e["chosen"] for e in support] == ["re-retrieve", "abstain"]
        return
    # Paris (round 0) was judged irrelevant and nothing else was retrieved: no second round, the segment is
    # written at once from [No Retrieval], uncited and flagged
    assert len(retriever.queries) == 1
    assert [e["chosen"] for e in support] == ["answer_without_retrieval"]
    assert "all 1 retrieved passages [Irrelevant]" in support[0]["reason"]
    assert answer.answer == "Two plus two is four." and answer.citations == ()
    assert [(s.text, s.passage) for s in answer.segments] == [("Two plus two is four.", None)]
    assert answer.low_confidence and not answer.abstained
    assert any("written without sources" in reason for reason in answer.reasons)
    assert answer.retrieved  # it did retrieve; nothing it found was used


def test_a_relevant_but_unsupported_passage_is_no_reason_to_answer_without_retrieval(build) -> None:  # type: ignore[no-untyped-def]
    unsupported = [(rf.RELEVANT, RELEVANT), "Made up.", (rf.NO_SUPPORT, NONE), ("[Utility:1]", {"[Utility:1]": 1})]
    rag, _, retriever = build({PARIS: unsupported, LYON: IRRELEVANT_ONLY}, passages=(PARIS, LYON), mode="always",
                              top_k=1, max_rounds=1, on_all_irrelevant="no_retrieval",
                              long_form=LongFormConfig(width=1), pruning=OFF)
    answer = rag.answer(QUESTION)
    assert len(retriever.queries) == 2 and answer.abstained  # Paris was relevant: the usual unsupported path
    assert "answer_without_retrieval" not in [e["chosen"] for e in answer.to_json()["trace"] if e["step"] == "support"]


def test_invalid_long_form_settings_are_refused(build) -> None:  # type: ignore[no-untyped-def]
    from selfrag.errors import ConfigError

    with pytest.raises(ConfigError, match="long_form.width"):
        build({}, long_form=LongFormConfig(width=0))



def test_a_segment_after_no_retrieval_writes_text_first(build, reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    """After [No Retrieval] a long-form segment is text, then a stop: verdicts and passage markup are banned and the
    stops (retrieve decisions, <paragraph>, utility) wait one id; the model's own first decision is unconstrained."""
    rag, engine, _ = build({
        PARIS: IRRELEVANT_ONLY,
        "no_retrieval": ["Two plus two is four.", (rf.NO_RETRIEVAL, {rf.NO_RETRIEVAL: 0.9, rf.RETRIEVAL: 0.1})],
        "prompt": [(rf.RETRIEVAL, DECIDE)],
    }, passages=(PARIS,), mode="always", top_k=1, max_rounds=1, on_all_irrelevant="no_retrieval",
        long_form=LongFormConfig(width=1, max_segments=1), pruning=OFF)
    answer = rag.answer(QUESTION)
    assert answer.answer == "Two plus two is four."
    requests = [r for batch in engine.calls for r in batch]
    after = [r for r in requests if r.prompt_ids[-1] == token_ids.id(rf.NO_RETRIEVAL)]
    others = [r for r in requests if r.prompt_ids[-1] != token_ids.id(rf.NO_RETRIEVAL)]
    assert after and others
    assert all(r.min_tokens == 0 and r.banned_token_ids == () for r in others)  # a passage's branch: the model's own
    banned = {reflection_tokenizer.convert_ids_to_tokens(i) for i in after[0].banned_token_ids}
    assert after[0].min_tokens == 1
    assert {rf.RELEVANT, rf.IRRELEVANT, rf.FULLY_SUPPORTED, rf.NO_SUPPORT, rf.PARAGRAPH_CLOSE} <= banned
    assert not banned & {rf.RETRIEVAL, rf.NO_RETRIEVAL, rf.CONTINUE_EVIDENCE, rf.PARAGRAPH_OPEN, "[Utility:5]"}
    # a segment that only repeats the decision is one no engine could decode under these constraints
    with pytest.raises(ValueError, match="before min_tokens=1"):
        engine._check(after[0], 0, token_ids.id(rf.NO_RETRIEVAL))
