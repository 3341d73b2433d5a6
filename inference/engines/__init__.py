"""Engines: one protocol (:class:`Engine`), backends behind a plain dict.

    engine = ENGINES["hf"](model_dir="runs/smollm2-selfrag")
    engine = build_engine(config, "runs/smollm2-selfrag")   # config.engine (hf|vllm|openai) + config.engine_options
    engine = load_engine("runs/smollm2-selfrag", "vllm", dtype="bfloat16")   # from Python: selfrag.load_engine

Backends import their heavy dependencies only when built, so importing this package stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from selfrag.config import from_dict, nested_problems
from selfrag.errors import ConfigError

from .base import Engine, FinishReason, Generation, GenerationRequest
from .fake import Script, ScriptedEngine
from .options import ENGINE_NAMES, EngineOptions


def _hf(**options: Any) -> Engine:
    from .hf import HFEngine

    return HFEngine(**options)


def _vllm(**options: Any) -> Engine:
    from .vllm import VLLMEngine  # imports vllm itself when built: import_vllm says how to install it

    return VLLMEngine(**options)


def _openai(**options: Any) -> Engine:
    from .openai import OpenAIEngine

    return OpenAIEngine(**options)


def _fake(**options: Any) -> Engine:
    return ScriptedEngine(**options)


#: Engine name -> factory taking the backend's keyword options.
ENGINES: dict[str, Callable[..., Engine]] = {"hf": _hf, "vllm": _vllm, "openai": _openai, "fake": _fake}


class _EngineSettings(Protocol):
    @property
    def engine(self) -> str: ...

    @property
    def engine_options(self) -> EngineOptions: ...


def engine_arguments(name: str, options: EngineOptions) -> dict[str, Any]:
    """The keyword arguments of backend ``name`` taken from ``options`` (the others are ignored)."""
    if name == "hf":
        return {
            "dtype": options.dtype,
            "device": options.device,
            "batch_size": options.batch_size,
            "seed": options.seed,
        }
    if name == "vllm":
        return {
            "dtype": options.dtype,
            "device": "cpu" if options.device == "cpu" else "auto",
            "seed": options.seed,
            "tensor_parallel_size": options.tensor_parallel_size,
            "pipeline_parallel_size": options.pipeline_parallel_size,
            "gpu_memory_utilization": options.gpu_memory_utilization,
            "max_model_len": options.max_model_len,
            "enforce_eager": options.enforce_eager,
            "enable_prefix_caching": options.enable_prefix_caching,
            "max_loras": options.max_loras,
            "max_lora_rank": options.max_lora_rank,
            "adapters": dict(options.adapters),
            "top_logprobs": options.top_logprobs,
            "vllm_args": dict(options.vllm_args),
        }
    if name == "openai":
        return {
            "base_url": options.base_url,
            "served_model": options.served_model,
            "api_key_env": options.api_key_env,
            "concurrency": options.concurrency,
            "timeout": options.timeout,
            "max_retries": options.max_retries,
            "backoff": options.backoff,
            "top_logprobs": options.top_logprobs,
            "seed": options.seed,
            "adapters": dict(options.adapters),
        }
    raise ConfigError([f"engine must be one of {list(ENGINE_NAMES)}, got {name!r}"])


def build_engine(config: _EngineSettings, model: str | Path) -> Engine:
    """The engine ``config.engine`` over ``model`` with ``config.engine_options`` (one model load)."""
    problems = config.engine_options.validate("engine_options.")
    if problems:
        raise ConfigError(problems)
    arguments = engine_arguments(config.engine, config.engine_options)
    return ENGINES[config.engine](model_dir=model, **arguments)


@dataclass(frozen=True)
class _Chosen:
    engine: str
    engine_options: EngineOptions


def load_engine(model: str | Path, engine: str = "hf", **options: Any) -> Engine:
    """The engine ``engine`` (hf, vllm or openai) over ``model`` (a trained model or adapter folder), with
    ``options`` as the ``engine_options.*`` settings spell them (``device="cuda"``, ``dtype="bfloat16"``,
    ``base_url=...``): what :func:`build_engine` builds for a command's config. A wrong key or value is a
    :class:`ConfigError` naming it."""
    if engine not in ENGINE_NAMES:
        raise ConfigError([f"engine must be one of {', '.join(ENGINE_NAMES)}, got {engine!r}"])
    problems = nested_problems(EngineOptions, options, "engine_options.")
    if problems:
        raise ConfigError(problems)
    return build_engine(_Chosen(engine, from_dict(EngineOptions, options)), model)


def build_plain_engine(config: _EngineSettings, model: str | Path) -> Engine:
    """A model without reflection tokens (a base model) behind ``config.engine``'s decode loop: the baselines' engine.

    A model with ``selfrag.json`` is built as :func:`build_engine` builds it (asked plainly, a trained model still
    decodes with its own tokens). Only ``hf`` loads a model without reflection tokens; the others are refused with
    the fix (``EvalConfig.validate`` says it before anything loads).
    """
    from selfrag.artifacts import load_meta
    from selfrag.models import resolve_model

    directory = Path(resolve_model(str(model)))
    if load_meta(directory) is not None:
        return build_engine(config, directory)
    if config.engine != "hf":
        raise ConfigError([f"engine={config.engine} serves models with reflection tokens only; {str(model)!r} has "
                           "none: run the base-model modes with engine=hf"])
    problems = config.engine_options.validate("engine_options.")
    if problems:
        raise ConfigError(problems)
    from .hf import HFEngine

    options = config.engine_options
    return HFEngine.plain(directory, dtype=options.dtype, device=options.device, seed=options.seed)


__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "Engine",
    "EngineOptions",
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "Script",
    "ScriptedEngine",
    "build_engine",
    "build_plain_engine",
    "engine_arguments",
    "load_engine",
]
