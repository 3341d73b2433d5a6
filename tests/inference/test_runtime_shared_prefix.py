"""The prompts single-pass sends for one question share its prompt id for id (scripted engine).

A prefix cache (the hf engine's kept KV, vLLM's prefix caching) shares only a token-identical prefix: the decision's
prompt must be the first ids of every passage branch, every pruned branch's continuation and every later round.
"""

from __future__ import annotations

from runtime_scripts import FULL, NONE, RELEVANT, UTILITY_5, FixedRetriever, KeyedEngine, Segments, passage_key

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, SkipConfig
from selfrag.inference.runtime import SelfRAG
from selfrag.prompting import encode_prompt
from selfrag.trajectory import Passage

PARIS = Passage("p-paris", "Paris", "Paris is the capital of France.")
LYON = Passage("p-lyon", "Lyon", "Lyon is a city in France.")
NICE = Passage("p-nice", "Nice", "Nice lies on the coast.")
Q = "What is the capital of France?"


def _branch(text: str, support: dict[str, float]) -> list:  # type: ignore[type-arg]
    return [(rf.RELEVANT, RELEVANT), text, (max(support, key=support.__getitem__), support),
            ("[Utility:5]", UTILITY_5)]


def test_every_prompt_of_a_question_extends_its_decision_prompt(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    segments = Segments(reflection_tokenizer, token_ids)
    prompt = tuple(encode_prompt(reflection_tokenizer, Q, "auto"))
    table = {
        prompt: segments.script((rf.RETRIEVAL, {rf.RETRIEVAL: 0.9, rf.NO_RETRIEVAL: 0.1})),
        # round 0 writes unsupported answers, so the question goes to a second round (NICE)
        passage_key(reflection_tokenizer, token_ids, PARIS): segments.script(*_branch("Berlin.", NONE)),
        passage_key(reflection_tokenizer, token_ids, LYON): segments.script(*_branch("Berlin.", NONE)),
        passage_key(reflection_tokenizer, token_ids, NICE): segments.script(*_branch("Paris.", FULL)),
    }
    engine = KeyedEngine(reflection_tokenizer, token_ids, table)
    retriever = FixedRetriever([PARIS, LYON, NICE])
    config = InferenceConfig(mode="adaptive", threshold=0.5, top_k=2, max_rounds=1,
                             skip=SkipConfig(repeated=False, relevance_gap=None, unpaid_rounds=False))
    answer = SelfRAG(engine, retriever, config).answer(Q)

    requests = [request for batch in engine.calls for request in batch]
    decision = requests[0]
    assert decision.prompt_ids == prompt and decision.keep_prefix  # an engine that keeps KV keeps the question
    assert len(retriever.queries) == 2 and answer.answer == "Paris."  # two rounds: the later one is checked too
    assert len(requests) >= 1 + 3 * 2  # the decision, then each branch's verdict step and its continuation
    for request in requests[1:]:
        assert request.prompt_ids[: len(prompt)] == prompt, "a prompt does not start with the question's ids"
    # each passage branch is the question's prompt and the passage's ids, nothing re-encoded between them
    branch_prompts = {request.prompt_ids for request in requests}
    for passage in (PARIS, LYON, NICE):
        assert prompt + passage_key(reflection_tokenizer, token_ids, passage) in branch_prompts
