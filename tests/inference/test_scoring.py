"""The score formulas, on hand-set log-probs."""

from __future__ import annotations

import math

import pytest

from selfrag import reflection as rf
from selfrag.inference import scoring
from selfrag.reflection import Group


def _log(ids, probabilities):  # type: ignore[no-untyped-def]
    return {ids.id(token): math.log(p) for token, p in probabilities.items()}


def test_retrieve_probability_renormalises_probabilities(token_ids) -> None:  # type: ignore[no-untyped-def]
    logprobs = _log(token_ids, {rf.RETRIEVAL: 0.03, rf.NO_RETRIEVAL: 0.27})
    assert scoring.retrieve_probability(logprobs, token_ids) == pytest.approx(0.1)
    only_one = _log(token_ids, {rf.NO_RETRIEVAL: 0.5})
    assert scoring.retrieve_probability(only_one, token_ids) == 0.0
    assert scoring.retrieve_probability({}, token_ids) is None


def test_relevance_support_utility(token_ids) -> None:  # type: ignore[no-untyped-def]
    assert scoring.relevance_score(_log(token_ids, {rf.RELEVANT: 0.6, rf.IRRELEVANT: 0.2}), token_ids) == (
        pytest.approx(0.75)
    )
    support = _log(token_ids, {rf.FULLY_SUPPORTED: 0.2, rf.PARTIALLY_SUPPORTED: 0.2, rf.NO_SUPPORT: 0.1})
    assert scoring.support_score(support, token_ids) == pytest.approx((0.2 + 0.1) / 0.5)
    utility = _log(token_ids, {"[Utility:1]": 0.1, "[Utility:5]": 0.3})
    assert scoring.utility_score(utility, token_ids) == pytest.approx((-0.1 + 0.3) / 0.4)
    assert scoring.support_score({}, token_ids) is None


def test_score_continuation_reads_each_group_at_its_position(token_ids) -> None:  # type: ignore[no-untyped-def]
    generated = [token_ids.id(rf.IRRELEVANT), 42, 43, token_ids.id(rf.PARTIALLY_SUPPORTED), token_ids.id("[Utility:2]")]
    logprobs = [
        _log(token_ids, {rf.RELEVANT: 0.2, rf.IRRELEVANT: 0.6}),
        _log(token_ids, {rf.FULLY_SUPPORTED: 0.9}),  # not a support position: ignored
        {},
        _log(token_ids, {rf.FULLY_SUPPORTED: 0.1, rf.PARTIALLY_SUPPORTED: 0.6, rf.NO_SUPPORT: 0.1}),
        {},  # the utility position reports nothing
    ]
    weights = {"relevance": 1.0, "support": 2.0, "utility": 0.5}
    score = scoring.score_continuation(generated, logprobs, token_ids, weights)
    assert score.relevance == pytest.approx(0.25)
    assert score.support == pytest.approx(0.4 / 0.8)
    assert score.utility is None and score.missing == ("utility",)
    assert score.total == pytest.approx(0.25 + 2.0 * 0.5)
    assert (score.relevance_token, score.support_token, score.utility_token) == (
        rf.IRRELEVANT, rf.PARTIALLY_SUPPORTED, "[Utility:2]"
    )


def test_first_position(token_ids) -> None:  # type: ignore[no-untyped-def]
    ids = [5, token_ids.id("[Utility:1]"), token_ids.id("[Utility:3]")]
    assert scoring.first_position(ids, token_ids, Group.UTILITY) == 1
    assert scoring.first_position(ids, token_ids, Group.SUPPORT) is None
