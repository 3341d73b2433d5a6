"""Calibration: the choice on hand-made dev rows, selfrag.json, and the runtime using the calibrated values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from selfrag import reflection as rf
from selfrag.artifacts import ModelMeta, load_meta, save_meta, write_calibration
from selfrag.evaluation.calibrate import (
    CalibrationResult,
    DevPassage,
    DevRow,
    choose,
    choose_relevance_threshold,
    choose_threshold,
    relevance_measures,
    rounds_measures,
    simulate,
)
from selfrag.inference.config import DEFAULT_RELEVANCE_THRESHOLD, DEFAULT_THRESHOLD, InferenceConfig
from selfrag.inference.engines import ScriptedEngine
from selfrag.inference.runtime import SelfRAG
from selfrag.reflection import ReflectionIds


def row(
    p: float | None, needs: bool | None, answerable: bool, token: str | None, support: float | None,
    relevance: str | None = rf.RELEVANT, rounds: int = 1, rescued: bool = False,
) -> DevRow:
    return DevRow(id="q", p_retrieve=p, needs_retrieval=needs, answerable=answerable, support_token=token,
                  support=support, relevance_token=relevance, rounds=rounds, rescued=rescued)


def passage(relevance: float | None, relevant: bool) -> DevPassage:
    return DevPassage(id="q", passage_id="p", relevance=relevance, relevant=relevant)


def test_threshold_separates_the_gold_decisions() -> None:
    rows = [row(0.9, True, True, None, None), row(0.6, True, True, None, None),
            row(0.3, False, True, None, None), row(0.1, False, True, None, None)]
    threshold, reason = choose_threshold(rows)
    assert threshold is not None and 0.3 <= threshold < 0.6  # any value in [0.3, 0.6) is perfect; the middle one
    assert threshold == 0.45 and "balanced accuracy 100.0%" in reason
    assert choose_threshold([row(0.9, None, True, None, None)])[0] is None  # no gold labels: keep the default


def test_a_question_without_needs_retrieval_needs_it_as_generate_labels_it() -> None:
    """Before: a dev set of unmarked questions and needs_retrieval: false ones was said to lack questions "that need
    and that do not need retrieval". generate labels an unmarked question [Retrieval]; calibrate now agrees."""
    from selfrag.corpus import Query, retrieval_needed
    from selfrag.data_gen.distractors import Evidence
    from selfrag.data_gen.gold import GoldLabeler
    from selfrag.trajectory import Passage

    rows = [row(0.9, None, True, None, None), row(0.7, None, True, None, None),
            row(0.2, False, True, None, None), row(0.1, False, True, None, None)]
    threshold, reason = choose_threshold(rows)
    assert threshold is not None and 0.2 <= threshold < 0.7 and "on 4 labelled dev questions" in reason
    assert choose(rows, 0.1)["measured"]["retrieve_decision_accuracy"] == 1.0
    gold = Passage("p1", "T", "Ada wrote it.")
    unmarked = Query("q", "Who wrote it?", ("Ada",), gold_passage_ids=("p1",))
    records = GoldLabeler({"p1": gold}).label(unmarked, Evidence(()))
    assert retrieval_needed(unmarked.needs_retrieval) and records[0].segments[0].retrieve.value == rf.RETRIEVAL
    assert "no dev question has needs_retrieval: false" in choose_threshold(rows[:2])[1]


def test_support_bound_is_the_largest_within_the_target() -> None:
    full, none = rf.FULLY_SUPPORTED, rf.NO_SUPPORT
    rows = [row(0.9, True, True, full, 0.9), row(0.9, True, True, full, 0.8), row(0.9, True, True, full, 0.7),
            row(0.9, True, True, full, 0.6), row(0.9, True, True, full, 0.5), row(0.9, True, True, full, 0.45),
            row(0.9, True, True, full, 0.42), row(0.9, True, True, full, 0.41), row(0.9, True, True, full, 0.40),
            row(0.9, True, True, full, 0.35),  # 10 answerable: a 10% target allows one false abstain
            row(0.9, True, False, full, 0.3), row(0.9, True, False, none, 0.1), row(0.9, True, False, full, 0.38)]
    calibration = choose(rows, target=0.1)
    # bound 0.40 abstains only on the 0.35 answerable one (10%); 0.45 would abstain on four
    assert calibration["support_bound"] == 0.4
    measured = calibration["measured"]
    assert measured["target_met"] and measured["false_abstain_rate"] == pytest.approx(0.1)
    assert measured["abstain_rate_unanswerable"] == 1.0
    assert calibration["threshold"] == DEFAULT_THRESHOLD  # every row needs retrieval: no negatives to separate


