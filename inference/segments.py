"""The one segment loop (decide, retrieve, judge, continue, stop) and one segment: its decode request, how the decode
is read, and the decision after it (a decider).

    for tracks in segment_loop(caller, tracks): ...      # serving's LongForm and selfrag rl's Rollouts alike

    grammar = SegmentGrammar(engine.token_ids, segment_tokens=48)
    request = grammar.request(prompt_ids)          # stops at the next decision; text first after [No Retrieval]
    segment = grammar.read(generation, decode)     # body, stop id, text, and how the segment ended
    wants, p_retrieve = ThresholdDecider(engine.token_ids, 0.2).wants(token, generation)
    chosen = decide(token, wants, mode="adaptive", retrievals=0, depth=2, holds_passage=False)

:func:`segment_loop` steps every live track (a beam, a rollout) until all are done: the tracks that are writing decode
their next segment in one engine call, those whose last id is ``[Retrieval]`` take evidence, and the caller keeps
what goes on. What differs between serving and RL is the caller's (:class:`SegmentCaller`): serving's long form
(:class:`~selfrag.inference.longform.LongForm`) branches on several passages a round, scores and keeps the
``width`` best beams, and traces; RL's rollouts (``selfrag.rl.rollout``) insert one passage, keep every rollout and
record ``env_mask``.

A segment decode stops at the next reflection decision (a retrieve token, ``<paragraph>``, a utility token), so one
decode is one segment. What follows it is read by a **decider**: :class:`ThresholdDecider` (serving's long form,
:mod:`selfrag.inference.longform`) reads ``p_retrieve`` from the decode's log-probs against ``threshold``;
:class:`SampledDecider` (``selfrag rl``'s rollouts) takes the token the policy sampled, since RL trains on the
choices the policy made. Both then go through one rule, :func:`decide` (``mode``, ``depth``, and
``[Continue to Use Evidence]`` only with a passage in context), so the served answer and a rollout agree on the same
sampled ids (``tests/rl/test_rl_rollout.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeVar

from selfrag import reflection as rf
from selfrag.reflection import Group, ReflectionIds
from selfrag.trajectory import lex_ids

from .engines.base import Generation, GenerationRequest
from .scoring import retrieve_probability

#: the decisions that ask for evidence (``<paragraph>`` written by the model asks as ``[Retrieval]`` does)
ASKS = (rf.RETRIEVAL, rf.PARAGRAPH_OPEN)


@dataclass(frozen=True)
class SegmentRead:
    """One decoded segment: the ids kept in context (``body``: without its stop), the stop id, the plain text, and
    how it ended (``eos``, ``length``, ``utility``; None: a decision follows, the stop is a retrieve token or
    ``<paragraph>``)."""

    body: tuple[int, ...]
    stop: int | None
    text: str
    end: Literal["eos", "length", "utility"] | None


class SegmentGrammar:
    """The stops and constraints of a long-form segment decode, the same for serving and RL rollouts."""

    def __init__(self, ids: ReflectionIds, segment_tokens: int) -> None:
        self.ids, self.segment_tokens = ids, segment_tokens
        self.retrieval_id = ids.id(rf.RETRIEVAL)
        self.stop_ids = (*ids.ids(Group.RETRIEVE), ids.id(rf.PARAGRAPH_OPEN), *ids.ids(Group.UTILITY))
        # After [No Retrieval] a segment is text, then its stop (a retrieve decision, <paragraph> or a utility token):
        # no verdict or passage markup, and the stops wait one id. Unlike short-form the retrieve tokens stay allowed
        # (a long-form segment ends at one); without the hold the model may repeat [No Retrieval] and never write.
        self.no_retrieval_id = ids.id(rf.NO_RETRIEVAL)
        self.after_no_retrieval_banned = tuple(i for i in ids.all_ids if i not in self.stop_ids)

    def start(self, mode: str) -> tuple[int, ...]:
        """The ids an answer starts with: ``[Retrieval]`` for mode always, ``[No Retrieval]`` for never, else none."""
        return {"always": (self.retrieval_id,), "never": (self.no_retrieval_id,)}.get(mode, ())

    def request(self, prompt: Sequence[int], max_tokens: int | None = None, *, keep_prefix: bool = False,
                temperature: float = 0.0) -> GenerationRequest:
        """The decode of the next segment after ``prompt`` (``max_tokens``: ``segment_tokens`` unless given)."""
        request = GenerationRequest(
            prompt_ids=tuple(prompt), max_tokens=max_tokens or self.segment_tokens, stop_token_ids=self.stop_ids,
            temperature=temperature, score_token_ids=self.ids.all_ids, keep_prefix=keep_prefix,
        )
        if request.prompt_ids and request.prompt_ids[-1] == self.no_retrieval_id:
            request = replace(request, banned_token_ids=self.after_no_retrieval_banned, min_tokens=1)
        return request

    def read(self, generation: Generation, decode: Callable[[list[int]], str]) -> SegmentRead:
        """Split a segment decode into its body, stop and text (``decode``: the tokenizer's, special tokens kept)."""
        generated = list(generation.token_ids)
        stop = generated[-1] if generated and generation.finish_reason == "stop" else None
        body = generated[:-1] if stop is not None or generation.finish_reason == "eos" else generated
        pieces = lex_ids(body, self.ids, decode)
        text = "".join(content for content, is_token in pieces if not is_token).strip()
        end: Literal["eos", "length", "utility"] | None = None
        if generation.finish_reason == "eos":
            end = "eos"
        elif stop is None:
            end = "length"
        elif self.ids.token(stop) in rf.UTILITY_TOKENS:
            end = "utility"
        return SegmentRead(tuple(body), stop, text, end)


class Decider(Protocol):
    """How the decision after a segment is read: whether the model wants evidence, and ``p_retrieve`` where it was
    read from log-probs (None: read from the token)."""

    def wants(self, token: str | None, generation: Generation) -> tuple[bool, float | None]: ...


@dataclass(frozen=True)
class ThresholdDecider:
    """Serving: ``p_retrieve`` (the retrieve tokens' log-probs at the stop) above ``threshold`` wants evidence; where
    neither retrieve token has a log-prob, the token the model wrote decides."""

    ids: ReflectionIds
    threshold: float

    def wants(self, token: str | None, generation: Generation) -> tuple[bool, float | None]:
        logprobs = generation.score_logprobs[-1] if generation.score_logprobs else {}
        p_retrieve = retrieve_probability(logprobs, self.ids)
        return (token in ASKS if p_retrieve is None else p_retrieve > self.threshold), p_retrieve


@dataclass(frozen=True)
class SampledDecider:
    """RL rollouts: the token the policy sampled decides (``[Retrieval]`` or ``<paragraph>`` want evidence)."""

    def wants(self, token: str | None, generation: Generation) -> tuple[bool, float | None]:
        return token in ASKS, None


def decide(token: str | None, wants: bool, *, mode: str, retrievals: int, depth: int, holds_passage: bool) -> str:
    """The retrieve token after a segment that stopped at ``token``: the decider's ``wants``, overruled by mode never
    and by ``depth`` reached, and by mode always where the model asked; ``[Continue to Use Evidence]`` needs a
    passage in context (:func:`selfrag.reflection.retrieve_after_segment`)."""
    if mode == "never" or retrievals >= depth:
        wants = False
    if mode == "always" and token in ASKS:
        wants = True
    return rf.retrieve_after_segment(token, wants, holds_passage)


class Track(Protocol):
    """A beam or a rollout: its ids after the prompt, and why it ended (None: live)."""

    @property
    def ids(self) -> Sequence[int]: ...

    @property
    def done(self) -> str | None: ...


T = TypeVar("T", bound=Track)


class SegmentCaller(Protocol[T]):
    """What the caller of :func:`segment_loop` decides: how its tracks decode a segment and are extended by it, how
    the tracks that asked for evidence take it, and which tracks go on after a step."""

    @property
    def grammar(self) -> SegmentGrammar: ...

    def decode(self, tracks: list[T]) -> list[Generation]: ...

    def written(self, track: T, generation: Generation) -> T: ...

    def evidence(self, tracks: list[T]) -> list[T]: ...

    def keep(self, tracks: list[T]) -> list[T]: ...


def segment_loop(caller: SegmentCaller[T], tracks: list[T]) -> Iterator[list[T]]:
    """Step ``tracks`` until every one is done, yielding the tracks kept after each step: the finished ones, then the
    writing ones extended by their next segment (one engine call), then what the evidence step made of those whose
    last id is ``[Retrieval]``, in that order, through ``caller.keep``."""
    retrieval_id = caller.grammar.retrieval_id
    while any(track.done is None for track in tracks):
        live = [track for track in tracks if track.done is None]
        asking = [track for track in live if track.ids and track.ids[-1] == retrieval_id]
        writing = [track for track in live if not (track.ids and track.ids[-1] == retrieval_id)]
        stepped = [track for track in tracks if track.done is not None]
        stepped += [caller.written(track, generation)
                    for track, generation in zip(writing, caller.decode(writing), strict=True)]
        stepped += caller.evidence(asking)
        tracks = caller.keep(stepped)
        yield tracks
