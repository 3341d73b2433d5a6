"""A passage branch that judged its passage [Relevant] and wrote no answer text: the trace says what it wrote and which
rule rejected it, and the runtime decodes it once more, text first (as the no-retrieval path does).

The 150-step CPU model often writes ``[Relevant]`` on the gold passage and stops (or goes straight on to a support
verdict); the runtime used to rank that branch as malformed and accept a neighbour's answer instead.
"""

from __future__ import annotations

import pytest
from runtime_scripts import FixedRetriever, Segments, passage_key

from selfrag import reflection as rf
from selfrag.inference.ask import format_answer
from selfrag.inference.config import InferenceConfig, PruningConfig
from selfrag.inference.engines import GenerationRequest, Script, ScriptedEngine
from selfrag.inference.runtime import SelfRAG
from selfrag.prompting import encode_text
from selfrag.trajectory import Passage

GOLD = Passage("p-gold", "Quill", "The quill compiler was written by Ada Byrne in 1987.")
NEAR = Passage("p-near", "Quill syntax", "Quill blocks are marked by indent.")
Q = "Who wrote the quill compiler?"
REL = {rf.RELEVANT: 0.998, rf.IRRELEVANT: 0.002}
FULL = {rf.FULLY_SUPPORTED: 0.9, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.05}
U5 = ("[Utility:5]", {"[Utility:5]": 0.9, "[Utility:1]": 0.1})


class BranchEngine(ScriptedEngine):
    """GOLD's branch writes ``[Relevant]`` then ``after`` when unconstrained, ``Ada Byrne.`` when text comes first;
    NEAR's branch writes a complete, supported ``indent.``."""

    def __init__(self, tokenizer, ids, after: Script, text: Script | None = None) -> None:  # type: ignore[no-untyped-def]
        self.segments = Segments(tokenizer, ids)
        self.gold = passage_key(tokenizer, ids, GOLD)
        self.relevant = (ids.id(rf.RELEVANT),)
        self.after = after
        self.text = text or self.segments.script("Ada Byrne.", (rf.FULLY_SUPPORTED, FULL), U5)
        self.near = passage_key(tokenizer, ids, NEAR)
        super().__init__(tokenizer, ids, self.find)

    def find(self, request: GenerationRequest) -> Script:
        prompt = request.prompt_ids
        verdict = self.segments.script((rf.RELEVANT, REL))
        if _ends(prompt, self.near):
            return self.segments.script((rf.RELEVANT, REL), "indent.", (rf.FULLY_SUPPORTED, FULL), U5)
        if _ends(prompt, self.near + self.relevant):
            return self.segments.script("indent.", (rf.FULLY_SUPPORTED, FULL), U5)
        if _ends(prompt, self.gold):
            return Script(verdict.token_ids + self.after.token_ids, verdict.logprobs + self.after.logprobs)
        if _ends(prompt, self.gold + self.relevant):
            return self.text if request.min_tokens else self.after  # text first, or the rest after the verdict
        for cut in range(1, len(self.text.token_ids)):  # the rest after the text-first opening
            if _ends(prompt, self.gold + self.relevant + self.text.token_ids[:cut]):
                return Script(self.text.token_ids[cut:], self.text.logprobs[cut:])
        raise KeyError("no script for this prompt")


def _ends(prompt: tuple[int, ...], key: tuple[int, ...]) -> bool:
    return len(prompt) >= len(key) and prompt[-len(key):] == key


def _rag(engine: ScriptedEngine, **config: object) -> SelfRAG:
    config.setdefault("mode", "always")
    config.setdefault("max_rounds", 0)
    return SelfRAG(engine, FixedRetriever([GOLD, NEAR]), InferenceConfig(**config))  # type: ignore[arg-type]


def _afters(tokenizer, ids) -> dict[str, Script]:  # type: ignore[no-untyped-def]
    segments = Segments(tokenizer, ids)
    return {
        "eos": Script((tokenizer.eos_token_id,)),
        "verdicts": segments.script((rf.FULLY_SUPPORTED, FULL), U5),
        "utility": segments.script(U5),
    }


