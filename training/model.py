"""The model a training run starts from: the base loaded, given the reflection tokens, wrapped in LoRA.

    prepared = prepare_model(config)   # PreparedModel: model, tokenizer, meta (reflection ids, template, strategy)

``tokens.strategy`` ``add`` grows the vocabulary and trains the new rows through PEFT ``trainable_token_indices``;
``reserved`` maps the strings onto unused reserved tokens and trains a plain LoRA that vLLM serves (see
:mod:`selfrag.training.tokens`). ``method: full`` trains every weight instead of an adapter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from selfrag.artifacts import ModelMeta
from selfrag.errors import ConfigError
from selfrag.loading import load_base_model
from selfrag.models import ALIASES, resolve_model
from selfrag.prompting import resolve_template
from selfrag.reflection import ReflectionIds
from selfrag.training.config import TrainConfig
from selfrag.training.tokens import (
    embedding_module_names,
    init_reserved_lora,
    is_tied,
    linear_module_names,
    prepare_tokens,
    resolve_strategy,
    set_rows_to_mean,
    set_rows_to_words,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedModel:
    """The LoRA-wrapped model before training, with its tokenizer and what its ``selfrag.json`` will record (reflection
    ids, the resolved tokens.strategy and template, the base, the kind)."""

    model: Any
    tokenizer: Any
    meta: ModelMeta


def prepare_model(config: TrainConfig) -> PreparedModel:
    """Load the base, give it the reflection tokens, wrap it in LoRA; seeded, so repeatable."""
    from peft import get_peft_model
    from transformers import AutoTokenizer, set_seed

    set_seed(config.training.seed)
    base_path = resolve_model(config.model)
    logger.info("loading base model %s from %s", config.model, base_path)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = load_base_model(base_path, random_init=config.random_init, seed=config.training.seed,
                            **model_load_options(config))
    if config.quantization:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    strategy = resolve_strategy(tokenizer, config.tokens.strategy)
    token_ids = prepare_tokens(model, tokenizer, strategy, init=config.tokens.init)
    template = resolve_template(tokenizer, config.prompt_template)
    if config.method == "full":
        if strategy == "reserved":  # no LoRA to hold the start values: the reserved rows themselves are set
            start_reserved_rows(model, tokenizer, token_ids, config.tokens.init)
        model.requires_grad_(True)
        total = sum(parameter.numel() for parameter in model.parameters())
        trainable = total
    else:
        model = get_peft_model(model, lora_config(config, token_ids, model, strategy))
        if strategy == "reserved":
            init_reserved_lora(model, token_ids, _base_rows(tokenizer))
        trainable, total = model.get_nb_trainable_parameters()
    logger.info("method=%s, tokens.strategy=%s; trainable parameters: %d of %d", config.method, strategy,
                trainable, total)
    kind: Literal["adapter", "merged"] = "merged" if config.method == "full" else "adapter"
    meta = ModelMeta(token_ids, strategy, template, base_model_name(config.model, base_path), kind)
    return PreparedModel(model, tokenizer, meta)


def start_reserved_rows(model: Any, tokenizer: Any, token_ids: ReflectionIds, init: str) -> None:
    """method=full with strategy reserved: the reserved rows start at the mean of the real rows (or at their
    words' embeddings, ``tokens.init=words``), as the LoRA of method lora makes them start."""
    ids = sorted(token_ids.all_ids)
    set_rows_to_mean(model, ids, _base_rows(tokenizer))
    if init == "words":
        set_rows_to_words(model, tokenizer, {i: token for token, i in token_ids.token_to_id.items()})


def model_load_options(config: TrainConfig) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments: the dtype, and a ``BitsAndBytesConfig`` for QLoRA."""
    options: dict[str, Any] = {"dtype": getattr(torch, config.dtype)}
    if config.quantization:
        from transformers import BitsAndBytesConfig

        settings = dict(config.quantization)
        for key in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
            if isinstance(settings.get(key), str):
                settings[key] = getattr(torch, settings[key])
        options["quantization_config"] = BitsAndBytesConfig(**settings)
    return options


def lora_config(config: TrainConfig, token_ids: ReflectionIds, model: Any, strategy: str = "add") -> Any:
    """PEFT ``LoraConfig`` for a strategy.

    ``add``: LoRA plus the reflection rows trained through ``trainable_token_indices`` (input embeddings; the
    head too when untied). ``reserved``: a plain LoRA that vLLM loads as a ``LoRARequest``: the linear layers
    plus ``embed_tokens`` and ``lm_head`` (see ``tokens.init_reserved_lora`` for how only the reflection rows
    move). vLLM's loader accepts nothing else: no ``trainable_tokens_delta``, no ``modules_to_save``.
    """
    from peft import LoraConfig

    options: dict[str, Any] = {
        "r": config.lora.r, "lora_alpha": config.lora.alpha, "lora_dropout": config.lora.dropout,
        "task_type": "CAUSAL_LM",
    }
    if strategy == "reserved":
        embedding, head = embedding_module_names(model)
        linear = config.lora.target_modules
        linear = linear_module_names(model) if linear == "all-linear" else list(linear)
        options["target_modules"] = sorted({*linear, embedding, *([head] if head else [])})
    else:
        ids = list(token_ids.all_ids)
        # With tied weights PEFT wraps the head with an adapter tied to the embedding one; an untied head
        # needs its own entry, else the new tokens could be read but never predicted.
        trainable = {"embed_tokens": ids} if is_tied(model) else {"embed_tokens": ids, "lm_head": ids}
        options.update(target_modules=config.lora.target_modules, trainable_token_indices=trainable)
    if config.lora.layers is not None:
        options.update(top_layers(model, config.lora.layers, config.lora.target_modules, strategy))
    return LoraConfig(**options, **config.peft)


def top_layers(model: Any, layers: int | float, target_modules: str | list[str], strategy: str) -> dict[str, Any]:
    """``lora.layers``: the ``LoraConfig`` options that adapt the top transformer blocks only, ``layers`` of them (an
    int) or that share of them (a float in (0, 1], rounded, at least one).

    PEFT takes ``layers_to_transform`` with a list of module names only, so ``all-linear`` is spelled out.
    """
    if strategy == "reserved":  # tokens.strategy=auto resolved to reserved (an explicit one is refused by validate)
        raise ConfigError([
            f"lora.layers={layers}: this base has reserved tokens, so tokens.strategy=auto chose 'reserved', whose "
            "reflection rows train through the input side that lora.layers detaches; set tokens.strategy=add or "
            "remove lora.layers"
        ])
    total = block_count(model)
    if isinstance(layers, float):
        count = min(total, max(1, round(layers * total)))
    elif layers > total:
        raise ConfigError([f"lora.layers={layers}, but this base has {total} transformer blocks; set "
                           f"lora.layers to at most {total}, a share such as 0.5, or null for every block"])
    else:
        count = layers
    names = linear_module_names(model) if target_modules == "all-linear" else target_modules
    if isinstance(names, str):
        raise ConfigError([f"lora.layers needs lora.target_modules as a list of module names or 'all-linear', "
                           f"got the regular expression {names!r}"])
    logger.info("lora.layers=%s: LoRA on the top %d of %d blocks", layers, count, total)
    return {"target_modules": list(names), "layers_to_transform": list(range(total - count, total))}


def block_count(model: Any) -> int:
    """The base's number of transformer blocks (its text model's, for a multimodal config)."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)



def _base_rows(tokenizer: Any) -> int:
    """Rows of real (not added/special) tokens: what the reserved rows' mean start value is taken over."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return int(backend.get_vocab_size(with_added_tokens=False)) if backend is not None else len(tokenizer)



def base_model_name(name: str, resolved: str) -> str:
    """What ``selfrag.json`` records as the base: the built-in name, else an absolute path, else the hub id."""
    if name.lower() in ALIASES:
        return name.lower()
    path = Path(resolved)
    return str(path.resolve()) if path.is_dir() else resolved


