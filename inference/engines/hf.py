"""Transformers backend (the CPU default): a hand-written batched decode loop with a KV cache.

    engine = HFEngine("runs/smollm2-selfrag")          # a directory written by ``selfrag train``
    [generation] = engine.generate([GenerationRequest(prompt_ids, max_tokens=64)])

Loads a merged model (``config.json`` + ``selfrag.json``) or a LoRA adapter (``adapter_config.json`` +
``selfrag.json``: the base named in ``selfrag.json`` is loaded, resized to the adapter's tokenizer,
and the adapter applied, including rows trained through PEFT ``trainable_token_indices``).
Log-probs of score ids come from an fp32 ``log_softmax`` of each step's logits (bf16 gave ties).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from selfrag.artifacts import load_meta
from selfrag.errors import ModelNotFoundError
from selfrag.models import resolve_model
from selfrag.reflection import check_ids_match

from .base import FinishReason, Generation, GenerationRequest, finish_reason_of

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Row:
    """Decode state of one request in a batch."""

    tokens: list[int] = field(default_factory=list)
    scores: list[dict[int, float]] = field(default_factory=list)
    finish: FinishReason | None = None


class HFEngine:
    """Decode with a transformers causal LM trained by selfrag (merged directory or LoRA adapter)."""

    def __init__(
        self,
        model_dir: str | Path,
        dtype: str = "float32",
        device: str = "cpu",
        batch_size: int = 8,
        seed: int = 0,
        merge: bool = True,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        directory = Path(resolve_model(str(model_dir)))
        meta = load_meta(directory)
        if meta is None:
            raise ModelNotFoundError(
                f"{str(model_dir)!r} has no selfrag.json, so it has no reflection tokens; "
                "train one with `selfrag train` (or export a trained one with `selfrag export`) and load that"
            )
        self.tokenizer, self.model = _load(directory, meta.kind, meta.base_model, DTYPES[dtype], device, merge)
        check_ids_match(self.tokenizer, meta.token_ids)
        self.model.eval()
        self.token_ids = meta.token_ids
        self.prompt_template = meta.prompt_template
        self.calibration = meta.calibration  # the runtime's defaults measured by selfrag calibrate (None: none)
        self.name = f"hf:{directory.name}"
        self.device = device
        self.batch_size = batch_size
        self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self.pad_id = _pad_id(self.tokenizer, self.eos_ids)
        self._generator = torch.Generator(device="cpu").manual_seed(seed)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Decode ``requests``; requests with equal decode settings share batches of ``batch_size``."""
        results: list[Generation | None] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, request in enumerate(requests):
            if request.adapter is not None:
                raise ValueError(f"HFEngine serves one model; request.adapter must be None, got {request.adapter!r}")
            groups.setdefault(request.decode_key, []).append(index)
        for indices in groups.values():
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                for index, generation in zip(chunk, self._decode([requests[i] for i in chunk]), strict=True):
                    results[index] = generation
        return [generation for generation in results if generation is not None]

    @torch.inference_mode()
    def _decode(self, batch: Sequence[GenerationRequest]) -> list[Generation]:
        """Greedy (or sampled) decode of requests that share max_tokens, stop ids, temperature, score ids."""
        started = time.monotonic()
        settings = batch[0]
        input_ids, attention_mask = self._left_pad([request.prompt_ids for request in batch])
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (batch, length)
        rows = [_Row() for _ in batch]
        cache = None
        for _ in range(settings.max_tokens):
            output = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            cache = output.past_key_values
            logits = output.logits[:, -1, :].float()  # (batch, vocab), fp32 so close scores do not tie
            next_ids = self._choose(logits, settings.temperature)
            self._record(rows, next_ids.tolist(), torch.log_softmax(logits, dim=-1), settings)
            if all(row.finish is not None for row in rows):
                break
            input_ids = next_ids.unsqueeze(-1)  # finished rows keep decoding; their tokens are ignored
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(batch), 1))], dim=-1)
            position_ids = position_ids[:, -1:] + 1
        seconds = time.monotonic() - started
        return [self._generation(row, request, seconds) for row, request in zip(rows, batch, strict=True)]

    def _left_pad(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(prompt) for prompt in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _choose(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        if temperature == 0:
            return logits.argmax(dim=-1)
        probabilities = torch.softmax(logits / temperature, dim=-1).cpu()
        return torch.multinomial(probabilities, 1, generator=self._generator).squeeze(-1).to(logits.device)

    def _record(
        self, rows: list[_Row], next_ids: list[int], logprobs: torch.Tensor, settings: GenerationRequest
    ) -> None:
        vocabulary = logprobs.shape[-1]
        score_ids = [token_id for token_id in settings.score_token_ids if 0 <= token_id < vocabulary]
        picked = logprobs[:, score_ids].tolist() if score_ids else [[] for _ in rows]
        for row, token_id, values in zip(rows, next_ids, picked, strict=True):
            if row.finish is not None:
                continue
            row.tokens.append(int(token_id))
            row.scores.append(dict(zip(score_ids, values, strict=True)))
            row.finish = finish_reason_of(int(token_id), settings.stop_token_ids, self.eos_ids)
            if row.finish is None and len(row.tokens) >= settings.max_tokens:
                row.finish = "length"

    def _generation(self, row: _Row, request: GenerationRequest, seconds: float) -> Generation:
        return Generation(
            token_ids=tuple(row.tokens),
            text=self.tokenizer.decode(row.tokens, skip_special_tokens=False),
            score_logprobs=tuple(row.scores),
            finish_reason=row.finish or "length",
            prompt_tokens=len(request.prompt_ids),
            seconds=seconds,
        )


def _load(
    directory: Path, kind: str, base_model: str, dtype: torch.dtype, device: str, merge: bool
) -> tuple[Any, Any]:
    """(tokenizer, model) of a merged directory or of an adapter on its base (folded in when ``merge``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    is_adapter = (directory / "adapter_config.json").is_file()
    if is_adapter != (kind == "adapter"):
        logger.warning("selfrag.json says kind=%s but %s %s adapter_config.json", kind, directory,
                       "has" if is_adapter else "has no")
    if not is_adapter:
        merged: Any = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype)
        return tokenizer, merged.to(device)
    from peft import PeftModel

    base: Any = AutoModelForCausalLM.from_pretrained(resolve_model(base_model), dtype=dtype)
    # The adapter was trained on a base resized to its tokenizer; its trained rows for the new ids
    # (trainable_token_indices) are restored by PeftModel over whatever the resize put there.
    if base.get_input_embeddings().weight.shape[0] != len(tokenizer):
        base.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    adapted: Any = PeftModel.from_pretrained(base, str(directory))
    if merge:
        # The engine serves one model: folding the LoRA deltas and trained rows into the weights removes
        # PEFT's per-layer overhead from every decoding step (see benchmarks/short_form.py).
        adapted = adapted.merge_and_unload()
    return tokenizer, adapted.to(device)


def _eos_ids(tokenizer: Any, model: Any) -> tuple[int, ...]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(item) for item in value)
    return tuple(sorted(ids))


def _pad_id(tokenizer: Any, eos_ids: Sequence[int]) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(eos_ids[0]) if eos_ids else 0
