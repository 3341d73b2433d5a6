"""read=together: each passage's relevance is judged on its own, then the passages judged [Relevant] are read in one
paragraph and answered once; that answer takes their place in the ranking. read=each (the default) is the paper's
branch per passage. A scripted engine with hand-set log-probs decides what each prompt gets."""

from __future__ import annotations

import pytest
from runtime_scripts import FULL, NONE, RELEVANT, UTILITY_5, FixedRetriever, Segments, passage_key

from selfrag import reflection as rf
from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.inference.config import InferenceConfig, PruningConfig
from selfrag.inference.engines import GenerationRequest, Script, ScriptedEngine
from selfrag.inference.runtime import SelfRAG
from selfrag.trajectory import Passage

BORN = Passage("p-born", "Ada Byrne", "Ada Byrne was born in Cork in 1950.")
WROTE = Passage("p-wrote", "Quill", "The quill compiler was written by Ada Byrne.")
OTHER = Passage("p-other", "Weather", "Cork has mild, wet winters.")
JOINED = Passage("p-born + p-wrote", "", f"{BORN.render()}\n\n{WROTE.render()}")
Q = "Where was the author of the quill compiler born?"
REL_WEAKER = {rf.RELEVANT: 0.7, rf.IRRELEVANT: 0.3}
IRR = {rf.RELEVANT: 0.05, rf.IRRELEVANT: 0.95}
U5 = ("[Utility:5]", UTILITY_5)


class TogetherEngine(ScriptedEngine):
    """Each passage alone: BORN answers "Cork." unsupported (it does not say who wrote the compiler), WROTE answers
    "Ada Byrne." (not the question), OTHER is irrelevant. The two read together answer "In Cork." fully supported."""

    def __init__(self, tokenizer, ids) -> None:  # type: ignore[no-untyped-def]
        self.segments = s = Segments(tokenizer, ids)
        self.relevant = (ids.id(rf.RELEVANT),)
        self.alone = {
            passage_key(tokenizer, ids, BORN): s.script((rf.RELEVANT, RELEVANT), "Cork.", (rf.NO_SUPPORT, NONE), U5),
            passage_key(tokenizer, ids, WROTE): s.script((rf.RELEVANT, REL_WEAKER), "Ada Byrne.",
                                                         (rf.NO_SUPPORT, NONE), U5),
            passage_key(tokenizer, ids, OTHER): s.script((rf.IRRELEVANT, IRR), "Mild.", (rf.NO_SUPPORT, NONE), U5),
        }
        self.joined = passage_key(tokenizer, ids, JOINED)
        self.answer = s.script("In Cork.", (rf.FULLY_SUPPORTED, FULL), U5)
        super().__init__(tokenizer, ids, self.find)

    def find(self, request: GenerationRequest) -> Script:
        prompt = request.prompt_ids
        for key, script in self.alone.items():
            for cut in range(len(script.token_ids)):  # the branch from its start, or from its verdict on
                if _ends(prompt, key + script.token_ids[:cut]):
                    return Script(script.token_ids[cut:], script.logprobs[cut:])
        for cut in range(len(self.answer.token_ids)):
            if _ends(prompt, self.joined + self.relevant + self.answer.token_ids[:cut]):
                return Script(self.answer.token_ids[cut:], self.answer.logprobs[cut:])
        raise KeyError("no script for this prompt")


def _ends(prompt: tuple[int, ...], key: tuple[int, ...]) -> bool:
    return len(prompt) >= len(key) and prompt[-len(key):] == key


def _rag(engine: ScriptedEngine, passages: list[Passage], **config: object) -> SelfRAG:
    config.setdefault("mode", "always")
    config.setdefault("max_rounds", 0)
    config.setdefault("relevance_threshold", 0.5)
    config.setdefault("support_bound", 0.0)
    return SelfRAG(engine, FixedRetriever(passages), InferenceConfig(**config))  # type: ignore[arg-type]


@pytest.mark.parametrize("pruning", [True, False])
def test_relevant_passages_read_together_are_answered_once(reflection_tokenizer, token_ids, pruning) -> None:  # type: ignore[no-untyped-def]
    engine = TogetherEngine(reflection_tokenizer, token_ids)
    rag = _rag(engine, [BORN, WROTE, OTHER], read="together", pruning=PruningConfig(enabled=pruning))
    answer = rag.answer(Q)
    assert answer.answer == "In Cork." and not answer.abstained and answer.citations == (JOINED,)
    joined = next(c for c in answer.candidates if c.passage == JOINED)
    assert joined.well_formed and not joined.pruned and joined.score is not None
    assert joined.score.relevance == pytest.approx(0.9)  # the best of its passages' verdicts (BORN's)
    alone = {c.passage.id: c for c in answer.candidates if c.passage is not None and c.passage != JOINED}
    assert alone[BORN.id].pruned and alone[WROTE.id].pruned  # their answers are the joined branch's
    assert alone[BORN.id].answer == "" and alone[WROTE.id].answer == ""  # not decoded past the verdict
    step = next(step for step in answer.to_json()["trace"] if step["step"] == "together")
    assert step["chosen"] == [BORN.id, WROTE.id] and "read=together" in step["reason"] and BORN.id in step["reason"]
    # the joined prompt holds both passages in retrieval order, each title and text, and OTHER is not in it
    size = len(engine.joined)
    joined_prompts = [r.prompt_ids for call in engine.calls for r in call
                      if len(r.prompt_ids) > size and r.prompt_ids[-size - 1:-1] == engine.joined]
    assert len(joined_prompts) == 1 and joined_prompts[0][-1] == token_ids.id(rf.RELEVANT)
    text = reflection_tokenizer.decode(list(joined_prompts[0]))
    assert text.index("born in Cork") < text.index("written by Ada") and "mild, wet" not in text


def test_each_is_the_default_and_answers_branch_by_branch(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    engine = TogetherEngine(reflection_tokenizer, token_ids)
    answer = _rag(engine, [BORN, WROTE, OTHER]).answer(Q)
    assert InferenceConfig().read == "each"
    assert answer.abstained  # alone, no branch is supported
    assert not any(c.passage == JOINED for c in answer.candidates)
    assert not any(step["step"] == "together" for step in answer.to_json()["trace"])


def test_one_relevant_passage_is_read_as_each_would(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    engine = TogetherEngine(reflection_tokenizer, token_ids)
    together = _rag(engine, [BORN, OTHER], read="together").answer(Q)
    each = _rag(TogetherEngine(reflection_tokenizer, token_ids), [BORN, OTHER]).answer(Q)
    assert not any(step["step"] == "together" for step in together.to_json()["trace"])
    assert [c.to_json() for c in together.candidates] == [c.to_json() for c in each.candidates]


def test_read_together_is_short_form_only() -> None:
    with pytest.raises(ConfigError, match="read=together is for the short form"):
        load_config(InferenceConfig, None, ["read=together", "form=long"])
    with pytest.raises(ConfigError, match="read must be one of"):
        load_config(InferenceConfig, None, ["read=both"])
