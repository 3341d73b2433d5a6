"""Evaluation's engine helpers: :func:`base_model_of` (a trained model's base), :class:`CountingEngine` (usage).

The engines themselves are inference's: ``build_engine`` (the trained model, on ``engine`` hf, vllm or openai) and
``build_plain_engine`` (the base model, no reflection tokens, behind the same decode loop), so every mode differs
only in what it asks the model, not in how the model is run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from selfrag.artifacts import load_meta
from selfrag.errors import ModelNotFoundError
from selfrag.inference.engines.base import Engine, Generation, GenerationRequest
from selfrag.models import resolve_model


def base_model_of(model: str) -> str:
    """The base model named in a trained model's ``selfrag.json``."""
    meta = load_meta(resolve_model(model))
    if meta is None:
        raise ModelNotFoundError(f"{model!r} has no selfrag.json; give base_model=... explicitly")
    return meta.base_model


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    #: the prompt ids the engine computed: fewer than prompt_tokens where it reused kept KV (Generation's figure)
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0


class CountingEngine:
    """Wraps an engine; counts engine calls, prompt tokens (sent and computed) and generated tokens since the last
    :meth:`reset`."""

    def __init__(self, engine: Engine) -> None:
        self.inner = engine
        self.usage = Usage()

    # tokenizer, token_ids, prompt_template, name, calibration, ...; and score_prefixes where the engine has one (the
    # label scoring's, uncounted: no mode's usage), so a wrapped engine is a PrefixScorer exactly when its engine is
    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def reset(self) -> Usage:
        usage, self.usage = self.usage, Usage()
        return usage

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        generations = self.inner.generate(requests)
        self.usage.calls += 1
        self.usage.prompt_tokens += sum(len(request.prompt_ids) for request in requests)
        self.usage.prompt_tokens_computed += sum(generation.prompt_tokens_computed for generation in generations)
        self.usage.generated_tokens += sum(len(generation.token_ids) for generation in generations)
        return generations
