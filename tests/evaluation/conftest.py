"""Fixtures for the evaluation tests: a scripted engine that answers every kind of request the evaluation sends
(decisions, continuations, plain prompts, judge steps), over the tiny tokenizer with the reflection tokens
(tests/conftest.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from selfrag import reflection as rf
from selfrag.inference.engines import GenerationRequest, Script, ScriptedEngine
from selfrag.prompting import encode_text
from selfrag.reflection import ReflectionIds


def logprobs(ids: ReflectionIds, probabilities: Mapping[str, float]) -> dict[int, float]:
    return {ids.id(token): math.log(p) for token, p in probabilities.items() if p > 0}


class World:
    """Scripts keyed on what a request contains: a passage mentioning silk (Lyon's) is irrelevant and supports
    nothing; any other passage is relevant and supports the answer."""

    def __init__(self, tokenizer, ids: ReflectionIds) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer, self.ids = tokenizer, ids
        self.silk = encode_text(tokenizer, " silk")  # a word: the same ids wherever it stands after a space

    def _has(self, request: GenerationRequest, needle: list[int]) -> bool:
        prompt, n = list(request.prompt_ids), len(needle)
        return any(prompt[i : i + n] == needle for i in range(len(prompt) - n + 1))

    def __call__(self, request: GenerationRequest) -> Script:
        ids, tok = self.ids, self.tokenizer
        eos = tok.eos_token_id
        support_ids = set(ids.ids(rf.Group.SUPPORT))
        if request.max_tokens == 1 and set(request.score_token_ids) == support_ids:  # critic judge
            good = not self._has(request, self.silk)
            probabilities = (0.9, 0.05, 0.05) if good else (0.05, 0.05, 0.9)
            return Script((ids.id(rf.FULLY_SUPPORTED if good else rf.NO_SUPPORT),),
                          (logprobs(ids, dict(zip(rf.tokens_of(rf.Group.SUPPORT), probabilities, strict=True))),))
        if not request.score_token_ids:  # plain prompt
            return Script((*encode_text(tok, "Paris is the capital."), eos))
        relevance_ids = set(ids.ids(rf.Group.RELEVANCE))
        after_relevance = request.prompt_ids[-1] in relevance_ids and ids.id(rf.PARAGRAPH_CLOSE) in request.prompt_ids
        if request.max_tokens == 1 and request.prompt_ids[-1] != ids.id(rf.PARAGRAPH_CLOSE) and not after_relevance:
            return Script((ids.id(rf.RELEVANT),), ({i: math.log(0.5) for i in ids.all_ids},))  # a flat guess
        if request.prompt_ids[-1] == ids.id(rf.PARAGRAPH_CLOSE) or after_relevance:  # a continuation of a passage
            good = not self._has(request, self.silk)
            relevance = 0.9 if good else 0.2
            tokens = [ids.id(rf.RELEVANT if good else rf.IRRELEVANT), *encode_text(tok, "Paris."),
                      ids.id(rf.FULLY_SUPPORTED if good else rf.NO_SUPPORT), ids.id("[Utility:5]")]
            support = (0.8, 0.1, 0.1) if good else (0.1, 0.1, 0.8)
            scores = [logprobs(ids, {rf.RELEVANT: relevance, rf.IRRELEVANT: 1 - relevance})]
            scores += [{} for _ in range(len(tokens) - 3)]
            scores.append(logprobs(ids, dict(zip(rf.tokens_of(rf.Group.SUPPORT), support, strict=True))))
            scores.append(logprobs(ids, {"[Utility:5]": 0.9, "[Utility:4]": 0.1}))
            skip = 1 if after_relevance else 0  # the runtime decoded the relevance token on its own first
            return Script(tuple(tokens[skip:]), tuple(scores[skip:]))
        if request.prompt_ids[-1] == ids.id(rf.NO_RETRIEVAL):  # the answer after a forced [No Retrieval]: text first
            return Script((*encode_text(tok, "Paris."), ids.id("[Utility:4]")))
        # the decision: always retrieve
        return Script((ids.id(rf.RETRIEVAL),), (logprobs(ids, {rf.RETRIEVAL: 0.9, rf.NO_RETRIEVAL: 0.1}),))


@pytest.fixture
def world_engine(reflection_tokenizer, token_ids) -> ScriptedEngine:  # type: ignore[no-untyped-def]
    return ScriptedEngine(reflection_tokenizer, token_ids, World(reflection_tokenizer, token_ids))


class Killed(Exception):
    """Stands for a kill: the run stops in the middle of a mode."""


class LoaderSpy:
    """The scripted engine behind eval's two loaders (``trained``: the Self-RAG model's, ``plain``: the base model's):
    records the config each engine was built from and every request per loader, and raises :class:`Killed` after
    ``die_after`` generate calls (a kill in the middle of a mode)."""

    killed = Killed

    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine = engine
        self.die_after: int | None = None
        self.calls = 0
        self.built: list[tuple[str, Any]] = []
        self.requests: dict[str, list[Any]] = {"trained": [], "plain": []}

    def counts(self) -> dict[str, int]:
        return {kind: len(requests) for kind, requests in self.requests.items()}

    def loader(self, kind: str) -> Callable[[Any, Any], Any]:
        outer = self

        class Spied:
            def __getattr__(self, name: str) -> Any:
                return getattr(outer.engine, name)

            def generate(self, requests: Any) -> Any:
                if outer.die_after is not None and outer.calls >= outer.die_after:
                    raise Killed
                outer.calls += 1
                outer.requests[kind] += list(requests)
                return outer.engine.generate(requests)

        def build(config: Any, model: Any) -> Any:
            outer.built.append((kind, config))
            return Spied()

        return build


@pytest.fixture
def loaders(world_engine: ScriptedEngine, monkeypatch: pytest.MonkeyPatch) -> LoaderSpy:
    """:class:`LoaderSpy` in place of ``selfrag eval``'s engine loaders."""
    from selfrag.evaluation import run as run_module

    spy = LoaderSpy(world_engine)
    monkeypatch.setattr(run_module, "build_engine", spy.loader("trained"))
    monkeypatch.setattr(run_module, "build_plain_engine", spy.loader("plain"))
    return spy
