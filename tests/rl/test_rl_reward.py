"""The GRPO reward (selfrag.rl.reward): each term on hand-made rollouts, and gaming does not pay."""

from __future__ import annotations

import dataclasses
from statistics import mean

import pytest

from selfrag.config import from_dict
from selfrag.errors import ConfigError
from selfrag.evaluation.claims import NLIJudge, OverlapJudge
from selfrag.rl.config import RewardConfig
from selfrag.rl.reward import TERMS, Reward, build_judge
from selfrag.rl.rollout import Rollout, segments_of
from selfrag.trajectory import Passage, parse_trajectory

FRANCE = Passage("p1", "France", "Paris is the capital of France.")
SKY = Passage("p2", "Sky", "The sky is blue on a clear day.")
MARS = Passage("p3", "Mars", "Mars is the fourth planet from the Sun.")
MOON = Passage("p4", "Moon", "The Moon orbits the Earth every month.")
#: a mixed set: (question, gold answers, answerable, the passage the retriever finds)
ITEMS = [
    ("What is the capital of France?", ("Paris",), True, FRANCE),
    ("What colour is the sky?", ("blue",), True, SKY),
    ("Who is the king of Mars?", (), False, MARS),
    ("What is the Moon's favourite song?", (), False, MOON),
]
CORRECT = {"capital": "The capital of France is Paris.", "sky": "The sky is blue."}


def rollout(question: str, text: str, passages: tuple[Passage, ...] = ()) -> Rollout:
    trajectory = parse_trajectory(text)
    return Rollout(question, (1,), (), (), trajectory, segments_of(trajectory, passages), passages, "utility")


def retrieved(passage: Passage, verdict: str, sentence: str, support: str, utility: str) -> str:
    return f"[Retrieval]<paragraph>{passage.render()}</paragraph>{verdict}{sentence}{support}{utility}"


def correct_policy(question: str, answerable: bool, passage: Passage) -> Rollout:
    """Answers from the passage where it holds the answer; judges the passage irrelevant (abstains) otherwise."""
    if answerable:
        sentence = CORRECT["capital"] if "France" in question else CORRECT["sky"]
        return rollout(question, retrieved(passage, "[Relevant]", sentence, "[Fully supported]", "[Utility:5]"),
                       (passage,))
    return rollout(question, retrieved(passage, "[Irrelevant]", "No idea.", "[No support / Contradictory]",
                                       "[Utility:1]"), (passage,))


def always_abstain(question: str, answerable: bool, passage: Passage) -> Rollout:
    return rollout(question, retrieved(passage, "[Irrelevant]", "No idea.", "[No support / Contradictory]",
                                       "[Utility:1]"), (passage,))


def always_cite(question: str, answerable: bool, passage: Passage) -> Rollout:
    """Calls every passage relevant and ships its sentence as fully supported: a cited claim on every question."""
    return rollout(question, retrieved(passage, "[Relevant]", passage.text, "[Fully supported]", "[Utility:5]"),
                   (passage,))


def always_guess(question: str, answerable: bool, passage: Passage) -> Rollout:
    """Never retrieves (no cost) and answers every question with the same word."""
    return rollout(question, "[No Retrieval]Paris.[Utility:5]")


def score(policy, config: RewardConfig) -> float:  # type: ignore[no-untyped-def]
    reward = Reward(config, OverlapJudge(config.judge.threshold))
    rollouts = [policy(question, answerable, passage) for question, _, answerable, passage in ITEMS]
    return mean(reward.total(rollouts, [answers for _, answers, _, _ in ITEMS], [a for _, _, a, _ in ITEMS]))


@pytest.mark.parametrize("correctness", ["contains", "f1"])
def test_gaming_scores_below_the_correct_policy(correctness: str) -> None:
    config = RewardConfig(correctness=correctness)  # type: ignore[arg-type]
    right = score(correct_policy, config)
    for gaming in (always_abstain, always_cite, always_guess):
        assert score(gaming, config) < right, gaming.__name__


