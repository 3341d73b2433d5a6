"""A scripted engine for tests: hand-written continuations with hand-set log-probs, no model.

    script = {prompt_ids: Script(token_ids=(retrieval_id,), logprobs=({retrieval_id: -0.1, no_retrieval_id: -2.3},))}
    engine = ScriptedEngine(tokenizer, token_ids, script)
    engine.generate([...]); assert len(engine.calls) == 1

It behaves like a real backend: stops at a stop id (kept as the last token), at eos, or after
``max_tokens``, and reports only the requested score ids. Every batch it gets is recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from selfrag.reflection import ReflectionIds

from .base import FinishReason, Generation, GenerationRequest, finish_reason_of


@dataclass(frozen=True)
class Script:
    """A scripted continuation: ids, and per position the log-probs the engine may report."""

    token_ids: tuple[int, ...]
    logprobs: tuple[Mapping[int, float], ...] = field(default=())

    def after(self, prompt_ids: Sequence[int]) -> Script:
        """The rest of this script for a prompt that already ends with its first ids (a branch resumed after its
        relevance verdict is sent its own verdict back), else the whole script."""
        for start in range(len(self.token_ids), 0, -1):
            if len(prompt_ids) >= start and tuple(prompt_ids[-start:]) == self.token_ids[:start]:
                return Script(self.token_ids[start:], tuple(self.logprobs[start:]))
        return self


Scripter = Callable[[GenerationRequest], Script]


class ScriptedEngine:
    """An :class:`~selfrag.inference.engines.base.Engine` that replays scripts.

    ``script`` is a function from a request to its :class:`Script`, or a table keyed by prompt ids.
    ``calls`` holds every ``generate`` batch, so tests can count engine calls and batch sizes.
    """

    def __init__(
        self,
        tokenizer: Any,
        token_ids: ReflectionIds,
        script: Scripter | Mapping[tuple[int, ...], Script],
        prompt_template: str = "auto",
        name: str = "fake",
        calibration: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.token_ids = token_ids
        self.prompt_template = prompt_template
        self.calibration = calibration
        self.name = name
        self.calls: list[list[GenerationRequest]] = []
        self._script = script
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids: tuple[int, ...] = () if eos is None else (int(eos),)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.calls.append(list(requests))
        return [self._generate(request) for request in requests]

    def _lookup(self, request: GenerationRequest) -> Script:
        if callable(self._script):
            return self._script(request)
        try:
            return self._script[tuple(request.prompt_ids)]
        except KeyError:
            prompt = self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
            raise KeyError(f"no script for prompt {prompt!r}") from None

    def _check(self, request: GenerationRequest, position: int, token_id: int) -> None:
        """A script must be a decode a real engine could produce under the request's constraints."""
        if token_id in request.banned_token_ids:
            raise ValueError(f"the script emits banned id {token_id} at position {position}; no engine would")
        if position < request.min_tokens and token_id in (*request.stop_token_ids, *self.eos_ids):
            raise ValueError(
                f"the script stops with id {token_id} at position {position}, before min_tokens={request.min_tokens}"
            )

    def _generate(self, request: GenerationRequest) -> Generation:
        started = time.monotonic()
        script = self._lookup(request)
        tokens: list[int] = []
        scores: list[dict[int, float]] = []
        finish: FinishReason = "length"
        for position, token_id in enumerate(script.token_ids[: request.max_tokens]):
            self._check(request, position, int(token_id))
            available = script.logprobs[position] if position < len(script.logprobs) else {}
            tokens.append(int(token_id))
            scores.append({i: float(available[i]) for i in request.score_token_ids if i in available})
            reason = finish_reason_of(int(token_id), request.stop_token_ids, self.eos_ids)
            if reason is not None:
                finish = reason
                break
        return Generation(
            token_ids=tuple(tokens),
            text=self.tokenizer.decode(tokens, skip_special_tokens=False),
            score_logprobs=tuple(scores),
            finish_reason=finish,
            prompt_tokens=len(request.prompt_ids),
            seconds=time.monotonic() - started,
        )
