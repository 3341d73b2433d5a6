"""Both token strategies on the tiny model, through the real entry point: what trains, what stays, what exports.

``add`` grows the vocabulary and trains the new rows through PEFT trainable tokens; ``reserved`` maps the
reflection tokens onto unused reserved tokens and must produce a *plain* LoRA adapter (what vLLM's LoRA
loader accepts) in which only the reflection rows of the embedding and the head move.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from reserved_base import add_reserved_tokens
from safetensors import safe_open
from training_records import training_records

from selfrag.artifacts import load_meta
from selfrag.config import load_config
from selfrag.jsonl import write_jsonl_atomic
from selfrag.loading import load_model
from selfrag.training.config import TrainConfig
from selfrag.training.export import export
from selfrag.training.model import prepare_model
from selfrag.training.run import run
from selfrag.training.tokens import reserved_row_deltas


def make_config(base: Path, records: Path, out: Path, strategy: str, **training: Any) -> TrainConfig:
    settings = {"learning_rate": 1e-2, "max_steps": 8, "batch_size": 4, "logging_steps": 1,
                "eval_fraction": 0.25, "max_length": 512, **training}
    return load_config(TrainConfig, model=str(base), records=str(records), output_dir=str(out),
                       tokens={"strategy": strategy}, training=settings, lora={"r": 16, "alpha": 16, "dropout": 0.0})


@pytest.fixture(scope="module")
def records_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("records") / "records.jsonl"
    write_jsonl_atomic(path, [record.to_json() for record in training_records()])
    return path


@pytest.fixture(scope="module")
def reserved_base_dir(tmp_path_factory, tiny_tokenizer, tiny_model_builder) -> Path:  # type: ignore[no-untyped-def]
    """The tiny (tied) base with 20 zero-row reserved tokens, as reserved_base.py builds a SmolLM2 copy."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    model = tiny_model_builder(len(tokenizer))
    add_reserved_tokens(model, tokenizer, count=20)
    path = tmp_path_factory.mktemp("reserved-base")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module", params=["add", "reserved"])
def trained(request, tiny_base_dir, reserved_base_dir, records_path, tmp_path_factory):  # type: ignore[no-untyped-def]
    strategy = request.param
    base = tiny_base_dir if strategy == "add" else reserved_base_dir
    # auto must pick the same strategy: the tiny tokenizer has no reserved tokens, the copy has 20.
    config = make_config(base, records_path, tmp_path_factory.mktemp(strategy) / "adapter", "auto")
    initial = prepare_model(config).model
    initial_state = {name: value.detach().clone() for name, value in initial.state_dict().items()}
    initial_rows = effective_rows(initial)
    result = run(config)
    return strategy, config, initial_state, initial_rows, result


