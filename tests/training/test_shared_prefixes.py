"""training.share_prefixes: a micro-batch laid out as a prefix tree trains exactly what the padded batch does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_packing import assert_same, loss_and_gradients
from training_records import one_passage_record, three_passage_record, training_records
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from selfrag import reflection as rf
from selfrag.training.dataset import encode_record
from selfrag.training.loss import AnswerStart, loss_weight_table, relevance_rank
from selfrag.training.packing import PackedCollator, SharedPrefixCollator, packed_attention, use_shared_prefixes


def sharing_examples(tokenizer: Any, token_ids: Any) -> list[dict[str, list[int]]]:
    """One question's records, as training.order=question puts them side by side: the same prompt, two with the same
    passage (relevant and not), one with three passages, and one a copy of another (wholly a prefix of it)."""
    records = [one_passage_record("gold", relevant=True), one_passage_record("negative", relevant=False),
               three_passage_record("three"), one_passage_record("again", relevant=True)]
    return [encode_record(record, tokenizer, token_ids, "paper") for record in records]


def test_the_tree_holds_each_shared_token_once() -> None:
    batch = SharedPrefixCollator()([
        {"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]},
        {"input_ids": [1, 2, 5], "labels": [-100, -100, 5]},
        {"input_ids": [1, 2, 3], "labels": [-100, -100, 3]},
        {"input_ids": [7, 8], "labels": [7, 8]},
    ])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 7, 8]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 2, 0, 1]]
    # the records' labels end to end, each record's first masked, as PackedCollator lays them
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, -100, -100, 5, -100, -100, 3, -100, 8]]
    # the node read before each labelled position: 3 after node 1 (twice), 4 after 2, 5 after 1, 8 after 5
    assert batch["prefix_sources"].tolist() == [1, 2, 1, 1, 5]
    assert batch["prefix_owned"].tolist() == [[0, 4], [4, 5], [5, 5], [5, 7]]
    assert batch["prefix_paths"].tolist() == [0, 1, 2, 3, 0, 1, 4, 0, 1, 2, 5, 6]
    assert batch["prefix_path_bounds"].tolist() == [0, 4, 7, 10, 12]


def test_prefixes_are_shared_in_the_tests_records(prepared) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer, token_ids, _ = prepared
    batch = sharing_examples(tokenizer, token_ids)
    tree = SharedPrefixCollator()(batch)
    assert tree["input_ids"].shape[1] < 0.6 * sum(len(example["input_ids"]) for example in batch)


@pytest.mark.parametrize("weighted", [False, True])
def test_a_shared_prefix_batch_has_the_padded_batchs_loss_and_gradients(prepared, weighted: bool) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer, token_ids, _ = prepared
    model.config._attn_implementation = "sdpa"
    batch = sharing_examples(tokenizer, token_ids) + [encode_record(training_records()[0], tokenizer, token_ids,
                                                                    "paper")]
    settings: dict[str, Any] = {}
    if weighted:
        after = torch.tensor([token_ids.id(token) for token in (rf.RELEVANT, rf.IRRELEVANT, rf.NO_RETRIEVAL)])
        settings = {"table": loss_weight_table({"relevance": 4.0, "text": 0.5}, token_ids, len(tokenizer)),
                    "start": AnswerStart(after, torch.tensor(sorted(token_ids.all_ids)), 3.0),
                    "rank": relevance_rank(0.5, token_ids)}
    padded = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id or 0)(batch)
    expected = loss_and_gradients(model, padded, **settings)
    with packed_attention(model, True):
        assert_same(expected, loss_and_gradients(model, PackedCollator()(batch), **settings))
        assert_same(expected, loss_and_gradients(model, SharedPrefixCollator()(batch), **settings))


def test_without_the_tree_attention_the_tree_batch_would_differ(prepared, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The check above is not vacuous: the tree laid out as one causal row (no tree attention) gives another loss."""
    import selfrag.training.packing as packing

    model, tokenizer, token_ids, _ = prepared
    model.config._attn_implementation = "sdpa"
    batch = sharing_examples(tokenizer, token_ids)
    padded = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id or 0)(batch)
    expected = loss_and_gradients(model, padded)[0]
    calls: list[int] = []
    original = packing.shared_prefix_sdpa

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(packing, "shared_prefix_sdpa", counted)
    tree = SharedPrefixCollator()(batch)
    with packed_attention(model, True):
        assert loss_and_gradients(model, tree)[0] == pytest.approx(expected, abs=1e-5)
    assert len(calls) == model.config.num_hidden_layers
    monkeypatch.setattr(packing, "PREFIX_KEYS", ("not_a", "not_b", "not_c"))
    with packed_attention(model, True):
        assert abs(loss_and_gradients(model, tree)[0] - expected) > 1e-3


def test_auto_shares_prefixes_only_where_the_tree_is_exact(prepared) -> None:  # type: ignore[no-untyped-def]
    model = prepared[0]
    model.config._attn_implementation = "sdpa"
    assert use_shared_prefixes("auto", model, packed=True) and not use_shared_prefixes("auto", model, packed=False)
    # with LoRA dropout one mask would serve every record at a shared token: auto leaves the records side by side,
    # true shares anyway
    assert not use_shared_prefixes("auto", model, packed=True, dropout=0.05)
    assert use_shared_prefixes(True, model, packed=True, dropout=0.05)
    assert not use_shared_prefixes(False, model, packed=True)
    model.config._attn_implementation = "flash_attention_2"
    assert not use_shared_prefixes("auto", model, packed=True)


def test_the_recipe_shares_prefixes_because_its_lora_has_no_dropout(prepared, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The quickstart's recipe, resolved for a model as training resolves it: the prefix tree with its dropout (0),
    the records side by side with LoRA dropout 0.05."""
    from pathlib import Path

    from selfrag.config import load_config
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import packed_collator

    model = prepared[0]
    model.config._attn_implementation = "sdpa"
    recipe = Path(__file__).resolve().parents[2] / "configs" / "train" / "smollm2-135m-cpu.yaml"
    paths = [f"records={tmp_path / 'r.jsonl'}", f"output_dir={tmp_path / 'out'}"]
    config = load_config(TrainConfig, recipe, paths)
    assert config.lora.dropout == 0 and config.training.share_prefixes == "auto"
    assert isinstance(packed_collator(config, model, 4), SharedPrefixCollator)
    dropout = load_config(TrainConfig, recipe, [*paths, "lora.dropout=0.05"])
    assert type(packed_collator(dropout, model, 4)) is PackedCollator
    forced = load_config(TrainConfig, recipe, [*paths, "lora.dropout=0.05", "training.share_prefixes=true"])
    assert isinstance(packed_collator(forced, model, 4), SharedPrefixCollator)
