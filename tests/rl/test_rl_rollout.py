"""GRPO rollouts (selfrag.rl.rollout): the same sampled tokens make the same answer in the runtime, and the
environment's tokens (passages, their markup) are the ones masked."""

from __future__ import annotations

import random
import zlib
from collections import Counter

import pytest

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, LongFormConfig, PruningConfig
from selfrag.inference.engines.base import GenerationRequest
from selfrag.inference.engines.fake import Script, ScriptedEngine
from selfrag.inference.runtime import SelfRAG
from selfrag.retrieval import BM25Retriever
from selfrag.rl.config import RolloutConfig
from selfrag.rl.rollout import Rollouts, policy_engine
from selfrag.trajectory import Passage, lex_ids

PASSAGES = [Passage(f"p{i}", f"Title {i}", text) for i, text in enumerate([
    "The cat sat on the mat in Paris.", "Paris is the capital of France.", "The sky is blue on a clear day.",
    "A red car drove past the old mill.", "Bread is baked from flour and water.",
])]
QUESTIONS = ["Where did the cat sit?", "What is the capital of France?", "What colour is the sky?",
             "What drove past the mill?", "How is bread made?", "Is the sky red?", "Who sat on the mat?",
             "What is baked?", "Where is the mill?", "What is on the mat?", "Which city is big?", "What is blue?"]
WORDS = ["the cat sat", "paris is big", "the sky is blue", "a red car", "bread is good", "it is so"]


def scripted_policy(tokenizer, ids):  # type: ignore[no-untyped-def]
    """A model whose continuation is a function of its prompt (seeded by the prompt's ids): well-formed segments with
    random verdicts and decisions; the emitted id holds the log-prob mass, so thresholds read the sampled choice."""
    decisions = [rf.RETRIEVAL, rf.NO_RETRIEVAL, rf.CONTINUE_EVIDENCE, rf.UTILITY_TOKENS[3]]

    def script(request: GenerationRequest) -> Script:
        prompt = request.prompt_ids
        rng = random.Random(zlib.crc32(repr(prompt).encode()))
        last = ids.token(prompt[-1])
        text = tokenizer.encode(" " + rng.choice(WORDS), add_special_tokens=False)
        decision = [ids.id(rng.choices(decisions, weights=[3, 2, 2, 3])[0])]
        support = [ids.id(rng.choice([rf.FULLY_SUPPORTED, rf.PARTIALLY_SUPPORTED, rf.NO_SUPPORT]))]
        if last is None:  # the question: the first decision
            out = [ids.id(rng.choice([rf.RETRIEVAL, rf.NO_RETRIEVAL]))]
        elif last == rf.PARAGRAPH_CLOSE:
            out = [ids.id(rng.choice([rf.RELEVANT, rf.IRRELEVANT]))] + text + support + decision
        elif last in (rf.RELEVANT, rf.IRRELEVANT, rf.CONTINUE_EVIDENCE):
            out = text + support + decision
        else:  # [No Retrieval]: text, then the next decision (no verdict: the runtime bans it)
            out = text + decision
        logprobs = tuple({i: (0.0 if i == token else -30.0) for i in ids.all_ids} for token in out)
        return Script(tuple(out), logprobs)

    return script


def runtime_config(rollout: RolloutConfig) -> InferenceConfig:
    """The runtime's long form with one beam and one passage a step, nothing re-ranked or repaired."""
    return InferenceConfig(
        form="long", mode=rollout.mode, threshold=0.5, relevance_threshold=0.5, support_bound=0.0, top_k=1,
        max_rounds=0, on_unsupported="flag", pruning=PruningConfig(enabled=False),
        long_form=LongFormConfig(width=1, depth=rollout.depth, max_segments=rollout.max_segments,
                                 segment_tokens=rollout.segment_tokens),
    )


