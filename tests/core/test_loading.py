"""One model loader (issue 29, item 6): the hf engine, `selfrag export` and the tests load a trained model through
selfrag.loading, which grows an adapter's base exactly as training grew it.

The engine used to resize the base to ``len(tokenizer)`` (shrinking a base whose embedding is padded past its
tokenizer, as Qwen2.5's is) while export grew it only when needed: the same adapter loaded with two vocabularies.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from selfrag.artifacts import ModelMeta, save_meta  # noqa: E402
from selfrag.inference.engines import GenerationRequest  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.loading import describe_model, embedding_rows, grow_embeddings, load_model, load_weights  # noqa: E402
from selfrag.prompting import encode_prompt  # noqa: E402

PADDED = 64  # rows past the tokenizer in the padded base


def adapter(tmp: Path, tiny_tokenizer: Any, tiny_model_builder: Any, padded: bool) -> tuple[Path, Any, Any]:
    """A base (its embedding padded past the tokenizer or not) and an ``add``-strategy adapter trained on it by
    hand: LoRA on q_proj and the reflection rows through ``trainable_token_indices``, all moved off their start.
    Returns the adapter directory, the in-memory adapted model and its tokenizer."""
    from peft import LoraConfig, get_peft_model

    from selfrag.training.tokens import prepare_tokens

    tokenizer = copy.deepcopy(tiny_tokenizer)
    base_dir = tmp / "base"
    base = tiny_model_builder(len(tokenizer) + (PADDED if padded else 0), seed=5)
    base.save_pretrained(str(base_dir))
    tokenizer.save_pretrained(str(base_dir))
    model = tiny_model_builder(len(tokenizer) + (PADDED if padded else 0), seed=5)
    token_ids = prepare_tokens(model, tokenizer, "add")
    ids = sorted(token_ids.all_ids)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], trainable_token_indices={"embed_tokens": ids},
                        task_type="CAUSAL_LM", init_lora_weights=False)
    adapted = get_peft_model(model, config)
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in adapted.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.5)
    out = tmp / "adapter"
    adapted.save_pretrained(str(out), save_embedding_layers=False)
    tokenizer.save_pretrained(str(out))
    save_meta(out, ModelMeta(token_ids, "add", "auto", str(base_dir), "adapter"))
    return out, adapted.eval(), tokenizer


def _logits(model: Any, tokenizer: Any) -> Any:
    ids = torch.tensor([encode_prompt(tokenizer, "What is the capital of France?")])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].float()


@pytest.mark.parametrize("padded", [False, True], ids=["grown", "padded-base"])
def test_every_loader_gives_the_model_that_was_trained(
    tmp_path: Path, tiny_tokenizer: Any, tiny_model_builder: Any, padded: bool
) -> None:
    directory, trained, tokenizer = adapter(tmp_path, tiny_tokenizer, tiny_model_builder, padded)
    rows = trained.get_input_embeddings().weight.shape[0]
    # what training left: grown to hold the 15 new ids, or the padded base's rows (more than the tokenizer) kept
    assert rows == (len(tiny_tokenizer) + PADDED if padded else len(tokenizer)) and rows >= len(tokenizer)
    expected = _logits(trained, tokenizer)

    loaded, reloaded_tokenizer, meta = load_model(directory)  # export, studies, tests
    assert meta.kind == "adapter" and not loaded.training
    assert loaded.get_input_embeddings().weight.shape[0] == rows
    assert torch.allclose(_logits(loaded, reloaded_tokenizer), expected, atol=1e-5)

    engine = HFEngine(directory)  # the engine: the same loader, merged
    assert engine.model.get_input_embeddings().weight.shape[0] == rows
    assert torch.allclose(_logits(engine.model, engine.tokenizer), expected, atol=1e-4)
    prompt = tuple(encode_prompt(engine.tokenizer, "What is the capital of France?"))
    [generation] = engine.generate([GenerationRequest(prompt, max_tokens=1, score_token_ids=meta.token_ids.all_ids)])
    assert generation.token_ids[0] == int(expected.argmax())
    assert len(generation.score_logprobs[0]) == 15


def test_an_unmerged_load_keeps_the_adapter(tmp_path: Path, tiny_tokenizer: Any, tiny_model_builder: Any) -> None:
    from peft import PeftModel

    directory, trained, tokenizer = adapter(tmp_path, tiny_tokenizer, tiny_model_builder, padded=False)
    served = describe_model(directory)
    assert isinstance(load_weights(served, merge=False), PeftModel)
    merged = load_weights(served, dtype="float32", merge=True)
    assert not isinstance(merged, PeftModel)
    assert torch.allclose(_logits(merged, tokenizer), _logits(trained, tokenizer), atol=1e-4)


def test_grow_embeddings_grows_only(tiny_tokenizer: Any, tiny_model_builder: Any) -> None:
    from selfrag.reflection import TOKENS, reflection_ids

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.add_tokens(list(TOKENS), special_tokens=True)
    token_ids = reflection_ids(tokenizer)
    assert embedding_rows(tokenizer, token_ids) == len(tokenizer)
    small = tiny_model_builder(len(tiny_tokenizer))
    assert grow_embeddings(small, embedding_rows(tokenizer, token_ids))
    assert small.get_input_embeddings().weight.shape[0] == len(tokenizer)
    padded = tiny_model_builder(len(tokenizer) + PADDED)
    assert not grow_embeddings(padded, embedding_rows(tokenizer, token_ids))
    assert padded.get_input_embeddings().weight.shape[0] == len(tokenizer) + PADDED
