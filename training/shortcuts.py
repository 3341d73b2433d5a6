"""Two costs of a LoRA training step that do not grow with the work it trains, taken out while a step runs.

    shortcuts = StepShortcuts(model, rows=True, dropout=True)
    with shortcuts.on():
        loss.backward()            # inside the trainer's training_step

**The trained reflection rows** (``training.trainable_rows: gather``). PEFT's trainable-token layer
(``TrainableTokensLayer``, strategy add's 15 new rows and strategy reserved's) builds its weight each forward as a
copy of the whole vocabulary matrix with the trained rows written in (``index_copy``), and the embedding and the tied
head read that copy. The copy requires grad, so the backward computes the gradient of the whole ``vocab x hidden``
matrix and keeps 15 rows of it. On SmolLM2-135M (49,167 x 576) that is two 113 MB copies and a ``49,167 x K x 576``
product a step, 0.25 s of a 1.9 s fp32 step on 2 cores (``torch.profiler``, 2026-12-01). Here the embedding reads the
base matrix and puts the trained rows in place of the positions that hold those ids; the head multiplies by the base
matrix and by the trained rows and writes their columns in. The values are PEFT's, and the gradient reaches the
trained rows and the activations alone (the base matrix is frozen either way).

**LoRA dropout's masks** (``training.dropout_masks: fast``). On the CPU ``torch.nn.Dropout`` draws one Mersenne-Twister
number per element: 0.3 s of that step, a sixth of it. Here each element's mask comes from 16 bits of numpy's PCG64
(about 4x faster per element): still dropped independently with probability ``p`` (to 1/65,536) and the kept ones
scaled by ``1 / (1 - p)``, as ``Dropout`` does; only the random stream differs. Other devices keep torch's dropout.

Outside ``on()`` (held-out scoring, the judgement, generation, saving) the model runs PEFT's and torch's own code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

#: 16-bit draws: a mask element is kept where its uniform value is at or above p of the range
_RANGE = 1 << 16


def drop_mask_like(x: torch.Tensor, p: float) -> torch.Tensor:
    """A keep-mask for ``x`` (bool, its shape, on the CPU): each element kept independently with probability
    ``1 - p`` (to 1/65,536), from 16 random bits of numpy's PCG64, seeded by one draw of torch's generator (so
    ``torch.manual_seed`` and a resumed run's restored RNG state make the same masks)."""
    seed = int(torch.randint(0, 1 << 62, (1,)).item())
    bits = np.frombuffer(np.random.default_rng(seed).bytes(2 * x.numel()), dtype=np.int16)
    return torch.from_numpy(bits >= round(p * _RANGE) - _RANGE // 2).view(x.shape)


def fast_dropout(module: torch.nn.Dropout) -> Any:
    """``module``'s forward with :func:`drop_mask_like` masks on the CPU (training mode; evaluation passes through,
    and other devices keep torch's dropout)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        p = float(module.p)
        if not module.training or p == 0.0:
            return x
        if p >= 1.0 or x.device.type != "cpu":
            return F.dropout(x, p, True, module.inplace)
        return torch.where(drop_mask_like(x, p), x * (1.0 / (1.0 - p)), 0.0)

    return forward


def gathered_rows(layer: Any) -> Any:
    """``layer``'s (a PEFT ``TrainableTokensLayer``) forward without the merged copy of the whole matrix, or None where
    this layer is one the shortcut does not cover (merged, disabled, several adapters, an embedding with max_norm or
    sparse gradients, a sharded matrix)."""
    base = layer.get_base_layer()
    adapters = list(layer.active_adapters)
    if len(adapters) != 1 or layer.merged or layer.disable_adapters:
        return None
    adapter = adapters[0]
    weight = base.weight
    if getattr(weight, "ds_id", None) is not None or weight.numel() == 0 or type(weight.data) is not torch.Tensor:
        return None  # a sharded matrix (ZeRO-3, FSDP's DTensor): PEFT's own path and the framework's gathering
    if isinstance(base, torch.nn.Embedding):
        if base.max_norm is not None or base.sparse or base.scale_grad_by_freq:
            return None
    elif not isinstance(base, torch.nn.Linear) or base.bias is not None:
        return None
    indices = torch.tensor(layer.token_indices[adapter], dtype=torch.long, device=base.weight.device)
    padding = getattr(base, "padding_idx", None)
    if padding is not None and bool((indices == padding).any()):
        return None  # F.embedding gives the padding row no gradient: PEFT's path keeps that
    # each vocabulary id -> its trained row, or -1
    slot = torch.full((base.weight.shape[0],), -1, dtype=torch.long, device=base.weight.device)
    slot[indices] = torch.arange(len(indices), device=base.weight.device)

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        rows = layer.trainable_tokens_delta[adapter].to(base.weight)
        if isinstance(base, torch.nn.Embedding):
            result = F.embedding(x, base.weight, padding_idx=base.padding_idx)
            own = slot[x]
            trained = own >= 0
            if bool(trained.any()):
                result = torch.where(trained[..., None], F.embedding(own.clamp_min(0), rows), result)
            scale = layer._get_embed_scale()
            if scale is not None:
                result = result * scale.to(result.dtype)
            return result
        result = F.linear(x, base.weight)  # tied head: the trained rows are its columns
        return result.index_copy(-1, indices, F.linear(x, rows))

    return forward


class StepShortcuts:
    """The shortcuts of this module on ``model``'s layers while :meth:`on` is open (each can be off)."""

    def __init__(self, model: Any, rows: bool = True, dropout: bool = True) -> None:
        from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

        self.rows = [module for module in model.modules() if isinstance(module, TrainableTokensLayer)] if rows else []
        self.dropouts = [module for name, module in model.named_modules()
                         if dropout and isinstance(module, torch.nn.Dropout) and "lora_dropout" in name]

    @contextmanager
    def on(self) -> Iterator[None]:
        with ExitStack() as stack:
            for layer in self.rows:
                forward = gathered_rows(layer)
                if forward is not None:
                    stack.enter_context(_forward_replaced(layer, forward))
            for module in self.dropouts:
                stack.enter_context(_forward_replaced(module, fast_dropout(module)))
            yield


@contextmanager
def _forward_replaced(module: torch.nn.Module, forward: Any) -> Iterator[None]:
    module.forward = forward  # type: ignore[method-assign]  # the instance's, over its class's
    try:
        yield
    finally:
        del module.forward
