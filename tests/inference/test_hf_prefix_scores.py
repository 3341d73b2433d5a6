"""HFEngine.score_prefixes on the tiny Llama: one forward per batch reads what a one-token decode after each prefix
reports, in fp32 and bf16, on transformers with and without a bool ``logits_to_keep``."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from selfrag import logits as logits_module  # noqa: E402
from selfrag.inference.engines import GenerationRequest, PrefixScorer, PrefixScoreRequest  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.prompting import encode_prompt, encode_text  # noqa: E402
from selfrag.reflection import Group  # noqa: E402


@pytest.fixture(scope="module")
def merged_dir(merged_model_dir) -> Path:  # type: ignore[no-untyped-def]
    return merged_model_dir(3)


def _records(engine: HFEngine) -> list[tuple[int, ...]]:
    """Records of different lengths: a prompt, then text and reflection ids forced after it."""
    ids = engine.token_ids
    texts = [("Who?", " Paris is big."), ("What is the capital of France?", " It is Paris, on the Seine river."),
             ("Name a river in the north of the country, please.", " The Somme.")]
    return [(*encode_prompt(engine.tokenizer, question), ids.id("[Retrieval]"), *encode_text(engine.tokenizer, answer),
             ids.id("[Utility:5]")) for question, answer in texts]


def _decoded(engine: HFEngine, request: PrefixScoreRequest) -> list[dict[int, float]]:
    """The oracle: one one-token decode per prefix."""
    generations = engine.generate([GenerationRequest(request.prompt_ids[:length], max_tokens=1,
                                                     score_token_ids=request.score_token_ids)
                                   for length in request.prefix_lengths])
    return [generation.score_logprobs[0] for generation in generations]


@pytest.mark.parametrize("bool_keep", [True, False], ids=["bool-logits-to-keep", "columns-before-5.20"])
def test_each_prefix_reads_what_a_one_token_decode_reports(merged_dir, bool_keep, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(logits_module._BOOL_KEEP, "supported", bool_keep)
    engine = HFEngine(merged_dir, batch_size=2)  # three records: one batch mixes two lengths
    assert isinstance(engine, PrefixScorer)
    records = _records(engine)
    requests = [
        PrefixScoreRequest(records[1], (len(records[1]), 5, len(records[1]) - 3, 5), engine.token_ids.all_ids),
        PrefixScoreRequest(records[0], (1, len(records[0]) - 1), engine.token_ids.ids(Group.UTILITY)),
        PrefixScoreRequest(records[2], (len(records[2]) - 4,), engine.token_ids.ids(Group.RETRIEVE)),  # ids not read
    ]
    scored = engine.score_prefixes(requests)
    assert [len(per_request) for per_request in scored] == [4, 2, 1]  # in the requests' order, lengths' order
    for request, per_request in zip(requests, scored, strict=True):
        for mine, theirs in zip(per_request, _decoded(engine, request), strict=True):
            assert set(mine) == set(request.score_token_ids)
            assert mine == pytest.approx(theirs, abs=1e-4)


def test_bfloat16_prefix_scores_come_from_the_fp32_head(merged_dir) -> None:  # type: ignore[no-untyped-def]
    engine = HFEngine(merged_dir, dtype="bfloat16")
    record = _records(engine)[1]
    [[scores]] = engine.score_prefixes([PrefixScoreRequest(record, (len(record),), engine.token_ids.all_ids)])
    [decoded] = _decoded(engine, PrefixScoreRequest(record, (len(record),), engine.token_ids.all_ids))
    assert scores == pytest.approx(decoded, abs=1e-4)
    assert len(set(scores.values())) == len(scores)  # bf16 logits tie; fp32 ones do not


def test_one_forward_per_batch(merged_dir) -> None:  # type: ignore[no-untyped-def]
    engine = HFEngine(merged_dir, batch_size=2)
    forwards: list[tuple[int, ...]] = []
    engine.model.register_forward_hook(lambda _module, _args, kwargs, _output: forwards.append(
        tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    records = _records(engine)
    engine.score_prefixes([PrefixScoreRequest(record, (3, len(record)), engine.token_ids.all_ids)
                           for record in records])
    shortest, middle, longest = sorted(len(record) for record in records)
    assert forwards == [(2, middle), (1, longest)]  # three records, batch_size 2: the two shortest together


@pytest.mark.parametrize(("lengths", "message"), [((), "one or more"), ((0,), "1..4"), ((5,), "1..4")])
def test_prefix_lengths_are_checked(lengths: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrefixScoreRequest((1, 2, 3, 4), lengths, (7,))
