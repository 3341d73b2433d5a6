"""The policy GRPO trains, and what decodes its rollouts.

    policy = load_policy(config)                       # an adapter goes on training; a merged model gets a new LoRA
    engine = rollout_engine(config.rollout.engine, config.model)   # "hf" or "vllm"
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfrag.artifacts import ModelMeta
from selfrag.errors import InputError
from selfrag.inference.engines.options import import_vllm
from selfrag.loading import describe_model, embedding_rows, grow_embeddings, load_base_model
from selfrag.models import resolve_model
from selfrag.reflection import ReflectionIds

from .config import RLConfig


@dataclass(frozen=True)
class Policy:
    """The model GRPO trains (a PeftModel), its tokenizer and reflection ids, and what its selfrag.json says."""

    model: Any
    tokenizer: Any
    token_ids: ReflectionIds
    meta: ModelMeta
    directory: Path  # where it was loaded from
    random_init: bool = False  # the base was built with seeded random weights (RLConfig.random_init)


def load_policy(config: RLConfig) -> Policy:
    """An adapter from ``selfrag train`` with its LoRA trainable, or a merged model wrapped in a new LoRA."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    served = describe_model(config.model)
    meta, tokenizer = served.meta, served.tokenizer
    dtype = getattr(torch, config.dtype)
    if served.is_adapter:
        base: Any = load_base_model(resolve_model(meta.base_model), dtype, random_init=config.random_init,
                                    seed=config.training.seed)
        grow_embeddings(base, embedding_rows(tokenizer, meta.token_ids))
        model = PeftModel.from_pretrained(base, str(served.directory), is_trainable=True)
    else:
        merged: Any = load_base_model(str(served.directory), dtype, random_init=config.random_init,
                                      seed=config.training.seed)
        lora = config.lora
        model = get_peft_model(merged, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                  target_modules=lora.target_modules, task_type="CAUSAL_LM"))
        meta = ModelMeta(meta.token_ids, meta.strategy, meta.prompt_template, str(served.directory), "adapter",
                         meta.calibration)
    return Policy(model, tokenizer, meta.token_ids, meta, served.directory, config.random_init)


def rollout_engine(choice: str, model: str) -> str:
    """What decodes the rollouts, ``hf`` or ``vllm`` (``rollout.engine``; ``auto`` resolved here): vLLM serves the
    policy's LoRA through ``LoRARequest``, which takes a ``tokens.strategy=reserved`` adapter only. Checked before
    any model loads: a policy vLLM cannot serve, or no vLLM, is one line naming the fix."""
    if choice == "hf":
        return "hf"
    served = describe_model(model)
    servable = served.is_adapter and served.meta.strategy == "reserved"
    if choice == "auto":
        import torch

        found = importlib.util.find_spec("vllm") is not None
        return "vllm" if servable and found and torch.cuda.is_available() else "hf"
    if not servable:
        what = f"a tokens.strategy={served.meta.strategy} adapter" if served.is_adapter else "a merged model"
        raise InputError(f"rollout.engine=vllm serves the policy's LoRA through vLLM's LoRARequest, which needs a "
                         f"tokens.strategy=reserved adapter; model {model!r} is {what}: use rollout.engine=hf")
    import_vllm("rollout.engine=vllm")
    return "vllm"