def test_target_out_of_reach_is_said() -> None:
    rows = [row(0.9, True, True, rf.NO_SUPPORT, 0.1), row(0.9, True, True, rf.FULLY_SUPPORTED, 0.9)]
    calibration = choose(rows, target=0.1)
    assert calibration["support_bound"] == 0.0 and not calibration["measured"]["target_met"]
    assert "on_unsupported=flag" in calibration["measured"]["note"]


def test_simulate_matches_the_runtime_rule() -> None:
    rows = [row(0.1, False, True, rf.NO_SUPPORT, 0.1), row(0.5, True, True, rf.FULLY_SUPPORTED, 0.3)]
    assert simulate(rows, threshold=0.2, bound=0.0) == [(False, False), (True, False)]
    assert simulate(rows, threshold=0.2, bound=0.5) == [(False, False), (True, True)]
    # the runtime's policy: a best candidate judged [Irrelevant] (or with no verdict) is unsupported, whatever IsSUP
    irrelevant = [row(0.9, True, True, rf.FULLY_SUPPORTED, 0.9, relevance=token) for token in (rf.IRRELEVANT, None)]
    assert simulate(irrelevant, threshold=0.2, bound=0.0) == [(True, True), (True, True)]


def test_relevance_threshold_separates_gold_passages_where_the_verdict_does_not() -> None:
    """The model ranks the gold passages first but calls everything [Irrelevant] (all scores < 0.5): the cut moves
    to between the two groups, and the verdict at 0.5 is reported beside it."""
    passages = [passage(0.30, True), passage(0.22, True), passage(0.12, False), passage(0.05, False),
                passage(0.02, False), passage(None, False)]
    threshold, reason = choose_relevance_threshold(passages)
    assert threshold == pytest.approx(0.17)  # the midpoint of 0.12 and 0.22
    assert "balanced accuracy 100.0% on 5 dev passages (2 gold; best cut 0.17: 100.0%)" in reason
    assert "verdict (0.5): 50.0%" in reason
    measured = relevance_measures(passages, threshold)
    assert measured["relevant_recall"] == 1.0 and measured["relevant_recall_at_0.5"] == 0.0
    assert measured["irrelevant_rejected"] == 1.0 and measured["relevance_passages"] == 5


#: the quickstart's dev passages (commit 8601bd2's model, 12 dev questions): 4 gold among 36, scores bunched near 1
QUICKSTART_DEV = ([0.98, 0.995, 0.999, 1.0],
                  [0.01, 0.016, 0.021, 0.022, 0.038, 0.044, 0.048, 0.059, 0.069, 0.07, 0.077, 0.118, 0.119, 0.149,
                   0.159, 0.178, 0.189, 0.196, 0.2, 0.213, 0.337, 0.346, 0.379, 0.577, 0.644, 0.67, 0.83, 0.883,
                   0.954, 0.961, 0.996, 0.999])


def test_relevance_threshold_from_few_gold_passages_stays_near_the_models_verdict() -> None:
    """Four gold passages: the best cut (0.971, just under the lowest gold score) rejected 8 of 14 gold test passages
    the model called [Relevant]. Within one standard error of the best, the cut nearest 0.5 is taken; the same
    distribution ten times over has a smaller error, and the cut moves further toward the best."""
    gold, other = QUICKSTART_DEV
    passages = [passage(s, True) for s in gold] + [passage(s, False) for s in other]
    threshold, reason = choose_relevance_threshold(passages)
    assert 0.577 < threshold < 0.644
    assert "best cut 0.97" in reason and ": 96.9%)" in reason and "within one standard error" in reason
    assert "balanced accuracy 87.5% on 36 dev passages (4 gold" in reason  # 25 of 32 others rejected, all 4 gold kept
    tenfold, _ = choose_relevance_threshold(passages * 10)
    assert 0.67 < tenfold < 0.971


def test_relevance_threshold_keeps_the_models_verdict_when_the_best_is_not_clearly_better() -> None:
    passages = [passage(s, True) for s in (0.9, 0.8, 0.7, 0.45)] + [passage(s, False) for s in (0.55, 0.3, 0.2, 0.1)]
    threshold, reason = choose_relevance_threshold(passages)  # best: 0.375 (87.5%); 0.5: 75.0%, within its error
    assert threshold == 0.5 and "kept the model's own verdict (0.5)" in reason