@pytest.mark.parametrize("mode", ["adaptive", "always"])
def test_the_rollout_is_the_runtimes_answer_for_the_same_sampled_tokens(reflection_tokenizer, token_ids,
                                                                        mode: str) -> None:
    engine = ScriptedEngine(reflection_tokenizer, token_ids, scripted_policy(reflection_tokenizer, token_ids))
    retriever = BM25Retriever(PASSAGES)
    config = RolloutConfig(mode=mode, depth=2, max_segments=5)  # type: ignore[arg-type]
    rollouts = Rollouts(engine, retriever, config).run(QUESTIONS)
    runtime = SelfRAG(engine, retriever, runtime_config(config))

    def text(ids: tuple[int, ...]) -> str:
        return "".join(piece for piece, _ in lex_ids(ids, token_ids, reflection_tokenizer.decode))

    seen: Counter[str] = Counter()
    for rollout in rollouts:
        answer = runtime.answer(rollout.question)
        assert text(rollout.completion_ids) == answer.trajectory
        assert [(s.text, s.passage and s.passage.id) for s in rollout.segments] == [
            (s.text, s.passage and s.passage.id) for s in answer.segments]
        seen.update(token for token, is_token in lex_ids(rollout.completion_ids, token_ids, str) if is_token)
        seen[f"passages={rollout.retrievals}"] += 1
    # the questions cover the grammar's branches: irrelevant, continue, re-retrieval, several segments
    assert seen[rf.IRRELEVANT] and seen[rf.CONTINUE_EVIDENCE] and seen[rf.NO_RETRIEVAL] and seen["passages=2"]


def test_only_the_passages_and_their_markup_are_masked(reflection_tokenizer, token_ids) -> None:
    engine = ScriptedEngine(reflection_tokenizer, token_ids, scripted_policy(reflection_tokenizer, token_ids))
    rollouts = Rollouts(engine, BM25Retriever(PASSAGES), RolloutConfig(depth=2)).run(QUESTIONS)
    open_id, close_id = token_ids.id(rf.PARAGRAPH_OPEN), token_ids.id(rf.PARAGRAPH_CLOSE)
    decisions = set(token_ids.ids(rf.Group.RETRIEVE))
    assert any(rollout.retrievals for rollout in rollouts)
    replaced = 0
    for rollout in rollouts:
        inside = False
        for token, sampled in zip(rollout.completion_ids, rollout.env_mask, strict=True):
            if token == open_id:
                inside = True
            # outside a passage only a decision the environment overrode (depth reached, nothing to continue) is 0
            assert sampled == 0 if inside else sampled == 1 or token in decisions
            replaced += not inside and not sampled
            if token == close_id:
                inside = False
        assert rollout.env_mask.count(0) >= sum(
            len(reflection_tokenizer.encode(p.render(), add_special_tokens=False, split_special_tokens=True)) + 2
            for p in rollout.passages)
    assert replaced  # [Continue to Use Evidence] without a passage became [No Retrieval]: not the policy's token


def test_policy_rollouts_on_a_real_model_parse_with_the_runtimes_parser(merged_model_dir) -> None:
    from selfrag.loading import load_model

    loaded = load_model(merged_model_dir(3))
    engine = policy_engine(loaded.model.train(), loaded.tokenizer, loaded.meta.token_ids, "auto", seed=1)
    config = RolloutConfig(mode="always", segment_tokens=6, max_segments=2, temperature=1.0)
    rollouts = Rollouts(engine, BM25Retriever(PASSAGES), config).run(QUESTIONS[:3])
    assert loaded.model.training  # the rollout puts the model back in the mode it found it in
    for rollout in rollouts:
        assert rollout.retrievals >= 1 and rollout.env_mask[0] == 0  # mode=always: the environment's [Retrieval]
        assert len(rollout.env_mask) == len(rollout.completion_ids)
        assert not rollout.trajectory.well_formed  # random weights break the grammar: the parser says so
    again = Rollouts(policy_engine(loaded.model, loaded.tokenizer, loaded.meta.token_ids, "auto", seed=1),
                     BM25Retriever(PASSAGES), config).run(QUESTIONS[:3])
    assert [r.completion_ids for r in again] == [r.completion_ids for r in rollouts]  # seeded sampling
