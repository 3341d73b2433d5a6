"""Engines for evaluation: the trained model (reflection tokens) and its base model (no reflection tokens).

The baselines run on the base model with the same decode loop (``HFEngine``'s), so every mode differs only in
what it asks the model, not in how the model is run. :class:`CountingEngine` counts calls and tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfrag.artifacts import load_meta
from selfrag.errors import ModelNotFoundError
from selfrag.inference.engines.base import Engine, Generation, GenerationRequest
from selfrag.models import resolve_model


def load_trained(model: str) -> Engine:
    from selfrag.inference.engines.hf import HFEngine

    return HFEngine(resolve_model(model))


def base_model_of(model: str) -> str:
    """The base model named in a trained model's ``selfrag.json``."""
    meta = load_meta(resolve_model(model))
    if meta is None:
        raise ModelNotFoundError(f"{model!r} has no selfrag.json; give base_model=... explicitly")
    return meta.base_model


def load_plain(model: str) -> Engine:
    """A model without reflection tokens (a base model) behind the same decode loop as :class:`HFEngine`."""
    from selfrag.inference.engines import hf

    directory = Path(resolve_model(model))
    if load_meta(directory) is not None:
        return hf.HFEngine(directory)  # a trained model asked plainly still decodes with its own tokens
    return hf.HFEngine.plain(directory)


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0


class CountingEngine:
    """Wraps an engine; counts engine calls, prompt and generated tokens since the last :meth:`reset`."""

    def __init__(self, engine: Engine) -> None:
        self.inner = engine
        self.usage = Usage()

    def __getattr__(self, name: str) -> Any:  # tokenizer, token_ids, prompt_template, name, calibration, ...
        return getattr(self.inner, name)

    def reset(self) -> Usage:
        usage, self.usage = self.usage, Usage()
        return usage

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        generations = self.inner.generate(requests)
        self.usage.calls += 1
        self.usage.prompt_tokens += sum(len(request.prompt_ids) for request in requests)
        self.usage.generated_tokens += sum(len(generation.token_ids) for generation in generations)
        return generations
