"""Small real models for the hf-vs-vllm parity test, built from the converted SmolLM2-135M (no downloads).

* ``make_add_merged``: strategy ``add`` trained for a few steps with the training API, then merged by
  ``selfrag.training.export.export`` (vLLM serves no adapter that adds vocabulary).
* ``make_reserved``: a base with Llama-3-style ``<|reserved_special_token_N|>`` tokens (SmolLM2 has none: they are
  added, with random rows, to a copy), and a plain LoRA adapter whose tokenizer maps the reflection strings onto
  the reserved ids; vLLM serves it unmerged through ``LoRARequest``. A minimal stand-in for the ``train``
  branch's reserved-token helper.
"""

from __future__ import annotations

from pathlib import Path

RESERVED = [f"<|reserved_special_token_{n}|>" for n in range(16)]


def make_add_merged(base: str, records: Path, workdir: Path, steps: int = 2) -> Path:
    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.export import export
    from selfrag.training.run import run

    config = load_config(
        TrainConfig,
        model=base,
        records=str(records),
        output_dir=str(workdir / "adapter"),
        training={"learning_rate": 1e-3, "max_steps": steps, "batch_size": 1, "logging_steps": 1,
                  "eval_fraction": 0.0, "max_length": 256, "save_steps": 1000},
        lora={"r": 8, "alpha": 16, "dropout": 0.0},
    )
    run(config)
    return export(workdir / "adapter", workdir / "merged")


def make_reserved_base(base: str, workdir: Path, seed: int = 0) -> Path:
    """A copy of ``base`` with 16 added ``<|reserved_special_token_N|>`` tokens whose rows are random, not trained."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    base_dir = workdir / "reserved-base"
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.add_special_tokens({"additional_special_tokens": RESERVED})
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    known = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():  # distinct rows: the parity test compares the reflection tokens' probabilities
        weight = model.get_input_embeddings().weight
        spread = torch.randn(len(tokenizer) - known, weight.shape[1]) * weight[:known].std(0)
        weight[known:] = weight[:known].mean(0) + spread
    model.save_pretrained(str(base_dir))
    tokenizer.save_pretrained(str(base_dir))
    return base_dir


def make_reserved_adapter(base_dir: Path, out: Path, seed: int) -> Path:
    """A plain LoRA adapter (all linear layers, random B factors) whose tokenizer names the reserved ids."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selfrag.artifacts import ModelMeta, save_meta
    from selfrag.reflection import TOKENS, reflection_ids
    from selfrag.training.tokens import _rename_added_tokens

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    ids = {tokenizer.convert_tokens_to_ids(name): token for name, token in zip(RESERVED[-15:], TOKENS, strict=True)}
    _rename_added_tokens(tokenizer, ids)
    token_ids = reflection_ids(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
    with torch.no_grad():  # stand-in for training: move the B factors so the adapter changes the outputs
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.02)
    peft_model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    save_meta(out, ModelMeta(token_ids, "reserved", "auto", str(base_dir), "adapter"))
    return out


def make_reserved_trained(base_dir: Path, records: Path, out: Path, steps: int = 2) -> Path:
    """A ``selfrag train`` adapter with ``tokens.strategy=reserved`` on ``base_dir`` (:func:`make_reserved_base`):
    LoRA on the linear layers and on ``embed_tokens`` (the head is tied), as the 8B recipe trains it."""
    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    config = load_config(
        TrainConfig,
        model=str(base_dir),
        records=str(records),
        output_dir=str(out),
        tokens={"strategy": "reserved"},
        training={"learning_rate": 1e-3, "max_steps": steps, "batch_size": 1, "logging_steps": 1,
                  "eval_fraction": 0.0, "max_length": 256, "save_steps": 1000},
        lora={"r": 8, "alpha": 16, "dropout": 0.0},
    )
    run(config)
    return out
