"""The step shortcuts (selfrag.training.shortcuts): the trained rows read without PEFT's merged copy of the whole
vocabulary matrix give PEFT's loss and gradients; the fast dropout masks drop as torch.nn.Dropout does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_packing import assert_same, loss_and_gradients
from test_train_run import make_config
from training_records import training_records

from selfrag.training.dataset import encode_record
from selfrag.training.packing import PackedCollator, SharedPrefixCollator, packed_attention
from selfrag.training.shortcuts import StepShortcuts, drop_mask_like, fast_dropout


def peft_model(base: Path, records: Path, out: Path, dropout: float = 0.0) -> Any:
    from selfrag.training.model import prepare_model

    config = make_config(base, records, out)
    config.lora.dropout = dropout
    return prepare_model(config)


@pytest.mark.parametrize("collator", [PackedCollator, SharedPrefixCollator])
def test_gathered_rows_give_peft_s_loss_and_gradients(tiny_base_dir: Path, records_path: Path, tmp_path: Path,
                                                      collator: Any) -> None:
    prepared = peft_model(tiny_base_dir, records_path, tmp_path)
    model, tokenizer, meta = prepared.model, prepared.tokenizer, prepared.meta
    shortcuts = StepShortcuts(model, rows=True, dropout=False)
    assert len(shortcuts.rows) == 2  # the embedding and its tied head
    with torch.no_grad():  # trained rows that differ from the base's, as after some steps
        for name, parameter in model.named_parameters():
            if "trainable_tokens_delta" in name:
                parameter.add_(torch.randn_like(parameter))
    batch = collator()([encode_record(record, tokenizer, meta.token_ids, "paper") for record in training_records()[:4]])
    with packed_attention(model, True):
        expected = loss_and_gradients(model, batch)
        with shortcuts.on():
            assert all("forward" in vars(layer) for layer in shortcuts.rows)
            got = loss_and_gradients(model, batch)
    assert not any("forward" in vars(layer) for layer in shortcuts.rows)  # PEFT's own forward again
    assert any("trainable_tokens_delta" in name for name in got[1])
    assert_same(expected, got)


def test_fast_masks_drop_with_the_probability_and_scale_of_dropout() -> None:
    x = torch.ones(400_000)
    for p in (0.05, 0.5):
        kept = drop_mask_like(x, p)
        assert kept.shape == x.shape and kept.dtype == torch.bool
        assert float(kept.float().mean()) == pytest.approx(1 - p, abs=0.004)
    module = torch.nn.Dropout(0.2).train()
    out = fast_dropout(module)(x)
    assert torch.unique(out).tolist() == [0.0, pytest.approx(1 / 0.8)]
    assert float(out.mean()) == pytest.approx(1.0, abs=0.01)  # the expectation is kept, as Dropout keeps it
    torch.manual_seed(3)
    first = drop_mask_like(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(first, drop_mask_like(x, 0.3))  # seeded from torch's generator
    assert not torch.equal(first, drop_mask_like(x, 0.3))  # a fresh mask each call
    assert fast_dropout(module.eval())(x) is x


def test_only_lora_dropout_is_replaced_and_only_while_on(tiny_base_dir: Path, records_path: Path,
                                                         tmp_path: Path) -> None:
    model = peft_model(tiny_base_dir, records_path, tmp_path, dropout=0.1).model
    shortcuts = StepShortcuts(model, rows=False, dropout=True)
    lora = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Dropout)
            and "lora_dropout" in name]
    assert lora and len(shortcuts.dropouts) == len(lora) and not shortcuts.rows
    with shortcuts.on():
        assert all("forward" in vars(module) for module in shortcuts.dropouts)
    assert not any("forward" in vars(module) for module in shortcuts.dropouts)
