"""The scripted engine behaves like a backend; the registries build what they name."""

from __future__ import annotations

import json

from selfrag.inference.engines import ENGINES, GenerationRequest, Script, ScriptedEngine
from selfrag.inference.retrievers import RETRIEVERS


def test_scripted_engine_stops_filters_and_records(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    stop = token_ids.id("[Utility:5]")
    script = Script((10, 11, stop, 12), ({10: -0.1, 999: -1.0}, {}, {stop: -0.5}))
    engine = ENGINES["fake"](tokenizer=reflection_tokenizer, token_ids=token_ids, script={(1, 2): script})
    assert isinstance(engine, ScriptedEngine)
    requests = [
        GenerationRequest((1, 2), max_tokens=8, stop_token_ids=(stop,), score_token_ids=(10, stop)),
        GenerationRequest((1, 2), max_tokens=2),
    ]
    stopped, cut = engine.generate(requests)
    assert stopped.token_ids == (10, 11, stop) and stopped.finish_reason == "stop"
    assert stopped.score_logprobs == ({10: -0.1}, {}, {stop: -0.5})  # only requested ids are reported
    assert stopped.text.endswith("[Utility:5]")
    assert cut.token_ids == (10, 11) and cut.finish_reason == "length" and cut.score_logprobs == ({}, {})
    assert engine.calls == [requests]


def test_scripted_engine_eos(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    eos = reflection_tokenizer.eos_token_id
    engine = ScriptedEngine(reflection_tokenizer, token_ids, lambda request: Script((7, eos, 8)))
    [generation] = engine.generate([GenerationRequest((1,), max_tokens=5)])
    assert generation.token_ids == (7, eos) and generation.finish_reason == "eos"


def test_bm25_retriever_from_corpus(tmp_path) -> None:  # type: ignore[no-untyped-def]
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "a", "title": "Paris", "text": "Paris is the capital of France."},
        {"id": "b", "title": "Rivers", "text": "The Rhine flows north."},
    ]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    retriever = RETRIEVERS["bm25"](corpus=corpus)
    [hit, *_] = retriever.search("capital of France", k=2)
    assert hit.passage.id == "a"


def test_build_generation_cuts_like_hf_and_picks_scores(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The vllm and openai engines build their Generation here: the cut, the score ids, the top-k bounds."""
    import math

    from selfrag.inference.engines.base import build_generation, concat_generations

    eos = reflection_tokenizer.eos_token_id
    request = GenerationRequest((1, 2), max_tokens=8, stop_token_ids=(9,), score_token_ids=(5, 6))
    positions = [{5: -0.1, 6: -2.0, 7: -3.0}, {7: -0.5, 5: -4.0}, {9: -0.2}, {1: -1.0}]
    exact = build_generation(reflection_tokenizer, request, [5, 7, 9, 4], positions, True, [eos], 0.5)
    assert exact.token_ids == (5, 7, 9) and exact.finish_reason == "stop"  # cut after the stop id, kept
    assert exact.score_logprobs == ({5: -0.1, 6: -2.0}, {5: -4.0}, {}) and exact.score_bounds == ()
    top_k = build_generation(reflection_tokenizer, request, [5, eos, 3], positions[:1], False, [eos], 0.5)
    assert top_k.token_ids == (5, eos) and top_k.finish_reason == "eos"
    assert top_k.score_bounds == (-3.0, -math.inf)  # the k-th returned log-prob; nothing returned: no bound
    joined = concat_generations(exact, top_k)
    assert joined.score_bounds == (0.0, 0.0, 0.0, -3.0, -math.inf)  # one per position, exact part uninformative
    assert len(joined.score_logprobs) == len(joined.token_ids) == 5