def test_relevance_threshold_tie_takes_the_middle_and_scores_far_below_a_grid_still_separate() -> None:
    passages = [passage(0.004, True), passage(0.003, True), passage(0.001, False), passage(0.0005, False)]
    threshold, _ = choose_relevance_threshold(passages)
    assert 0.001 < threshold < 0.003
    overlapping = [passage(0.6, True), passage(0.2, True), passage(0.4, False), passage(0.1, False)]
    threshold, reason = choose_relevance_threshold(overlapping)
    assert "balanced accuracy 75.0%" in reason and threshold in (pytest.approx(0.15), pytest.approx(0.5))


@pytest.mark.parametrize("passages", [[], [passage(0.3, True)], [passage(0.3, False), passage(None, True)]])
def test_relevance_threshold_without_both_classes_keeps_the_default(passages) -> None:  # type: ignore[no-untyped-def]
    threshold, reason = choose_relevance_threshold(passages)
    assert threshold == DEFAULT_RELEVANCE_THRESHOLD and "kept the default" in reason


def test_summary_names_all_three_values_and_what_re_retrieval_did() -> None:
    rows = [row(0.9, True, True, rf.FULLY_SUPPORTED, 0.9, rounds=1),
            row(0.9, True, True, rf.FULLY_SUPPORTED, 0.9, rounds=3),
            row(0.9, True, True, rf.FULLY_SUPPORTED, 0.9, rounds=2, rescued=True)]
    calibration = choose(rows, target=0.1)
    calibration.update({"relevance_threshold": 0.17, "relevance_threshold_reason": "balanced accuracy 100.0%",
                        "dev_examples": 3})
    calibration["measured"].update(relevance_measures([passage(0.3, True), passage(0.1, False)], 0.17))
    calibration["measured"].update(rounds_measures(rows))
    assert calibration["measured"]["re_retrieved"] == 2 and calibration["measured"]["rescued_by_re_retrieval"] == 1
    text = CalibrationResult(calibration, None).summary()
    assert "relevance_threshold = 0.17  (balanced accuracy 100.0%; gold passages judged [Relevant] 100.0%" in text
    assert "re-retrieval: 2 of 3 dev questions went on to another round; 1 of them were answered there" in text
    assert "support_bound = " in text and "not written" in text


def test_calibration_in_selfrag_json_reaches_the_runtime(
    tmp_path: Path, reflection_tokenizer: Any, token_ids: ReflectionIds, world_engine: ScriptedEngine
) -> None:
    save_meta(tmp_path, ModelMeta(token_ids, "add", "auto", "base", "adapter"))
    assert load_meta(tmp_path).calibration is None  # type: ignore[union-attr]
    values = {"threshold": 0.95, "support_bound": 0.3, "relevance_threshold": 0.12}
    write_calibration(tmp_path, values)
    meta = load_meta(tmp_path)
    assert meta is not None and meta.calibration == values
    assert json.loads((tmp_path / "selfrag.json").read_text())["base_model"] == "base"  # other keys kept

    world_engine.calibration = meta.calibration  # what every engine reads from selfrag.json
    runtime = SelfRAG(world_engine, None, InferenceConfig(mode="never"))
    assert (runtime.config.threshold, runtime.config.support_bound) == (0.95, 0.3)
    assert runtime.config.relevance_threshold == 0.12
    explicit = SelfRAG(world_engine, None, InferenceConfig(mode="never", threshold=0.5, support_bound=0.1))
    assert (explicit.config.threshold, explicit.config.support_bound) == (0.5, 0.1)  # the user's values win
    off = SelfRAG(world_engine, None, InferenceConfig(mode="never", use_calibration=False))
    assert (off.config.threshold, off.config.support_bound) == (DEFAULT_THRESHOLD, 0.0)
    world_engine.calibration = None
    plain = SelfRAG(world_engine, None, InferenceConfig(mode="never"))
    assert (plain.config.threshold, plain.config.support_bound) == (DEFAULT_THRESHOLD, 0.0)


def test_calibrated_threshold_changes_the_decision(world_engine: ScriptedEngine) -> None:
    from selfrag.evaluation.modes import ExampleRetriever

    retriever = ExampleRetriever([], None)  # finds nothing; only the decision matters here
    world_engine.calibration = {"threshold": 0.95}  # type: ignore[attr-defined]
    answer = SelfRAG(world_engine, retriever, InferenceConfig()).answer("Capital of France?")
    assert not answer.retrieved and "threshold 0.95" in answer.trace[0].reason  # p_retrieve 0.9 <= 0.95
    world_engine.calibration = {"threshold": 0.5}  # type: ignore[attr-defined]
    answer = SelfRAG(world_engine, retriever, InferenceConfig()).answer("Capital of France?")
    assert "p_retrieve 0.9000 > threshold 0.5" in answer.trace[0].reason