@pytest.mark.parametrize("after", ["eos", "verdicts", "utility"])
@pytest.mark.parametrize("pruning", [True, False])
def test_relevant_branch_without_text_is_decoded_again_text_first(reflection_tokenizer, token_ids, after,  # type: ignore[no-untyped-def]
                                                                   pruning) -> None:
    engine = BranchEngine(reflection_tokenizer, token_ids, _afters(reflection_tokenizer, token_ids)[after])
    answer = _rag(engine, pruning=PruningConfig(enabled=pruning)).answer(Q)
    assert answer.answer == "Ada Byrne." and answer.citations == (GOLD,) and not answer.low_confidence
    gold = answer.candidates[0]
    assert gold.well_formed and gold.retried is not None and gold.retried.startswith(rf.RELEVANT)
    assert gold.score is not None and gold.score.relevance == pytest.approx(0.998)  # the verdict's own log-probs
    retry = next(step for step in answer.to_json()["trace"] if step["step"] == "retry")
    assert retry["chosen"] == [GOLD.id] and "text first" in retry["reason"]
    constrained = [r for call in engine.calls for r in call if r.min_tokens]  # the text-first decode
    assert len(constrained) == 1 and constrained[0].min_tokens == 1 and constrained[0].max_tokens == 1
    assert token_ids.id(rf.FULLY_SUPPORTED) in constrained[0].banned_token_ids
    assert constrained[0].prompt_ids[-1] == token_ids.id(rf.RELEVANT)
    rank = next(step for step in answer.to_json()["trace"] if step["step"] == "rank")
    assert rank["candidates"][0]["retried"] == gold.retried and rank["chosen"] == GOLD.id


