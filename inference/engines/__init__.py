"""Engines: one protocol (:class:`Engine`), backends behind a plain dict.

    engine = ENGINES["hf"](model_dir="runs/smollm2-selfrag")

Backends import their heavy dependencies only when built, so importing this package stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Engine, FinishReason, Generation, GenerationRequest
from .fake import Script, ScriptedEngine


def _hf(**options: Any) -> Engine:
    from .hf import HFEngine

    return HFEngine(**options)


def _fake(**options: Any) -> Engine:
    return ScriptedEngine(**options)


#: Engine name -> factory taking the backend's keyword options.
ENGINES: dict[str, Callable[..., Engine]] = {"hf": _hf, "fake": _fake}

__all__ = ["ENGINES", "Engine", "FinishReason", "Generation", "GenerationRequest", "Script", "ScriptedEngine"]