def test_each_term_on_one_rollout_each() -> None:
    reward = Reward(RewardConfig(), OverlapJudge())
    rollouts = [
        correct_policy(*ITEMS[0][:1], True, FRANCE),
        always_cite("Who is the king of Mars?", False, MARS),
        always_abstain("What colour is the sky?", True, SKY),
        rollout("What colour is the sky?", f"[Retrieval]<paragraph>{SKY.render()}</paragraph>blue", (SKY,)),  # broken
        rollout("What colour is the sky?", "[No Retrieval]It is blue.[Utility:4]"),
    ]
    answers = [("Paris",), (), ("blue",), ("blue",), ("blue",)]
    terms = reward.terms(rollouts, answers, [True, False, True, True, True])
    assert terms == {
        "correct": [1.0, 0.0, 0.0, 0.0, 1.0],  # the broken one has no verdict on its sentence: nothing ships
        "abstain": [0.0, -1.0, -1.0, -1.0, 0.0],
        "support": [1.0, 1.0, 0.0, 0.0, 0.0],  # the sentence without a passage counts unsupported
        "format": [0.0, 0.0, 0.0, -1.0, 0.0],
        "retrieval": [-1.0, -1.0, -1.0, -1.0, -0.0],
    }
    weights = dict(zip(TERMS, reward.weights, strict=True))
    assert reward.total(rollouts[:1], answers[:1], [True]) == [pytest.approx(
        weights["correct"] + weights["support"] - weights["retrieval"])]


def test_an_unsupported_citation_earns_no_support_and_f1_is_partial() -> None:
    made_up = rollout("What colour is the sky?", retrieved(SKY, "[Relevant]", "Purple elephants dance tonight.",
                                                           "[Fully supported]", "[Utility:5]"), (SKY,))
    reward = Reward(RewardConfig(correctness="f1"), OverlapJudge())
    terms = reward.terms([made_up, correct_policy("What colour is the sky?", True, SKY)], [("blue",), ("blue",)],
                         [True, True])
    assert terms["support"] == [0.0, 1.0]
    assert terms["correct"][0] == 0.0 and 0 < terms["correct"][1] < 1


def test_the_trl_functions_are_named_after_the_terms_and_read_the_rollout_column() -> None:
    reward = Reward(RewardConfig(), OverlapJudge())
    functions = reward.functions()
    assert [function.__name__ for function in functions] == list(TERMS)
    rollouts = [correct_policy(ITEMS[0][0], True, FRANCE)]
    values = [function(prompts=["q"], completions=["c"], completion_ids=[[1]], rollout=rollouts,
                       answers=[("Paris",)], answerable=[True], trainer_state=None) for function in functions]
    assert values == [[1.0], [0.0], [1.0], [0.0], [-1.0]]


def test_weights_are_validated() -> None:
    assert RewardConfig(support=-1).validate() == ["support must be a weight >= 0, got -1; 0 drops the term"]
    with pytest.raises(ConfigError, match=r"^reward\.judge\.kind=nli needs reward\.judge\.model"):
        from_dict(Sections, {"reward": {"judge": {"kind": "nli"}}})


@dataclasses.dataclass
class Sections:
    """The reward as ``selfrag rl`` nests it, so messages carry the ``reward.`` prefix."""

    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)


@pytest.mark.parametrize(("data", "line"), [
    ({"judge": "nli"}, "reward.judge=nli is refused: the judge is a section, as in selfrag eval (kind, model, "
                       "threshold); write reward.judge.kind=nli"),
    ({"judge": "overlap"}, "reward.judge=overlap is refused: the judge is a section, as in selfrag eval (kind, model, "
                           "threshold); write reward.judge.kind=overlap"),
    ({"judge_model": "nli-dir"}, "reward.judge_model was removed: write reward.judge.model=DIR"),
    ({"judge_threshold": 0.7}, "reward.judge_threshold was removed: write reward.judge.threshold="),
    ({"judge": {"kind": "critic"}}, "reward.judge.kind=critic is refused: the critic is the policy itself"),
    ({"judge": {"kind": "none"}}, "reward.judge.kind=none is refused: the support term needs a judge"),
    ({"judge": {"kind": "overlp"}}, "reward.judge.kind must be one of ['overlap', 'nli'], got 'overlp'"),
])
def test_the_judges_old_flat_spelling_and_evals_other_kinds_are_refused_in_one_line(
    data: dict[str, object], line: str
) -> None:
    with pytest.raises(ConfigError) as error:
        from_dict(Sections, {"reward": data})
    [problem] = error.value.problems
    assert problem.startswith(line), problem


def test_the_judge_section_reaches_the_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    config = from_dict(Sections, {"reward": {"judge": {"threshold": 0.8}}}).reward
    judge = build_judge(config)
    assert isinstance(judge, OverlapJudge) and judge.threshold == 0.8
    loaded: list[tuple[str, float]] = []
    monkeypatch.setattr(NLIJudge, "load", classmethod(lambda cls, name, threshold: loaded.append((name, threshold))))
    config = from_dict(Sections, {"reward": {"judge": {"kind": "nli", "model": "nli-dir", "threshold": 0.7}}}).reward
    build_judge(config)
    assert loaded == [("nli-dir", 0.7)]
