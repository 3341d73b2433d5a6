"""Short form policy on a scripted engine: the trace contract cases, re-retrieval, pruning, ties, closed sets."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_scripts import FULL, LYON, NICE, NONE, PARIS, RELEVANT, UTILITY_5, Segments, keyed_runtime

from selfrag import reflection as rf
from selfrag.inference import finish, policy
from selfrag.inference.config import InferenceConfig, PruningConfig, ScoreWeights
from selfrag.inference.events import FinalEvent, SegmentEvent

Q = "What is the capital of France?"
IRR = {rf.RELEVANT: 0.1, rf.IRRELEVANT: 0.9}
PART = {rf.FULLY_SUPPORTED: 0.2, rf.PARTIALLY_SUPPORTED: 0.7, rf.NO_SUPPORT: 0.1}
U5 = ("[Utility:5]", UTILITY_5)
U1 = ("[Utility:1]", {"[Utility:1]": 1.0})
OFF = PruningConfig(enabled=False)


def seg(text: str, relevance=RELEVANT, support=FULL, token=None, utility=U5):  # type: ignore[no-untyped-def]
    """``[Relevant|Irrelevant] text [support] [Utility:k]`` (argmax tokens unless ``token`` is given)."""
    rel = max(relevance, key=relevance.get)
    steps: list = [(rel, relevance), text]
    if support is not None:
        steps.append((token or max(support, key=support.get), support))
    if utility is not None:
        steps.append(utility)
    return steps


@pytest.fixture
def build(reflection_tokenizer, token_ids):  # type: ignore[no-untyped-def]
    def make(table: dict, passages=(PARIS, LYON, NICE), **config):  # type: ignore[no-untyped-def]
        config.setdefault("mode", "always")
        return keyed_runtime(reflection_tokenizer, token_ids, Q, table, passages, **config)

    return make


def step(answer, name):  # type: ignore[no-untyped-def]
    return [entry for entry in answer.to_json()["trace"] if entry["step"] == name]


# -- the four trace-contract cases of the issue --------------------------------------------------------------


@pytest.mark.parametrize("action", ["abstain", "flag"])
def test_irrelevant_but_fully_supported_best_is_unsupported(build, action) -> None:  # type: ignore[no-untyped-def]
    rag, _, _ = build({PARIS: seg("Paris.", relevance=IRR)}, passages=[PARIS], max_rounds=0, on_unsupported=action)
    answer = rag.answer(Q)
    support = step(answer, "support")[-1]
    assert support["chosen"] == action and rf.IRRELEVANT in support["reason"]
    if action == "flag":
        # the text came from the passage the model rejected: it is cited (issue 56: it used to ship uncited), its
        # segment carries the [Irrelevant] verdict and the reason says so
        assert answer.low_confidence and answer.answer == "Paris." and rf.IRRELEVANT in answer.reasons[0]
        assert answer.citations == (PARIS,)
        assert answer.segments[0].passage == PARIS and answer.segments[0].relevance == rf.IRRELEVANT
        from selfrag.inference.ask import format_answer

        assert f"[1] {PARIS.id} ({PARIS.title})   (the model judged it {rf.IRRELEVANT})" in format_answer(answer)
    else:
        assert answer.abstained and answer.answer == rag.config.abstain_text and answer.citations == ()


def test_no_retrieval_answer_cut_by_a_mid_answer_retrieval_is_flagged(build) -> None:  # type: ignore[no-untyped-def]
    decision = [(rf.NO_RETRIEVAL, {rf.NO_RETRIEVAL: 0.95, rf.RETRIEVAL: 0.05}), "It is", (rf.RETRIEVAL, {})]
    rag, engine, _ = build({"prompt": decision}, mode="adaptive")
    answer = rag.answer(Q)
    [generate] = step(answer, "generate")
    assert "truncated" in generate
    assert not answer.retrieved and answer.answer == "It is"
    assert answer.low_confidence and answer.reasons[0].startswith("truncated")
    assert len(engine.calls) == 1


@pytest.mark.parametrize("pruning", [PruningConfig(), OFF])
def test_a_branch_can_never_write_evidence(build, token_ids, pruning) -> None:  # type: ignore[no-untyped-def]
    """A passage branch holds its evidence: ``[Retrieval]`` and ``<paragraph>`` are held off in every one of its
    decodes (not stop ids, which cut it before its verdicts), so it can neither invent a passage nor ask for one."""
    rag, engine, _ = build({PARIS: seg("Paris.")}, passages=[PARIS], max_rounds=0, pruning=pruning)
    assert rag.answer(Q).answer == "Paris."
    evidence = {token_ids.id(rf.RETRIEVAL), token_ids.id(rf.PARAGRAPH_OPEN)}
    requests = [r for call in engine.calls for r in call]
    assert requests and all(evidence <= set(r.banned_token_ids) and not evidence & set(r.stop_token_ids)
                            for r in requests)
    invented = seg("Paris.", utility=None) + [(rf.PARAGRAPH_OPEN, {}), "Fake fact."]
    rag, _, _ = build({PARIS: invented}, passages=[PARIS], max_rounds=0, pruning=pruning)
    with pytest.raises(ValueError, match="banned id"):  # a script that writes it anyway is one no engine would give
        rag.answer(Q)


def test_a_missing_verdict_ranks_below_an_honest_utility_1(build, reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    strong = {rf.RELEVANT: 0.99, rf.IRRELEVANT: 0.01}
    honest = seg("Honest.", relevance=strong, utility=U1)
    length = len(Segments(reflection_tokenizer, token_ids).script(*honest).token_ids)
    rag, _, _ = build({PARIS: seg("Cut", relevance=strong, utility=None) + [" and more text" * 10], LYON: honest},
                      top_k=2, max_tokens=length, pruning=OFF)
    answer = rag.answer(Q)
    [rank] = step(answer, "rank")
    paris, lyon = rank["candidates"]
    assert paris["score"] > lyon["score"]  # the sum alone would pick the cut-off candidate
    assert paris["missing"] == ["utility"] and not paris["complete"] and lyon["complete"]
    assert rank["chosen"] == LYON.id and answer.answer == "Honest."


def test_a_candidate_the_policy_would_not_ship_ranks_below_one_it_would(build) -> None:  # type: ignore[no-untyped-def]
    """Ranked by the combined score alone, a branch judged [Irrelevant] (raw relevance 0.45, full support,
    [Utility:5]) beat a [Relevant], partially supported one; the policy never ships the former, so the question was
    abstained with a shippable answer in hand (seen in the CPU model's HotpotQA traces)."""
    weak = {rf.RELEVANT: 0.45, rf.IRRELEVANT: 0.55}
    rag, _, _ = build({PARIS: seg("Paris.", relevance=weak), LYON: seg("Lyon.", support=PART, utility=U1)},
                      passages=[PARIS, LYON], top_k=2, max_rounds=0, pruning=OFF)
    answer = rag.answer(Q)
    [rank] = step(answer, "rank")
    paris, lyon = rank["candidates"]
    assert paris["score"] > lyon["score"] and paris["complete"] and lyon["complete"]  # the sum alone picks Paris
    assert rank["chosen"] == LYON.id and answer.answer == "Lyon." and not answer.abstained
    refused = f"the policy would not ship it (the model judged its own passage {rf.IRRELEVANT}"
    assert paris["rejected"].startswith(refused)
    assert f"{PARIS.id} scored higher" in rank["reason"] and "would not ship it" in rank["reason"]
    assert "rejected" not in lyon and step(answer, "support")[-1]["chosen"] == "accept"


def test_a_shippable_candidate_missing_its_utility_outranks_a_complete_refused_one(build) -> None:  # type: ignore[no-untyped-def]
    """The rank reason says why an incomplete candidate won: every complete one is refused (not "none is complete")."""
    weak = {rf.RELEVANT: 0.45, rf.IRRELEVANT: 0.55}
    rag, _, _ = build({PARIS: seg("Paris.", relevance=weak), LYON: seg("Lyon.", utility=None) + [" and more" * 10]},
                      passages=[PARIS, LYON], top_k=2, max_rounds=0, pruning=OFF, max_tokens=12)
    answer = rag.answer(Q)
    [rank] = step(answer, "rank")
    paris, lyon = rank["candidates"]
    assert paris["complete"] and not lyon["complete"] and rank["chosen"] == LYON.id
    assert "every complete candidate is one the policy would not ship" in rank["reason"]
    assert "none is complete" not in rank["reason"]


# -- ranking details --------------------------------------------------------------------------------------


def test_a_tie_keeps_retrieval_order_and_is_traced(build) -> None:  # type: ignore[no-untyped-def]
    # the paper's ranking (no retrieval term, which would part the two by their rank)
    rag, _, _ = build({PARIS: seg("Same."), LYON: seg("Same.")}, top_k=2, weights=ScoreWeights(retrieval=0.0))
    answer = rag.answer(Q)
    [rank] = step(answer, "rank")
    assert rank["tie"] == [PARIS.id, LYON.id] and rank["chosen"] == PARIS.id and "tie" in rank["reason"]
    assert answer.citations == (PARIS,)


def test_a_reflection_token_absent_from_the_logprobs_counts_as_probability_zero(build) -> None:  # type: ignore[no-untyped-def]
    only_relevant = {rf.RELEVANT: 0.3}  # [Irrelevant] not reported (outside the backend's top-k)
    no_support_probs = [(rf.RELEVANT, only_relevant), "Paris.", (rf.FULLY_SUPPORTED, {rf.RELEVANT: 0.5}), U5]
    rag, _, _ = build({PARIS: no_support_probs}, passages=[PARIS], max_rounds=0, on_unsupported="flag")
    answer = rag.answer(Q)
    [candidate] = step(answer, "rank")[0]["candidates"]
    assert candidate["components"]["relevance"] == pytest.approx(1.0)
    assert candidate["components"]["support"] is None and candidate["missing"] == ["support"]
    assert candidate["tokens"]["support"] == rf.FULLY_SUPPORTED
    assert not answer.low_confidence  # the generated token is the verdict; the missing score only lowers rank


# -- re-retrieval ------------------------------------------------------------------------------------------


def test_re_retrieve_then_success(build) -> None:  # type: ignore[no-untyped-def]
    rag, engine, retriever = build({PARIS: seg("Berlin.", support=NONE), LYON: seg("Paris.")}, top_k=1)
    answer = rag.answer(Q)
    assert retriever.queries == [Q, f"{Q} Berlin."]  # the question plus what the model generated
    assert [e["chosen"] for e in step(answer, "support")] == ["re-retrieve", "accept"]
    assert [e["chosen"] for e in step(answer, "retrieve")] == [[PARIS.id], [LYON.id]]  # only untried passages
    assert answer.answer == "Paris." and answer.citations == (LYON,) and not answer.low_confidence
    assert [c.round for c in answer.candidates] == [0, 1]
    assert answer.engine_calls == len(engine.calls) == 4  # (relevance step + rest) per round


@pytest.mark.parametrize("action", ["abstain", "flag"])
def test_re_retrieve_then_give_up(build, action) -> None:  # type: ignore[no-untyped-def]
    rag, _, retriever = build({PARIS: seg("Berlin.", support=NONE), LYON: seg("Rome.", support=NONE, utility=U1)},
                              top_k=1, max_rounds=1, on_unsupported=action)
    answer = rag.answer(Q)
    assert len(retriever.queries) == 2
    assert [e["chosen"] for e in step(answer, "support")] == ["re-retrieve", "rounds exhausted", action]
    assert step(answer, "support")[-1]["passage_id"] == PARIS.id  # the one used, named in the trace
    if action == "abstain":
        assert answer.abstained and answer.answer == rag.config.abstain_text and answer.citations == ()
    else:
        assert answer.low_confidence and answer.answer == "Berlin."  # the best of every round
        assert answer.reasons == (f"flagged: the model judged the best continuation {rf.NO_SUPPORT}",)


def test_re_retrieve_stops_when_nothing_new_is_found(build) -> None:  # type: ignore[no-untyped-def]
    rag, _, _ = build({PARIS: seg("Berlin.", support=NONE)}, passages=[PARIS], top_k=1, on_unsupported="flag")
    answer = rag.answer(Q)
    assert step(answer, "retrieve")[-1]["reason"] == "the rewritten query found no passage not tried yet"
    assert answer.low_confidence and "no new passage" in answer.reasons[0]


@pytest.mark.parametrize(("mode", "expected"), [("keep", "Paris."), ("rewrite", "Paris. (only partly supported by "
                                                 "the source)"), ("drop", "The sources do not say.")])
def test_partially_supported_sentence(build, mode, expected) -> None:  # type: ignore[no-untyped-def]
    rag, _, _ = build({PARIS: seg("Paris.", support=PART)}, passages=[PARIS], on_partial=mode)
    answer = rag.answer(Q)
    assert answer.answer == expected
    assert answer.abstained is (mode == "drop")


# -- every passage irrelevant --------------------------------------------------------------------------------

ALONE = [(rf.NO_RETRIEVAL, {rf.NO_RETRIEVAL: 0.9}), "Paris alone.", U5]  # prompt + [No Retrieval] -> this


def test_all_irrelevant_with_flag_never_abstains_behind_a_flag_step(build) -> None:  # type: ignore[no-untyped-def]
    """on_unsupported=flag, every passage [Irrelevant]: pruning stops the branches after their verdict, so no candidate
    has text. The answer used to abstain (low_confidence false) while the trace's last step said "flag"; now the trace
    says abstain and why. Where a branch has text, that one is flagged and shipped, citing the passage it came from
    with the model's [Irrelevant] verdict."""
    low = {rf.RELEVANT: 0.05, rf.IRRELEVANT: 0.95}  # below pruning's relevance_bound 0.1
    table = {PARIS: seg("Lyon.", relevance=low), LYON: seg("Nice.", relevance=low)}
    rag, _, _ = build(table, passages=[PARIS, LYON], on_unsupported="flag", max_rounds=0)
    answer = rag.answer(Q)
    assert all(c.pruned for c in answer.candidates)
    last = answer.to_json()["trace"][-1]
    assert answer.abstained and not answer.low_confidence
    assert last["chosen"] == "abstain" and "no candidate wrote answer text" in last["why"]
    assert "on_all_irrelevant=no_retrieval" in last["why"]
    assert not any(entry.get("chosen") == "flag" for entry in answer.to_json()["trace"])
    rag, _, _ = build(table, passages=[PARIS, LYON], on_unsupported="flag", max_rounds=0, pruning=OFF)
    flagged = rag.answer(Q)
    assert flagged.to_json()["trace"][-1]["chosen"] == "flag" and flagged.low_confidence and not flagged.abstained
    assert flagged.answer == "Lyon." and flagged.citations == (PARIS,)
    assert flagged.segments[0].relevance == rf.IRRELEVANT


def test_flag_ships_the_best_candidate_that_has_text(build) -> None:  # type: ignore[no-untyped-def]
    """A pruned branch (no text) may outrank the one with text; flag ships the best one it can ship."""
    table = {PARIS: seg("Berlin.", relevance=IRR, support=NONE), LYON: seg("Nice.", relevance=RELEVANT, support=NONE)}
    rag, _, _ = build(table, passages=[PARIS, LYON], on_unsupported="flag", max_rounds=0)
    answer = rag.answer(Q)
    assert answer.to_json()["trace"][-1]["chosen"] == "flag" and answer.answer == "Nice." and answer.low_confidence


def test_all_irrelevant_answers_without_passages_when_configured(build) -> None:  # type: ignore[no-untyped-def]
    table = {"prompt": ALONE, PARIS: seg("Lyon.", relevance=IRR), LYON: seg("Nice.", relevance=IRR)}
    rag, engine, retriever = build(table, passages=[PARIS, LYON], on_all_irrelevant="no_retrieval")
    answer = rag.answer(Q)
    assert answer.answer == "Paris alone." and not answer.abstained and answer.low_confidence
    assert answer.citations == () and answer.retrieved and retriever.queries == [Q]  # no re-retrieval round
    assert answer.reasons == (f"flagged: the model judged all 2 retrieved passages {rf.IRRELEVANT}; answered "
                              "without sources",)
    [support] = step(answer, "support")
    assert support["chosen"] == "answer_without_retrieval" and "on_all_irrelevant=no_retrieval" in support["why"]
    assert step(answer, "generate")[0]["chosen"] == "answer_without_retrieval"
    assert len(answer.candidates) == 3 and answer.chosen == 2 and answer.candidates[2].passage is None
    # the relevance step (both verdicts below the cut: not decoded further, skip.relevance_gap), the answer without
    # passages
    assert answer.engine_calls == len(engine.calls) == 2
    events = list(rag.stream(Q))
    assert [e.text for e in events if isinstance(e, SegmentEvent)] == ["Paris alone."]
    assert events[-1].answer.low_confidence


def test_all_irrelevant_by_default_is_unsupported(build) -> None:  # type: ignore[no-untyped-def]
    table = {"prompt": ALONE, PARIS: seg("Lyon.", relevance=IRR), LYON: seg("Nice.", relevance=IRR)}
    rag, _, retriever = build(table, passages=[PARIS, LYON], top_k=1, max_rounds=1)
    answer = rag.answer(Q)
    assert answer.abstained and not step(answer, "generate")
    # round 0 stopped at its verdict, so the rewritten query is the question again: not searched twice (skip.repeated)
    assert retriever.queries == [Q] and [e["rule"] for e in step(answer, "skip")] == ["relevance_gap", "repeated_query"]


def test_a_relevant_passage_in_an_earlier_round_means_no_fallback(build) -> None:  # type: ignore[no-untyped-def]
    """Round 0's passage was relevant but did not support the answer; round 1's is irrelevant: the corpus is not
    useless for this question, so the policy abstains instead of answering without sources."""
    table = {"prompt": ALONE, PARIS: seg("Berlin.", support=NONE), LYON: seg("Nice.", relevance=IRR)}
    rag, _, _ = build(table, passages=[PARIS, LYON], top_k=1, max_rounds=1, on_all_irrelevant="no_retrieval")
    answer = rag.answer(Q)
    assert answer.abstained and [e["chosen"] for e in step(answer, "support")][-1] == "abstain"


def test_on_all_irrelevant_is_validated() -> None:
    problems = InferenceConfig(on_all_irrelevant="answer").validate()  # type: ignore[arg-type]
    assert problems == ["on_all_irrelevant must be one of ['unsupported', 'no_retrieval'], got 'answer'"]


# -- pruning -----------------------------------------------------------------------------------------------


def test_pruning_stops_weak_branches_after_their_relevance_token(build) -> None:  # type: ignore[no-untyped-def]
    table = {PARIS: seg("Paris.", relevance={rf.RELEVANT: 0.95, rf.IRRELEVANT: 0.05}),
             LYON: seg("Lyon.", relevance={rf.RELEVANT: 0.3, rf.IRRELEVANT: 0.7}),  # 0.65 behind the best
             NICE: seg("Nice.", relevance={rf.RELEVANT: 0.05, rf.IRRELEVANT: 0.95})}  # below the bound
    rag, engine, _ = build(table, top_k=3)
    answer = rag.answer(Q)
    assert [len(batch) for batch in engine.calls] == [3, 1]
    assert [r.max_tokens for r in engine.calls[0]] == [1, 1, 1]
    [prune] = step(answer, "prune")
    assert prune["chosen"] == [LYON.id, NICE.id]
    assert [c.pruned for c in answer.candidates] == [False, True, True]
    assert answer.answer == "Paris."
    full = build(table, top_k=3, pruning=OFF)[0].answer(Q)
    assert answer.generated_tokens < full.generated_tokens and not step(full, "prune")


def test_pruning_bound_is_configurable(build) -> None:  # type: ignore[no-untyped-def]
    table = {PARIS: seg("Paris."), LYON: seg("Lyon.", relevance={rf.RELEVANT: 0.6, rf.IRRELEVANT: 0.4})}
    rag, _, _ = build(table, top_k=2, pruning=PruningConfig(relevance_bound=0.7, margin=1.0))
    assert step(rag.answer(Q), "prune")[0]["chosen"] == [LYON.id]
    rag, _, _ = build(table, top_k=2, pruning=PruningConfig(relevance_bound=0.5, margin=1.0))
    assert step(rag.answer(Q), "prune")[0]["chosen"] == []


# -- closed set ---------------------------------------------------------------------------------------------


def test_closed_set_sums_scores_per_normalised_answer(build) -> None:  # type: ignore[no-untyped-def]
    rag, _, _ = build({PARIS: seg("True."), LYON: seg("false", relevance={rf.RELEVANT: 0.95, rf.IRRELEVANT: 0.05}),
                       NICE: seg("TRUE", support=PART)}, top_k=3, pruning=OFF, weights=ScoreWeights(retrieval=0.0))
    answer = rag.answer(Q, choices=["true", "false"])
    [vote] = step(answer, "vote")
    ranked = [c["score"] for c in vote["candidates"]]
    assert ranked[1] > ranked[0] > ranked[2]  # "false" is the single best candidate ...
    assert vote["totals"]["true"] == pytest.approx(ranked[0] + ranked[2])  # ... but "true" has more in sum
    assert answer.answer == "true" and vote["chosen"] == PARIS.id


# -- streaming and the contract as a property ------------------------------------------------------------------


def test_short_form_stream_never_sends_the_rejected_round(build) -> None:  # type: ignore[no-untyped-def]
    rag, _, _ = build({PARIS: seg("Berlin.", support=NONE), LYON: seg("Paris.")}, top_k=1)
    events = list(rag.stream(Q))
    texts = [e.text for e in events if isinstance(e, SegmentEvent)]
    assert texts == ["Paris."] and isinstance(events[-1], FinalEvent)


VERDICTS = st.fixed_dictionaries({
    "relevance": st.sampled_from([RELEVANT, IRR]),
    "support": st.sampled_from([FULL, PART, NONE, None]),
    "utility": st.sampled_from([U5, U1, None]),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(verdicts=st.lists(VERDICTS, min_size=3, max_size=3), action=st.sampled_from(["abstain", "flag"]),
       rounds=st.integers(0, 1), partial=st.sampled_from(["keep", "rewrite", "drop"]), pruning=st.booleans(),
       irrelevant=st.sampled_from(["unsupported", "no_retrieval"]))
def test_trace_and_answer_agree(build, verdicts, action, rounds, partial, pruning, irrelevant) -> None:  # type: ignore[no-untyped-def]
    passages = (PARIS, LYON, NICE)
    table = {p: seg(f"{p.title} says {i}.", **v) for i, (p, v) in enumerate(zip(passages, verdicts, strict=True))}
    table["prompt"] = ALONE
    rag, _, _ = build(table, top_k=1 if rounds else 3, max_rounds=rounds, on_unsupported=action, on_partial=partial,
                      pruning=PruningConfig(enabled=pruning), on_all_irrelevant=irrelevant)
    events = list(rag.stream(Q))
    answer = events[-1].answer
    assert "".join(e.text for e in events if isinstance(e, SegmentEvent)) == answer.answer
    last = step(answer, "support")[-1]
    chosen = answer.candidates[answer.chosen]
    tried = [c for c in answer.candidates if c.passage is not None]
    if irrelevant == "no_retrieval" and all(c.score.relevance_token == rf.IRRELEVANT for c in tried):
        assert last["chosen"] == "answer_without_retrieval" and chosen.passage is None
        assert answer.answer == "Paris alone." and answer.low_confidence and answer.citations == ()
        return
    assert last["chosen"] != "answer_without_retrieval"
    assert last["passage_id"] == chosen.passage.id
    supported, _ = policy.judge(chosen, rag.config)
    cut = not supported and finish.cut_before_support(chosen)  # max_tokens ended it before its verdict: flagged
    if action == "flag" and last["chosen"] == "abstain":  # nothing to flag: no candidate has text to ship
        assert "no candidate wrote answer text" in last["why"]
        assert not any(policy.shipped_segments(c, rag.config)[0] for c in answer.candidates)
    else:
        # the support step records what ships: a cut answer is flagged there, not abstained and flagged later
        assert last["chosen"] == ("accept" if supported else "flag" if cut else action)
    assert bool(step(answer, "length")) is cut
    # the trace is a contract: a step that abstains means the answer abstained
    if any(entry["chosen"] == "abstain" for entry in answer.to_json()["trace"]):
        assert answer.abstained
    if last["chosen"] == "abstain" or not answer.segments:
        assert answer.abstained and answer.answer == rag.config.abstain_text and answer.citations == ()
        return
    assert not answer.abstained
    assert answer.low_confidence is (not supported or chosen.truncated is not None) or bool(step(answer, "partial"))
    assert answer.low_confidence is bool(answer.reasons)
    cited = {p.id for p in answer.citations}
    # a flagged answer cites the passage its text came from, even one the model judged irrelevant, and says so
    assert cited <= {chosen.passage.id}
    assert all(segment.relevance == chosen.score.relevance_token for segment in answer.segments if segment.passage)
    for segment in answer.segments:
        if segment.support == rf.PARTIALLY_SUPPORTED:
            assert partial != "drop"
    if not supported:
        assert last["reason"] in " ".join(answer.reasons)


def test_ask_formatting_marks_cited_sentences_and_reasons(build) -> None:  # type: ignore[no-untyped-def]
    from selfrag.inference.ask import format_answer

    rag, _, _ = build({PARIS: seg("Berlin.", support=NONE)}, passages=[PARIS], max_rounds=0, on_unsupported="flag")
    text = format_answer(rag.answer(Q))
    lines = text.splitlines()
    assert lines[0] == "Berlin. [1]   [low_confidence]"
    assert lines[1] == f"  why: flagged: the model judged the best continuation {rf.NO_SUPPORT}"
    assert lines[2] == f"  [1] {PARIS.id} ({PARIS.title})"
    assert "support: flag" in text
