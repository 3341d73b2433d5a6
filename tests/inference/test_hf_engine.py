"""HFEngine on the tiny Llama: greedy output, stop ids, log-probs, batching, adapter reload."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from selfrag.artifacts import ModelMeta, save_meta  # noqa: E402
from selfrag.errors import ModelNotFoundError  # noqa: E402
from selfrag.inference.engines import ENGINES, GenerationRequest  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.prompting import encode_prompt  # noqa: E402
from selfrag.reflection import Group  # noqa: E402


@pytest.fixture(scope="module")
def merged_dir(tmp_path_factory, reflection_tokenizer, token_ids, tiny_model_builder) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("tiny-selfrag")
    model = tiny_model_builder(len(reflection_tokenizer), seed=3)
    with torch.no_grad():  # the default init (std 0.02) decodes one token forever; spread the weights
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(str(path))
    reflection_tokenizer.save_pretrained(str(path))
    save_meta(path, ModelMeta(token_ids, "add", "auto", "tiny-base", "merged"))
    return path


@pytest.fixture(scope="module")
def engine(merged_dir) -> HFEngine:  # type: ignore[no-untyped-def]
    return ENGINES["hf"](model_dir=merged_dir, batch_size=4)  # type: ignore[return-value]


def _prompts(engine: HFEngine) -> list[tuple[int, ...]]:
    questions = ["What is the capital of France?", "Who wrote it?", "Name a river in the north of the country."]
    return [tuple(encode_prompt(engine.tokenizer, question)) for question in questions]


def _reference_greedy(model, prompt: tuple[int, ...], max_tokens: int) -> list[int]:  # type: ignore[no-untyped-def]
    ids = torch.tensor([prompt])
    # An explicit mask: the chat prompt contains <|im_end|>, which is also the pad id generate() would mask.
    output = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False)
    return output[0, len(prompt) :].tolist()


def test_greedy_matches_transformers_generate(engine: HFEngine) -> None:
    prompt = _prompts(engine)[0]
    reference = _reference_greedy(engine.model, prompt, 12)
    [generation] = engine.generate([GenerationRequest(prompt, max_tokens=12)])
    cut = next((i + 1 for i, t in enumerate(reference) if t in engine.eos_ids), len(reference))
    assert list(generation.token_ids) == reference[:cut]
    assert generation.finish_reason == ("eos" if cut < len(reference) or reference[-1] in engine.eos_ids else "length")
    assert generation.prompt_tokens == len(prompt)
    assert generation.text == engine.tokenizer.decode(reference[:cut], skip_special_tokens=False)


def test_stop_id_is_honoured_and_kept(engine: HFEngine) -> None:
    prompt = _prompts(engine)[1]
    free = engine.generate([GenerationRequest(prompt, max_tokens=10)])[0].token_ids
    assert len(set(free)) > 3  # a decode that repeats one token would make this test vacuous
    stop = free[3]
    [generation] = engine.generate([GenerationRequest(prompt, max_tokens=10, stop_token_ids=(stop,))])
    assert generation.token_ids == free[: free.index(stop) + 1]
    assert generation.finish_reason == "stop"


def test_logprobs_match_log_softmax(engine: HFEngine) -> None:
    prompt = _prompts(engine)[2]
    score_ids = engine.token_ids.all_ids
    [generation] = engine.generate([GenerationRequest(prompt, max_tokens=4, score_token_ids=score_ids)])
    ids = list(prompt)
    for position, token_id in enumerate(generation.token_ids):
        with torch.no_grad():
            logits = engine.model(torch.tensor([ids])).logits[0, -1].float()
        expected = torch.log_softmax(logits, dim=-1)
        assert set(generation.score_logprobs[position]) == set(score_ids)
        for score_id in score_ids:
            assert generation.score_logprobs[position][score_id] == pytest.approx(expected[score_id].item(), abs=1e-4)
        ids.append(token_id)


def test_batched_equals_unbatched(engine: HFEngine) -> None:
    score_ids = engine.token_ids.ids(Group.RETRIEVE)
    requests = [GenerationRequest(p, max_tokens=8, score_token_ids=score_ids) for p in _prompts(engine)]
    batched = engine.generate(requests)
    for request, generation in zip(requests, batched, strict=True):
        [alone] = engine.generate([request])
        assert alone.token_ids == generation.token_ids
        for mine, theirs in zip(alone.score_logprobs, generation.score_logprobs, strict=True):
            assert mine == pytest.approx(theirs, abs=1e-4)


def test_mixed_settings_keep_request_order(engine: HFEngine) -> None:
    prompts = _prompts(engine)
    requests = [GenerationRequest(prompts[0], 3), GenerationRequest(prompts[1], 5), GenerationRequest(prompts[2], 3)]
    generations = engine.generate(requests)
    for request, generation in zip(requests, generations, strict=True):
        assert generation.token_ids == engine.generate([request])[0].token_ids


def test_base_model_without_selfrag_json_is_refused(tiny_base_dir: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no reflection tokens"):
        HFEngine(tiny_base_dir)


@pytest.mark.parametrize("merge", [True, False], ids=["merged-at-load", "peft-layers"])
def test_adapter_with_trainable_tokens_reloads(tmp_path, tiny_base_dir, reflection_tokenizer, token_ids, merge) -> None:  # type: ignore[no-untyped-def]
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_base_dir))
    base.resize_token_embeddings(len(reflection_tokenizer), mean_resizing=True)
    new_ids = list(token_ids.all_ids)
    config = LoraConfig(r=4, target_modules="all-linear", trainable_token_indices={"embed_tokens": new_ids})
    model = get_peft_model(base, config)
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: move the LoRA factors and the new rows
        for name, parameter in model.named_parameters():
            if "lora_B" in name or "trainable_tokens_delta" in name:
                parameter.add_(torch.randn_like(parameter) * 0.5)
    model.eval()
    adapter_dir = tmp_path / "adapter"
    # Without the full embedding matrix: the trained rows must come back through trainable_token_indices.
    model.save_pretrained(str(adapter_dir), save_embedding_layers=False)
    copy.deepcopy(reflection_tokenizer).save_pretrained(str(adapter_dir))
    save_meta(adapter_dir, ModelMeta(token_ids, "add", "auto", str(tiny_base_dir), "adapter"))

    loaded = HFEngine(adapter_dir, merge=merge)
    probe = torch.tensor([[1, 5, 9, *new_ids[:6], 40, *new_ids[6:]]])
    with torch.no_grad():
        expected = model(probe).logits
        actual = loaded.model(probe).logits
    assert torch.allclose(expected, actual, atol=1e-5)
    fresh = AutoModelForCausalLM.from_pretrained(str(tiny_base_dir))
    fresh.resize_token_embeddings(len(reflection_tokenizer), mean_resizing=False)
    with torch.no_grad():  # the trained rows really came from the adapter, not from the resize
        assert not torch.allclose(fresh(probe).logits, actual, atol=1e-3)


def test_sampling_is_seeded(merged_dir) -> None:  # type: ignore[no-untyped-def]
    prompt = tuple(encode_prompt(HFEngine(merged_dir).tokenizer, "Who wrote it?"))
    request = GenerationRequest(prompt, max_tokens=6, temperature=1.0)
    first = HFEngine(merged_dir, seed=5).generate([request])[0].token_ids
    second = HFEngine(merged_dir, seed=5).generate([request])[0].token_ids
    assert first == second and len(first) >= 1


@pytest.mark.parametrize("mode", ["adaptive", "always"])
def test_runtime_runs_end_to_end_on_the_tiny_model(engine: HFEngine, mode: str) -> None:
    from selfrag.inference.config import InferenceConfig
    from selfrag.inference.runtime import SelfRAG
    from selfrag.retrieval import BM25Retriever
    from selfrag.trajectory import Passage

    passages = [Passage("a", "Paris", "Paris is the capital of France."), Passage("b", "Rhine", "A river.")]
    rag = SelfRAG(engine, BM25Retriever(passages), InferenceConfig(mode=mode, top_k=2, max_tokens=6))  # type: ignore[arg-type]
    answers = rag.answer_many(["What is the capital of France?", "Which river?"])
    for answer in answers:
        # decide, then per retrieval round a relevance step and the surviving branches (pruning)
        assert 1 <= answer.engine_calls <= 1 + 2 * (1 + rag.config.max_rounds)
        assert answer.to_json()["trace"][0]["step"] == "decide"
        assert answer.generated_tokens > 0
