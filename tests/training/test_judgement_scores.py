"""The score formulas live once (selfrag.scores, issue 29 item 6): the runtime reads them on log-probs an engine
reports (floats), training's judgement on the model's logits (tensors); on the same model and position both give the
same relevance and support scores."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from training_records import three_passage_record  # noqa: E402

from selfrag.inference.scoring import relevance_score, support_score, utility_score  # noqa: E402
from selfrag.reflection import Group  # noqa: E402
from selfrag.scores import first_of_two_terms, support_terms, utility_terms  # noqa: E402
from selfrag.training.dataset import encode_record, reflection_positions  # noqa: E402
from selfrag.training.judgement import score_examples  # noqa: E402


def test_each_formula_gives_the_same_value_on_floats_and_on_tensors() -> None:
    rng = random.Random(0)
    for _ in range(50):
        for terms, size in ((first_of_two_terms, 2), (support_terms, 3), (utility_terms, 5)):
            values = [rng.random() for _ in range(size)]
            on_floats = terms(values)
            on_tensor = terms(torch.tensor(values, dtype=torch.float64))
            assert on_floats[0] / on_floats[1] == pytest.approx(float(on_tensor[0] / on_tensor[1]), abs=1e-12)
    # the paper's definitions, by hand
    assert support_terms([0.5, 0.3, 0.2]) == pytest.approx((0.65, 1.0))
    assert utility_terms([0.0, 0.0, 0.0, 0.0, 2.0]) == pytest.approx((2.0, 2.0))
    assert first_of_two_terms([0.2, 0.6]) == pytest.approx((0.2, 0.8))


def test_the_judgement_and_the_runtime_score_a_position_alike(prepared) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer, token_ids, _ = prepared
    torch.manual_seed(0)
    with torch.no_grad():  # spread the reflection rows: untrained mean rows would score every verdict 0.5
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.3)
    example = {"id": "three", "kind": "gold", **encode_record(three_passage_record(), tokenizer, token_ids, "auto")}
    [row] = score_examples(model, [example], token_ids)
    positions = reflection_positions(example, token_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([example["input_ids"]])).logits[0].float()
    log_probs = torch.log_softmax(logits, dim=-1)

    def reported(position: int) -> dict[int, float]:
        """What an engine reports at the position that predicts ``position``: the reflection ids' log-probs."""
        return {token_id: float(log_probs[position - 1, token_id]) for token_id in token_ids.all_ids}

    relevance = relevance_score(reported(positions[Group.RELEVANCE][0]), token_ids)
    support = support_score(reported(positions[Group.SUPPORT][0]), token_ids)
    assert relevance is not None and support is not None
    assert row["s_rel"] == pytest.approx(relevance, abs=1e-6)
    assert row["s_sup"] == pytest.approx(support, abs=1e-6)
    assert 0.0 < row["s_rel"] < 1.0 and not math.isclose(row["s_rel"], 0.5, abs_tol=1e-3)
    # utility, on the runtime's side only (the judgement does not read it), through the same formula on a tensor
    utility_at = positions[Group.UTILITY][0]
    probabilities = torch.softmax(logits[utility_at - 1, list(token_ids.ids(Group.UTILITY))], dim=-1)
    numerator, denominator = utility_terms(probabilities)
    assert utility_score(reported(utility_at), token_ids) == pytest.approx(float(numerator / denominator), abs=1e-6)
