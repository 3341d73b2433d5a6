"""Engines: one protocol (:class:`Engine`), backends behind a plain dict.

    engine = ENGINES["hf"](model_dir="runs/smollm2-selfrag")
    engine = build_engine(config.inference, "runs/smollm2-selfrag")   # inference.engine (hf|vllm|openai) + its options
    engine = load_engine("runs/smollm2-selfrag", "vllm", dtype="bfloat16")   # from Python: selfrag.load_engine

Backends import their heavy dependencies only when built, so importing this package stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from selfrag.errors import ConfigError

from .base import Engine, FinishReason, Generation, GenerationRequest, PrefixScorer, PrefixScoreRequest
from .fake import Script, ScriptedEngine
from .options import ENGINE_NAMES, EngineOptions, resolve_options


def _hf(*arguments: Any, **options: Any) -> Engine:
    from .hf import HFEngine

    return HFEngine(*arguments, **options)


def _vllm(*arguments: Any, **options: Any) -> Engine:
    from .vllm import VLLMEngine  # imports vllm itself when built: import_vllm says how to install it

    return VLLMEngine(*arguments, **options)


def _openai(*arguments: Any, **options: Any) -> Engine:
    from .openai import OpenAIEngine

    return OpenAIEngine(*arguments, **options)


def _fake(**options: Any) -> Engine:
    return ScriptedEngine(**options)


#: Engine name -> the backend's class, imported when first built: ``ENGINES["hf"](model_dir, options, batch_size=4)``.
ENGINES: dict[str, Callable[..., Engine]] = {"hf": _hf, "vllm": _vllm, "openai": _openai, "fake": _fake}


class _EngineSettings(Protocol):
    @property
    def engine(self) -> str: ...

    @property
    def engine_options(self) -> EngineOptions: ...


def build_engine(config: _EngineSettings, model: str | Path) -> Engine:
    """The engine ``config.engine`` over ``model`` with ``config.engine_options`` (one model load)."""
    return ENGINES[_known(config.engine)](model, config.engine_options)


def load_engine(model: str | Path, engine: str = "hf", **options: Any) -> Engine:
    """The engine ``engine`` (hf, vllm or openai) over ``model`` (a trained model or adapter folder), with
    ``options`` as the ``engine_options.*`` settings spell them (``device="cuda"``, ``dtype="bfloat16"``,
    ``base_url=...``): what :func:`build_engine` builds for a command's config. A wrong key or value is a
    :class:`ConfigError` naming it."""
    return ENGINES[_known(engine)](model, resolve_options(engine, None, options))


def _known(engine: str) -> str:
    if engine not in ENGINE_NAMES:
        raise ConfigError([f"engine must be one of {', '.join(ENGINE_NAMES)}, got {engine!r}"])
    return engine


def build_plain_engine(config: _EngineSettings, model: str | Path) -> Engine:
    """A model without reflection tokens (a base model) behind ``config.engine``'s decode loop: the baselines' engine.

    A model with ``selfrag.json`` is built as :func:`build_engine` builds it (asked plainly, a trained model still
    decodes with its own tokens). ``hf`` and ``vllm`` load a model without reflection tokens; ``openai`` is refused
    with the fix.
    """
    from selfrag.artifacts import load_meta
    from selfrag.models import resolve_model

    directory = Path(resolve_model(str(model)))
    if load_meta(directory) is not None:
        return build_engine(config, directory)
    if config.engine == "vllm":
        from .vllm import VLLMEngine

        return VLLMEngine.plain(directory, config.engine_options)
    if config.engine != "hf":
        raise ConfigError([f"inference.engine={config.engine} serves models with reflection tokens only; "
                           f"{str(model)!r} has none: run the base-model modes with inference.engine=hf or vllm"])
    from .hf import HFEngine

    return HFEngine.plain(directory, config.engine_options)


__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "Engine",
    "EngineOptions",
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "PrefixScoreRequest",
    "PrefixScorer",
    "Script",
    "ScriptedEngine",
    "build_engine",
    "build_plain_engine",
    "load_engine",
    "resolve_options",
]
