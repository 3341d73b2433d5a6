"""Scripted engines for the runtime tests: continuations keyed by the evidence that ends the prompt."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import GenerationRequest, Script, ScriptedEngine
from selfrag.inference.runtime import SelfRAG
from selfrag.prompting import encode_prompt, encode_text, passage_ids
from selfrag.reflection import ReflectionIds
from selfrag.retrieval import Hit
from selfrag.trajectory import Passage

#: Verdict distributions the runtime tests script again and again: a clear [Relevant], a clear [Fully supported] or
#: [No support / Contradictory], a clear [Utility:5].
RELEVANT = {rf.RELEVANT: 0.9, rf.IRRELEVANT: 0.1}
FULL = {rf.FULLY_SUPPORTED: 0.9, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.05}
NONE = {rf.FULLY_SUPPORTED: 0.05, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.9}
UTILITY_5 = {"[Utility:5]": 0.9, "[Utility:1]": 0.1}
#: The passages the runtime tests retrieve.
PARIS = Passage("p-paris", "Paris", "Paris is the capital of France.")
LYON = Passage("p-lyon", "Lyon", "Lyon is a city in France.")
NICE = Passage("p-nice", "Nice", "Nice lies on the coast.")


class FixedRetriever:
    """Returns the same passages, in order, for every query; records the queries."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = list(passages)
        self.queries: list[str] = []

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.queries += list(queries)
        return [[Hit(p, 10.0 - i) for i, p in enumerate(self.passages[:k])] for _ in queries]


def logprobs(ids: ReflectionIds, probabilities: Mapping[str, float]) -> dict[int, float]:
    return {ids.id(token): math.log(p) for token, p in probabilities.items() if p > 0}


class Segments:
    """Builds scripts from ``(token or text, {token: probability})`` steps."""

    def __init__(self, tokenizer, ids: ReflectionIds) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer, self.ids = tokenizer, ids

    def script(self, *steps: str | tuple[str, Mapping[str, float]]) -> Script:
        tokens: list[int] = []
        scores: list[dict[int, float]] = []
        for step in steps:
            item, probabilities = (step, {}) if isinstance(step, str) else step
            if rf.is_reflection_token(item):
                tokens.append(self.ids.id(item))
                scores.append(logprobs(self.ids, probabilities or {item: 0.9}))
            else:
                body = encode_text(self.tokenizer, item)
                tokens += body
                scores += [{} for _ in body]
        return Script(tuple(tokens), tuple(scores))


class KeyedEngine(ScriptedEngine):
    """Answers a request with the script of the longest registered key that ends its prompt.

    A key is a tuple of ids (a passage's ``[Retrieval]<paragraph>…</paragraph>``, or a prompt). A prompt that
    continues a script by up to ``resume`` of its own ids (a pruned branch resuming) gets the rest of it.
    """

    def __init__(self, tokenizer, ids: ReflectionIds, table: Mapping[tuple[int, ...], Script],  # type: ignore[no-untyped-def]
                 fallback: Callable[[GenerationRequest], Script] | None = None, resume: int = 4) -> None:
        self.table, self.fallback, self.resume = dict(table), fallback, resume
        super().__init__(tokenizer, ids, self._find)

    def _find(self, request: GenerationRequest) -> Script:
        prompt = request.prompt_ids
        for tail in range(self.resume + 1):
            end = len(prompt) - tail
            for key in sorted(self.table, key=len, reverse=True):
                script = self.table[key]
                if end >= len(key) and prompt[end - len(key) : end] == key and prompt[end:] == script.token_ids[:tail]:
                    return Script(script.token_ids[tail:], tuple(script.logprobs[tail:]))
        if self.fallback is not None:
            return self.fallback(request)
        prompt_text = self.tokenizer.decode(list(prompt), skip_special_tokens=False)
        raise KeyError(f"no script for prompt ending {prompt_text[-80:]!r}")


def passage_key(tokenizer, ids: ReflectionIds, passage: Passage) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    return tuple(passage_ids(tokenizer, ids, passage))


def prompt_key(tokenizer, ids: ReflectionIds, question: str, key: Any) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    """The ids that end a prompt for a :func:`keyed_runtime` table key (see there)."""
    if key == "prompt":
        return tuple(encode_prompt(tokenizer, question))
    if key == "no_retrieval":  # the prompt + [No Retrieval] (on_all_irrelevant=no_retrieval)
        return tuple(encode_prompt(tokenizer, question)) + (ids.id(rf.NO_RETRIEVAL),)
    if isinstance(key, Passage):
        return passage_key(tokenizer, ids, key)
    passage, text, token = key  # a continuation after ``passage`` without new evidence
    generated = Segments(tokenizer, ids).script(*text).token_ids[:-1]
    return passage_key(tokenizer, ids, passage) + generated + (ids.id(token),)


def keyed_runtime(tokenizer, ids: ReflectionIds, question: str,  # type: ignore[no-untyped-def]
                  table: Mapping[Any, Sequence[Any]] | Iterable[tuple[Any, Sequence[Any]]],
                  passages: Sequence[Passage], **config: Any) -> tuple[SelfRAG, KeyedEngine, FixedRetriever]:
    """A runtime over a :class:`KeyedEngine` and a :class:`FixedRetriever` of ``passages``, with ``config``.

    ``table`` (a mapping, or pairs) gives the steps (:meth:`Segments.script`) scripted after what ends a prompt:
    ``"prompt"`` (the question's prompt), ``"no_retrieval"`` (that prompt + [No Retrieval]), a passage (its evidence
    block), or ``(passage, the steps generated after it, the decision token)``: a continuation without new evidence.
    """
    segments = Segments(tokenizer, ids)
    pairs = table.items() if isinstance(table, Mapping) else table
    keyed = {prompt_key(tokenizer, ids, question, key): segments.script(*steps) for key, steps in pairs}
    engine = KeyedEngine(tokenizer, ids, keyed)
    retriever = FixedRetriever(list(passages))
    return SelfRAG(engine, retriever, InferenceConfig(**config)), engine, retriever


def critic_engine(tokenizer, supported: str, answer: str) -> ScriptedEngine:  # type: ignore[no-untyped-def]
    """A scripted base model for the prompted critic: every passage relevant ("yes"), ``supported`` to the support
    question ("fully", "no", ...), utility 5, and ``answer`` to everything else."""

    def script(request: GenerationRequest) -> Script:
        prompt = tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        reply = "5" if "How useful" in prompt else supported if "Is the statement supported" in prompt else \
            "yes" if "Does the passage contain" in prompt else answer
        return Script(tuple(encode_text(tokenizer, reply)))

    return ScriptedEngine(tokenizer, None, script)  # type: ignore[arg-type]