def effective_rows(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The embedding and head matrices the model computes with (base + LoRA/trainable-token changes)."""
    with torch.no_grad():
        embedding = model.get_input_embeddings()
        vocab = embedding.get_base_layer().weight.shape[0] if hasattr(embedding, "get_base_layer") else None
        ids = torch.arange(vocab if vocab is not None else embedding.weight.shape[0])
        rows = embedding(ids[None])[0].clone()  # (vocab, hidden)
        head = model.get_output_embeddings()
        hidden = torch.eye(rows.shape[1])
        head_rows = head(hidden[None])[0].T.clone()  # (vocab, hidden): the head applied to the unit vectors
    return rows, head_rows


def test_a_few_steps_lower_the_loss_and_change_only_what_trains(trained) -> None:  # type: ignore[no-untyped-def]
    strategy, config, initial, (embedding0, head0), result = trained
    losses = [entry["loss"] for entry in result.losses]
    assert len(losses) == 8 and min(losses[-2:]) < losses[0]
    final = result.model.state_dict()
    lora = [name for name in final if "lora_" in name]
    deltas = [name for name in final if "trainable_tokens_delta" in name]
    assert lora and bool(deltas) == (strategy == "add")
    for name in lora:
        assert not torch.equal(final[name], initial[name]), f"LoRA weight {name} did not change"
    for name in set(final) - set(lora) - set(deltas):  # the frozen base: every base row, reserved ones included
        assert torch.equal(final[name], initial[name]), f"frozen weight {name} changed"
    meta = load_meta(config.output_dir)
    assert meta is not None and meta.strategy == strategy  # auto resolved, and recorded resolved
    ids = sorted(meta.token_ids.all_ids)
    embedding1, head1 = effective_rows(result.model)
    others = torch.ones(embedding0.shape[0], dtype=torch.bool)
    others[ids] = False
    for before, after, what in ((embedding0, embedding1, "embedding"), (head0, head1, "head")):
        assert (after[ids] != before[ids]).any(dim=1).all(), f"some reflection {what} rows did not move"
        torch.testing.assert_close(after[others], before[others], rtol=0, atol=1e-6, msg=f"other {what} rows moved")


@pytest.mark.parametrize("trained", ["reserved"], indirect=True)
def test_reserved_adapter_is_plain_lora_and_starts_at_the_mean(trained) -> None:  # type: ignore[no-untyped-def]
    _, config, _, (embedding0, head0), result = trained
    with safe_open(str(Path(config.output_dir) / "adapter_model.safetensors"), framework="pt") as handle:
        keys = list(handle.keys())
    # vLLM's parse_fine_tuned_lora_name accepts exactly these suffixes and raises on anything else.
    accepted = (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B")
    assert keys and all(key.endswith(accepted) for key in keys), [k for k in keys if not k.endswith(accepted)]
    assert any("embed_tokens.lora_embedding_A" in key for key in keys)
    assert any("lm_head.lora_A" in key for key in keys)
    meta = load_meta(config.output_dir)
    assert meta is not None and len(meta.token_ids.all_ids) == 15
    tokenizer_size = embedding0.shape[0]
    base_rows = tokenizer_size - 20  # the 20 reserved tokens are the last ids of the copy
    ids = sorted(meta.token_ids.all_ids)
    assert ids == list(range(tokenizer_size - 15, tokenizer_size))  # the highest-numbered reserved tokens
    mean = embedding0[:base_rows].mean(dim=0)
    torch.testing.assert_close(embedding0[ids], mean.expand(15, -1), rtol=0, atol=1e-5)  # LoRA start = the mean
    torch.testing.assert_close(head0[ids], mean.expand(15, -1), rtol=0, atol=1e-5)
    embedding_delta, head_delta = reserved_row_deltas(result.model)
    others = [row for row in range(tokenizer_size) if row not in ids]
    assert torch.count_nonzero(embedding_delta[others]) == 0 and torch.count_nonzero(head_delta[others]) == 0


def test_adapter_and_merged_export_give_the_same_greedy_tokens_and_logits(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    strategy, config, _, _, result = trained
    adapter, tokenizer, meta = load_model(config.output_dir)
    merged_dir = export(config.output_dir, tmp_path / "merged")
    merged, _, merged_meta = load_model(merged_dir)
    assert merged_meta.kind == "merged" and merged_meta.token_ids == meta.token_ids and merged_meta.strategy == strategy
    prompt = torch.tensor([tokenizer.encode("Where did the Normans live? [Retrieval]<paragraph>x</paragraph>")])
    with torch.no_grad():
        expected = result.model.eval()(input_ids=prompt).logits
        torch.testing.assert_close(adapter(input_ids=prompt).logits, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(merged(input_ids=prompt).logits, expected, rtol=0, atol=1e-4)
        greedy = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
        adapter_tokens = adapter.generate(input_ids=prompt, **greedy)
        merged_tokens = merged.generate(input_ids=prompt, **greedy)
    assert adapter_tokens.shape[1] > prompt.shape[1]
    assert torch.equal(adapter_tokens, merged_tokens)
    ids = list(meta.token_ids.all_ids)
    reflection_logits = merged(input_ids=prompt).logits[0, -1, ids]
    torch.testing.assert_close(reflection_logits, expected[0, -1, ids], rtol=0, atol=1e-4)
    check_loads_without_peft(merged_dir, prompt, expected)


def check_loads_without_peft(merged_dir: Path, prompt: torch.Tensor, expected: torch.Tensor) -> None:
    """transformers alone, in a fresh interpreter where ``import peft`` fails, loads the merged model."""
    script = textwrap.dedent(
        f"""
        import importlib.machinery
        import sys
        class BlockPeft:  # any import of peft fails, as if it were not installed
            def find_spec(self, name, path=None, target=None):
                if name == "peft" or name.startswith("peft."):
                    return importlib.machinery.ModuleSpec(name, self)
                return None
            def create_module(self, spec):
                raise ModuleNotFoundError("No module named 'peft' (blocked in this test)")
            def exec_module(self, module):
                raise ModuleNotFoundError("No module named 'peft' (blocked in this test)")
        sys.meta_path.insert(0, BlockPeft())
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained({str(merged_dir)!r}, dtype=torch.float32).eval()
        AutoTokenizer.from_pretrained({str(merged_dir)!r})
        assert "peft" not in sys.modules
        with torch.no_grad():
            logits = model(input_ids=torch.tensor({prompt.tolist()!r})).logits
        torch.save(logits, sys.argv[1])
        """
    )
    out = merged_dir.parent / "logits.pt"
    done = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    torch.testing.assert_close(torch.load(out), expected, rtol=0, atol=1e-4)
