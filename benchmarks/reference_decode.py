"""The first hf decode, kept outside the product as a reference: the baseline of benchmarks/engine_speed.py and the test
oracle of the hf engine's decode (tests/inference/test_hf_engine.py).

    engine = ReferenceDecode(HFEngine("runs/model", batch_size=8))   # the same model, the first decode loop
    [generation] = engine.generate([GenerationRequest(prompt_ids, max_tokens=8, score_token_ids=ids)])

Greedy only, and straightforward on purpose: left-padded batches in request order, the logits of every prompt
position, a full ``log_softmax`` over the vocabulary at each step, finished rows decoding on until the whole batch
is done. The engine's own decode (last-position logits, rows leaving the batch, kept prompt KV) must give the same
greedy ids and the same log-probs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from selfrag.inference.engines import Generation, GenerationRequest
from selfrag.inference.engines.base import finish_reason_of
from selfrag.inference.engines.hf import cache_keyword


class ReferenceDecode:
    """An engine over ``engine``'s model and tokenizer that decodes with the first implementation."""

    def __init__(self, engine: Any) -> None:
        self.inner = engine

    def __getattr__(self, name: str) -> Any:  # tokenizer, token_ids, prompt_template, calibration, name, ...
        return getattr(self.inner, name)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Requests with equal decode settings share batches of the engine's ``batch_size``, in request order."""
        results: dict[int, Generation] = {}
        groups: dict[Any, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(request.decode_key, []).append(index)
        size = self.inner.batch_size
        for indices in groups.values():
            for start in range(0, len(indices), size):
                chunk = indices[start : start + size]
                for index, generation in zip(chunk, self._decode([requests[i] for i in chunk]), strict=True):
                    results[index] = generation
        return [results[i] for i in range(len(requests))]

    @torch.inference_mode()
    def _decode(self, batch: Sequence[GenerationRequest]) -> list[Generation]:
        started = time.monotonic()
        engine, settings = self.inner, batch[0]
        width = max(len(request.prompt_ids) for request in batch)
        input_ids = torch.full((len(batch), width), engine.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            input_ids[row, width - len(request.prompt_ids) :] = torch.tensor(list(request.prompt_ids))
            attention_mask[row, width - len(request.prompt_ids) :] = 1
        input_ids, attention_mask = input_ids.to(engine.device), attention_mask.to(engine.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (batch, length)
        tokens: list[list[int]] = [[] for _ in batch]
        scores: list[list[dict[int, float]]] = [[] for _ in batch]
        finish: list[str | None] = [None for _ in batch]
        cache, keyword = None, cache_keyword(engine.model)
        for step in range(settings.max_tokens):
            output = engine.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  **{keyword: cache}, use_cache=True)
            cache = getattr(output, keyword)
            logits = output.logits[:, -1, :].float()  # (batch, vocab), fp32 so close scores do not tie
            full = torch.log_softmax(logits, dim=-1)
            next_ids = self._next_ids(logits, settings, step)
            vocabulary = full.shape[-1]
            ids = [token_id for token_id in settings.score_token_ids if 0 <= token_id < vocabulary]
            for row, token_id in enumerate(next_ids.tolist()):
                if finish[row] is not None:
                    continue
                tokens[row].append(int(token_id))
                scores[row].append({i: float(full[row, i]) for i in ids})
                finish[row] = finish_reason_of(int(token_id), settings.stop_token_ids, engine.eos_ids)
                if finish[row] is None and len(tokens[row]) >= settings.max_tokens:
                    finish[row] = "length"
            if all(reason is not None for reason in finish):
                break
            input_ids = next_ids.unsqueeze(-1)  # finished rows keep decoding; their tokens are ignored
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(batch), 1))], dim=-1)
            position_ids = position_ids[:, -1:] + 1
        seconds = time.monotonic() - started
        return [
            Generation(token_ids=tuple(ids_), text=engine.tokenizer.decode(ids_, skip_special_tokens=False),
                       score_logprobs=tuple(scores_), finish_reason=reason or "length",  # type: ignore[arg-type]
                       prompt_tokens=len(request.prompt_ids), seconds=seconds)
            for ids_, scores_, reason, request in zip(tokens, scores, finish, batch, strict=True)
        ]

    def _next_ids(self, logits: torch.Tensor, settings: GenerationRequest, step: int) -> torch.Tensor:
        """Greedy: the best id that the request allows at this step (banned ids never; stop and end-of-sequence ids
        not before ``min_tokens``). The reported scores are read from the logits before this."""
        if settings.temperature != 0:
            raise ValueError(f"the reference decode is greedy: temperature must be 0, got {settings.temperature}")
        held_back = set(settings.banned_token_ids)
        if step < settings.min_tokens:
            held_back |= {*settings.stop_token_ids, *self.inner.eos_ids}
        allowed = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
        allowed[sorted(held_back)] = False
        return logits.masked_fill(~allowed, float("-inf")).argmax(dim=-1)
