"""training.padding_free: a packed micro-batch trains exactly what the padded one does (loss and gradients)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from training_records import three_passage_record, training_records
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from selfrag import reflection as rf
from selfrag.training.dataset import encode_record
from selfrag.training.loss import AnswerStart, loss_weight_table, masked_loss, relevance_rank
from selfrag.training.packing import PACKED_SDPA, PackedCollator, packed_attention, padding_share, use_padding_free

TOLERANCE = 1e-5


def examples(tokenizer: Any, token_ids: Any) -> list[dict[str, list[int]]]:
    """Records of different lengths (one and three passages, no retrieval), so the padded batch has pads."""
    records = [*training_records()[:4], three_passage_record("long", "The Normans came from Normandy. " * 4)]
    return [encode_record(record, tokenizer, token_ids, "paper") for record in records]


def loss_and_gradients(model: Any, batch: dict[str, Any], **loss: Any) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    value, _ = masked_loss(model, batch, loss.get("table"), loss.get("start"), loss.get("rank"))
    value.backward()
    gradients = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(value.detach()), gradients


def assert_same(padded: tuple[float, dict[str, torch.Tensor]], packed: tuple[float, dict[str, torch.Tensor]]) -> None:
    assert abs(padded[0] - packed[0]) <= TOLERANCE, (padded[0], packed[0])
    assert padded[1].keys() == packed[1].keys() and padded[1]
    for name, gradient in padded[1].items():
        worst = float((gradient - packed[1][name]).abs().max())
        assert worst <= TOLERANCE, f"{name}: |d gradient| {worst}"


@pytest.mark.parametrize("attention", ["sdpa", "eager", "packed_sdpa"])
def test_packed_batch_has_the_padded_batchs_loss_and_gradients(prepared, attention: str) -> None:  # type: ignore[no-untyped-def]
    """sdpa / eager: transformers' block-diagonal mask from the restarting position ids; packed_sdpa: each record
    attended alone (what selfrag train uses for an sdpa or eager model)."""
    model, tokenizer, token_ids, _ = prepared
    model.config._attn_implementation = "sdpa" if attention == "packed_sdpa" else attention
    batch = examples(tokenizer, token_ids)
    padded = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id or 0)(batch)
    assert int((padded["attention_mask"] == 0).sum()) > 0  # the padded batch does hold pads
    packed = PackedCollator()(batch)
    assert packed["input_ids"].shape == (1, sum(len(example["input_ids"]) for example in batch))
    assert "attention_mask" not in packed
    expected = loss_and_gradients(model, padded)
    with packed_attention(model, attention == "packed_sdpa"):
        if attention == "packed_sdpa":
            assert model.config._attn_implementation == PACKED_SDPA
            assert_same(expected, loss_and_gradients(model, padded))  # padded batches keep their padding mask
        assert_same(expected, loss_and_gradients(model, packed))
    assert model.config._attn_implementation == ("sdpa" if attention == "packed_sdpa" else attention)


def test_weighted_loss_answer_start_and_ranking_term_are_unchanged_by_packing(prepared) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer, token_ids, _ = prepared
    batch = examples(tokenizer, token_ids)
    table = loss_weight_table({"relevance": 4.0, "text": 0.5}, token_ids, len(tokenizer))
    after = torch.tensor([token_ids.id(token) for token in (rf.RELEVANT, rf.IRRELEVANT, rf.NO_RETRIEVAL)])
    start = AnswerStart(after, torch.tensor(sorted(token_ids.all_ids)), 3.0)
    settings = {"table": table, "start": start, "rank": relevance_rank(0.5, token_ids)}
    padded = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id or 0)(batch)
    assert_same(loss_and_gradients(model, padded, **settings),
                loss_and_gradients(model, PackedCollator()(batch), **settings))


@pytest.mark.parametrize("own_attention", [False, True])
def test_records_do_not_see_each_other_when_packed(prepared, own_attention: bool) -> None:  # type: ignore[no-untyped-def]
    """The second record's logits are the same whatever record is packed before it."""
    model, tokenizer, token_ids, _ = prepared
    first, other, second = examples(tokenizer, token_ids)[:3]
    model.eval()
    with torch.no_grad(), packed_attention(model, own_attention):
        alone = model(**{k: v for k, v in PackedCollator()([second]).items() if k != "labels"}).logits[0]
        after_first = model(**{k: v for k, v in PackedCollator()([first, second]).items() if k != "labels"}).logits[0]
        after_other = model(**{k: v for k, v in PackedCollator()([other, second]).items() if k != "labels"}).logits[0]
    length = len(second["input_ids"])
    assert torch.allclose(after_first[-length:], alone, atol=TOLERANCE)
    assert torch.allclose(after_other[-length:], alone, atol=TOLERANCE)


def test_collator_restarts_positions_and_masks_each_records_first_label() -> None:
    batch = PackedCollator()([{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8, 9], "labels": [8, 9]}])
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert batch["use_cache"] is False
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5] and batch["max_length_q"] == 3


def test_auto_packs_only_batches_of_several_records_on_an_isolating_attention(prepared) -> None:  # type: ignore[no-untyped-def]
    model = prepared[0]
    model.config._attn_implementation = "sdpa"
    assert use_padding_free("auto", model, 4) and not use_padding_free("auto", model, 1)
    model.config._attn_implementation = "some_kernel"
    assert not use_padding_free("auto", model, 4)
    assert use_padding_free(True, model, 1) and not use_padding_free(False, model, 4)


def test_padding_share_counts_the_pads_of_each_batch() -> None:
    assert padding_share([4, 2, 3, 3], [[0, 1], [2, 3]]) == pytest.approx(1 - 12 / 14)
    assert padding_share([5], [[0]]) == 0.0


def test_a_padding_free_run_trains(tiny_base_dir: Path, records_path: Path, tmp_path: Path) -> None:
    from test_train_run import make_config

    from selfrag.training.run import run

    result = run(make_config(tiny_base_dir, records_path, tmp_path / "packed", max_steps=4, padding_free=True))
    losses = [entry["loss"] for entry in result.losses]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert result.resources["throughput"]["input_tokens"] > 0
