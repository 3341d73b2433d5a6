"""logits_at: the labelled positions' logits, on transformers that take a bool logits_to_keep and on older ones."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from selfrag import logits as logits_module
from selfrag.logits import logits_at


@pytest.fixture()
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def batch() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 20), generator=generator)
    mask = torch.ones_like(ids)
    mask[2, 15:] = 0  # a padded row
    keep = torch.zeros_like(ids, dtype=torch.bool)
    keep[0, 5:8] = True
    keep[1, 12] = True
    keep[2, [3, 7]] = True
    return {"input_ids": ids, "attention_mask": mask}, keep


class Bool2DRefused(torch.nn.Module):
    """A transformers release before 5.20: a 2-D logits_to_keep indexes ``hidden[:, keep, :]`` and raises."""

    def __init__(self, inner: LlamaForCausalLM) -> None:
        super().__init__()
        self.inner = inner
        self.columns: list[int] = []

    def forward(self, logits_to_keep: torch.Tensor | int = 0, **inputs: torch.Tensor):  # type: ignore[no-untyped-def]
        if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.ndim == 2:
            raise IndexError("too many indices for tensor")
        outputs = self.inner(**inputs, logits_to_keep=logits_to_keep)
        self.columns.append(outputs.logits.shape[1])
        return outputs


def test_the_kept_positions_logits_equal_the_full_projection_both_ways(model, monkeypatch) -> None:
    inputs, keep = batch()
    with torch.no_grad():
        full = model(**inputs).logits[keep]
        monkeypatch.setitem(logits_module._BOOL_KEEP, "supported", True)
        direct, _ = logits_at(model, inputs, keep)
        old = Bool2DRefused(model)
        monkeypatch.setitem(logits_module._BOOL_KEEP, "supported", True)
        fallback, _ = logits_at(old, inputs, keep)
    assert direct.shape == full.shape == fallback.shape == (int(keep.sum()), 97)
    torch.testing.assert_close(direct, full)
    torch.testing.assert_close(fallback, full)
    # the old release projected the 5 columns some row keeps (3, 5, 6, 7, 12), not all 20
    assert old.columns == [5]
    assert logits_module._BOOL_KEEP["supported"] is False


def test_the_fallback_trains_the_same_gradients(model, monkeypatch) -> None:
    inputs, keep = batch()
    monkeypatch.setitem(logits_module._BOOL_KEEP, "supported", False)
    model.train()
    logits_at(Bool2DRefused(model), inputs, keep)[0].float().logsumexp(-1).sum().backward()
    fallback = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(**inputs).logits[keep].float().logsumexp(-1).sum().backward()
    for got, want in zip(fallback, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want)
