"""GRPO rollouts: the policy decodes as the runtime's long form does, and the retriever writes its passages in.

    rollouts = Rollouts(policy_engine(model, tokenizer, token_ids, "auto"), retriever, RolloutConfig())
    (rollout,) = rollouts.run(["Who wrote Hamlet?"])
    rollout.completion_ids, rollout.env_mask, rollout.trajectory.well_formed

One rollout is one answer decoded segment by segment through serving's own segment loop
(:func:`selfrag.inference.segments.segment_loop`, the loop ``form=long`` runs; :class:`Rollouts` is its caller, as
:class:`~selfrag.inference.longform.LongForm` is serving's) with one beam and one passage a step: the same requests,
stop ids, constraints and decision rule (:func:`~selfrag.inference.segments.decide`). Every decode stops at the next
decision (a retrieve token, ``<paragraph>``, a utility token); where the model wrote ``[Retrieval]`` (or
``<paragraph>``) the question plus the text so far is searched and the best passage not yet in context goes in as
``[Retrieval]<paragraph>…</paragraph>`` (``selfrag.prompting.passage_ids``, as the runtime inserts it); the model
then writes its relevance token, the sentence, its support token and its next decision, and may retrieve again up to
``depth`` times. A utility token ends the answer.

The differences from serving, on purpose: decisions are the model's **sampled** tokens
(:class:`~selfrag.inference.segments.SampledDecider`; the runtime reads the same distribution with thresholds,
:class:`~selfrag.inference.segments.ThresholdDecider`: RL needs the choices the policy made), and a rollout that
breaks the grammar is kept as it is (the reward's format term sees it) where the runtime would repair it.
``tests/rl/test_rl_rollout.py`` answers each rollout's question with :class:`~selfrag.inference.runtime.SelfRAG` on
the same sampled ids and gets the same text, segments and citations.

``env_mask`` is 1 where the policy sampled the id and 0 where the environment wrote it (each passage with its
``<paragraph>`` markup, and a decision the depth limit replaced): TRL's GRPO takes it as its tool mask, so the loss
never trains the retrieved text (Search-R1's retrieved-token masking). The text is parsed by the runtime's parser
(``selfrag.trajectory.lex_ids`` + ``parse_trajectory``), never a second one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from selfrag import reflection as rf
from selfrag.inference.engines.base import Engine, Generation, concat_generations
from selfrag.inference.engines.hf import HFEngine
from selfrag.inference.engines.options import EngineOptions
from selfrag.inference.rounds import new_passages
from selfrag.inference.segments import SampledDecider, SegmentGrammar, decide, segment_loop
from selfrag.prompting import encode_prompt, passage_ids
from selfrag.reflection import Group, ReflectionIds
from selfrag.retrieval import Retriever
from selfrag.trajectory import Passage, Trajectory, lex_ids, parse_trajectory

from .config import RolloutConfig


@dataclass(frozen=True)
class RolloutSegment:
    """One sentence of a rollout: its text, the passage in context when it was written (None: no evidence), and
    the model's relevance and support tokens for it."""

    text: str
    passage: Passage | None
    relevance: str | None
    support: str | None


@dataclass(frozen=True)
class Rollout:
    """One sampled answer: prompt and completion ids, which completion ids the policy sampled, the parse."""

    question: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    env_mask: tuple[int, ...]  # 1: sampled by the policy; 0: written by the environment (passages, their markup)
    trajectory: Trajectory
    segments: tuple[RolloutSegment, ...]
    passages: tuple[Passage, ...]  # retrieved, in order
    finish: str  # "utility", "eos", "length", "max_segments" or "no passage"

    @property
    def retrievals(self) -> int:
        return len(self.passages)


@dataclass
class _State:
    """A rollout being decoded (the long form's beam, with the mask beside its ids)."""

    index: int  # its place in the batch: each step decodes the live rollouts in this order
    question: str
    prompt: tuple[int, ...]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    current: Passage | None = None
    steps: int = 0
    done: str | None = None

    def add(self, ids: Sequence[int], sampled: bool) -> None:
        self.ids += [int(i) for i in ids]
        self.mask += [int(sampled)] * len(ids)


def policy_engine(
    model: Any, tokenizer: Any, token_ids: ReflectionIds, prompt_template: str, seed: int = 0
) -> HFEngine:
    """The hf engine's decode loop on the model being trained (in memory, :meth:`HFEngine.from_model` with
    ``trained=True``): no prompt KV kept between calls (the weights change after every step), the model's mode and
    head left as they are (the rollouts set the mode themselves)."""
    options = EngineOptions(device=str(next(model.parameters()).device), seed=seed)  # batch_size: the default
    return HFEngine.from_model(model, tokenizer, token_ids, prompt_template, options, name="policy", trained=True)