def test_a_branch_with_text_is_not_decoded_again(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    segments = Segments(reflection_tokenizer, token_ids)
    engine = BranchEngine(reflection_tokenizer, token_ids, segments.script("Ada.", (rf.FULLY_SUPPORTED, FULL), U5))
    answer = _rag(engine).answer(Q)
    assert answer.answer == "Ada." and answer.candidates[0].retried is None
    assert not any(step["step"] == "retry" for step in answer.to_json()["trace"])
    assert not any(r.min_tokens for call in engine.calls for r in call)  # no text-first decode


def test_trace_and_ask_output_say_what_a_malformed_branch_wrote_and_why(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    """The retry writes only whitespace: the branch stays malformed, and the rank step carries both raw texts, its
    parse problems and the rule by which it lost to NEAR; `ask` prints them, and `--json` (Answer.to_json) carries
    them (it used to show `[Relevant] 0.998 (malformed)` and nothing else)."""
    segments = Segments(reflection_tokenizer, token_ids)
    after = segments.script((rf.FULLY_SUPPORTED, FULL), U5)
    engine = BranchEngine(reflection_tokenizer, token_ids, after, text=segments.script(" ", U5))
    answer = _rag(engine).answer(Q)
    assert answer.answer == "indent." and answer.citations == (NEAR,)
    rank = next(step for step in answer.to_json()["trace"] if step["step"] == "rank")
    gold = rank["candidates"][0]
    assert rank["chosen"] == NEAR.id and gold["passage_id"] == GOLD.id
    assert gold["well_formed"] is False and gold["generated"] == f"{rf.RELEVANT} [Utility:5]"
    assert gold["retried"] == f"{rf.RELEVANT}{rf.FULLY_SUPPORTED}[Utility:5]"
    assert any("has no text" in problem for problem in gold["problems"])
    assert gold["rejected"] == ("the policy would not ship it (the best continuation has no support verdict, so "
                                "nothing says the passage supports it): ranks below every candidate it would")
    shown = format_answer(answer)
    assert f"first wrote '{rf.RELEVANT}{rf.FULLY_SUPPORTED}[Utility:5]' (no answer text)" in shown
    assert f"wrote '{rf.RELEVANT} [Utility:5]'" in shown
    assert "(malformed: segment 1 has" in shown and "not chosen: the policy would not ship it" in shown


@pytest.mark.parametrize("asks", [rf.RETRIEVAL, rf.PARAGRAPH_OPEN])
@pytest.mark.parametrize("pruning", [True, False])
def test_a_branch_that_would_ask_for_more_evidence_writes_on_to_its_verdicts(reflection_tokenizer, token_ids, asks,  # type: ignore[no-untyped-def]
                                                                              pruning) -> None:
    """A 300-step CPU model judged the passage holding the answer ``[Relevant]``, wrote a sentence, then ``<paragraph>``
    (5 of one seed's PopQA abstentions). As a stop id that cut the branch before its support verdict, so it was never
    accepted. A branch already holds its evidence: both ids are held off in its decodes, the model writes on to its
    verdicts, and the branch is answered."""
    segments = Segments(reflection_tokenizer, token_ids)
    ask = token_ids.id(asks)
    wants = segments.script("Ada Byrne.", (asks, {}))  # what the model writes after the verdict, unconstrained
    written = segments.script("Ada Byrne.", (rf.FULLY_SUPPORTED, FULL), U5)

    class AskingEngine(BranchEngine):
        def find(self, request: GenerationRequest) -> Script:
            self.after = written if ask in request.banned_token_ids else wants
            return super().find(request)

    engine = AskingEngine(reflection_tokenizer, token_ids, wants)
    answer = _rag(engine, pruning=PruningConfig(enabled=pruning)).answer(Q)
    assert answer.answer == "Ada Byrne." and answer.citations == (GOLD,) and not answer.low_confidence
    gold = answer.candidates[0]
    assert gold.well_formed and gold.truncated is None and gold.retried is None
    branches = [r for call in engine.calls for r in call]
    assert branches and all(ask in r.banned_token_ids and ask not in r.stop_token_ids for r in branches)


def test_long_generated_text_is_shortened_in_the_trace(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    segments = Segments(reflection_tokenizer, token_ids)
    long = " ".join(["word"] * 200)
    engine = BranchEngine(reflection_tokenizer, token_ids, segments.script(long))
    answer = _rag(engine, max_tokens=300, pruning=PruningConfig(enabled=False)).answer(Q)
    gold = next(step for step in answer.to_json()["trace"] if step["step"] == "rank")["candidates"][0]
    assert len(gold["generated"]) <= 160 and gold["generated"].endswith("…")
    assert encode_text  # the helper stays imported for scripts that need raw ids


def test_the_rest_after_a_verdict_cannot_loop_back_to_another_verdict(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    """A 150-step CPU model looped ``[Relevant]For</paragraph>[Relevant]For</paragraph>…`` to max_tokens on one seed in
    three (4x plain RAG's latency, a malformed branch). After its verdict a branch may not write a second relevance
    verdict or ``</paragraph>``: the model writes on, and the branch is answered and well-formed."""
    segments = Segments(reflection_tokenizer, token_ids)
    close, relevant = token_ids.id(rf.PARAGRAPH_CLOSE), token_ids.id(rf.RELEVANT)
    loop = segments.script("For")
    loop = Script((*loop.token_ids, close, relevant) * 20)  # what the model wants after [Relevant], unconstrained
    written = segments.script("For the record, Ada Byrne.", (rf.FULLY_SUPPORTED, FULL), U5)

    class LoopingEngine(BranchEngine):
        def find(self, request: GenerationRequest) -> Script:
            if _ends(request.prompt_ids, self.gold + self.relevant):
                return written if close in request.banned_token_ids else loop
            return super().find(request)

    engine = LoopingEngine(reflection_tokenizer, token_ids, loop)
    answer = _rag(engine, max_tokens=64).answer(Q)
    assert answer.answer == "For the record, Ada Byrne." and answer.citations == (GOLD,)
    gold = answer.candidates[0]
    assert gold.well_formed and gold.finish_reason == "stop" and gold.retried is None
    rest = [r for call in engine.calls for r in call if _ends(r.prompt_ids, engine.gold + engine.relevant)]
    assert len(rest) == 1
    assert {close, relevant, token_ids.id(rf.IRRELEVANT)} <= set(rest[0].banned_token_ids)