class Rollouts:
    """Decode rollouts for a batch of questions (one engine call per step for all of them)."""

    def __init__(self, engine: Engine, retriever: Retriever, config: RolloutConfig) -> None:
        self.engine, self.retriever, self.config = engine, retriever, config
        self.ids = engine.token_ids
        # one segment's request, reading and decision rule are serving's long form's (inference/segments.py); the
        # decisions are the policy's sampled tokens (RL trains on the choices it made)
        self.grammar = SegmentGrammar(self.ids, config.segment_tokens)
        self.decider = SampledDecider()

    def run(self, questions: Sequence[str]) -> list[Rollout]:
        states = [_State(index, q, tuple(encode_prompt(self.engine.tokenizer, q, self.engine.prompt_template)))
                  for index, q in enumerate(questions)]
        for state in states:  # mode always: [Retrieval], the environment's choice, not the policy's: masked
            state.add(self.grammar.start(self.config.mode), False)
        model = getattr(self.engine, "model", None)
        training = bool(getattr(model, "training", False))
        if model is not None:
            model.eval()  # no dropout while sampling
        try:
            for _ in segment_loop(self, states):  # serving's long form's loop, this object its caller
                pass
        finally:
            if model is not None:
                model.train(training)
        return [self._rollout(state) for state in states]

    # -- the segment loop's caller (inference/segments.py): one step decodes the writing rollouts' next segment in
    # -- one engine call, then puts a passage in where the policy asked and decodes those in two more -----------------

    def written(self, state: _State, generation: Generation) -> _State:
        self._extend(state, generation)
        return state

    def evidence(self, asking: list[_State]) -> list[_State]:
        """The best new passage after each ``[Retrieval]`` (none left: the rollout ends), then the relevance token
        (the long form's pruning step, without pruning) and the rest of the segment, each in one engine call."""
        with_passage = [state for state in asking if self._retrieve(state)]
        first = self.decode(with_passage, max_tokens=1)
        going = [(s, g) for s, g in zip(with_passage, first, strict=True) if g.finish_reason == "length"]
        rest = dict(zip(map(id, (s for s, _ in going)),
                        self.decode([s for s, _ in going], prefixes=[g.token_ids for _, g in going]), strict=True))
        for state, generation in zip(with_passage, first, strict=True):
            more = rest.get(id(state))
            self._extend(state, generation if more is None else concat_generations(generation, more))
        return asking

    def keep(self, states: list[_State]) -> list[_State]:
        """Every rollout, in its batch order."""
        return sorted(states, key=lambda state: state.index)

    def _retrieve(self, state: _State) -> bool:
        """Put the best passage not yet in context after the ``[Retrieval]``; False (the rollout ends) when none."""
        query = " ".join(f"{state.question} {' '.join(state.texts)}".split())
        (hits,) = new_passages(self.retriever, [query], [{p.id for p in state.passages}], 1)
        if not hits:
            state.done = "no passage"
            return False
        passage = hits[0].passage
        sampled = state.mask.pop()  # the [Retrieval] itself is re-inserted with the passage, as the runtime does
        state.ids.pop()
        ids = passage_ids(self.engine.tokenizer, self.ids, passage)
        state.add(ids[:1], bool(sampled))
        state.add(ids[1:], False)
        state.passages.append(passage)
        state.current = passage
        return True

    def decode(self, states: list[_State], max_tokens: int | None = None,
                prefixes: Sequence[Sequence[int]] | None = None) -> list[Generation]:
        if not states:
            return []
        requests = [self.grammar.request(state.prompt + tuple(state.ids) + tuple(prefixes[index] if prefixes else ()),
                                         max_tokens, temperature=self.config.temperature)
                    for index, state in enumerate(states)]
        return self.engine.generate(requests)

    def _extend(self, state: _State, generation: Generation) -> None:
        """Append one decoded segment; then the decision its last id asks for (the long form's ``_after``)."""
        read = self.grammar.read(generation, self._decode_text)
        state.add(read.body, True)
        state.steps += 1
        if read.text:
            state.texts.append(read.text)
        if state.current is not None and self.ids.last_of(state.ids, Group.RETRIEVE) == rf.NO_RETRIEVAL:
            state.current = None
        if read.end == "utility" and read.stop is not None:
            state.add([read.stop], True)
        if read.end is not None:
            state.done = read.end
        else:
            assert read.stop is not None  # a decision: the decode stopped at a retrieve token or <paragraph>
            state.add(*self._decision(state, read.stop, generation))
        limit = self.config.max_segments
        if state.done is None and (len(state.texts) >= limit or state.steps >= 2 * limit + 1):
            state.done = "max_segments"

    def _decision(self, state: _State, stop: int, generation: Generation) -> tuple[list[int], bool]:
        """The decision after a segment: what the model sampled, except ``<paragraph>`` (asks for evidence: the
        environment writes ``[Retrieval]``), ``[Continue to Use Evidence]`` without a passage, and ``[Retrieval]``
        past ``depth`` in adaptive mode (``[No Retrieval]``): the runtime's long form's rule
        (:func:`selfrag.inference.segments.decide`) with the sampled token as the decider."""
        token = self.ids.token(stop)
        wants, _ = self.decider.wants(token, generation)
        chosen = decide(token, wants, mode=self.config.mode, retrievals=len(state.passages), depth=self.config.depth,
                        holds_passage=state.current is not None)
        return [self.ids.id(chosen)], chosen == token

    def _decode_text(self, run: list[int]) -> str:
        return str(self.engine.tokenizer.decode(run, skip_special_tokens=False))

    # -- the finished rollout -------------------------------------------------------------------------------------

    def _rollout(self, state: _State) -> Rollout:
        trajectory = parse_trajectory(lex_ids(state.ids, self.ids, self._decode_text))
        return Rollout(state.question, state.prompt, tuple(state.ids), tuple(state.mask), trajectory,
                       segments_of(trajectory, state.passages), tuple(state.passages), state.done or "length")


def segments_of(trajectory: Trajectory, passages: Sequence[Passage]) -> tuple[RolloutSegment, ...]:
    """The parsed segments with their passages: each ``<paragraph>`` is the next retrieved passage,
    ``[Continue to Use Evidence]`` keeps the one before, ``[No Retrieval]`` has none."""
    remaining = list(passages)
    current: Passage | None = None
    segments = []
    for segment in trajectory.segments:
        if segment.passage is not None:
            current = remaining.pop(0) if remaining else None
        elif segment.retrieve != rf.CONTINUE_EVIDENCE:
            current = None
        if segment.text.strip():
            segments.append(RolloutSegment(segment.text.strip(), current, segment.relevance, segment.support))
    return tuple(segments)
