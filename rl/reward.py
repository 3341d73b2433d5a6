"""The GRPO reward of ``selfrag rl``: one function per term, each weighted by :class:`~.config.RewardConfig`.

    reward = Reward(RewardConfig(), OverlapJudge())
    reward.terms([rollout], answers=[("Paris",)], answerable=[True])   # {"correct": [1.0], "abstain": [0.0], ...}

What a rollout *ships* is read as the runtime reads it (long form, ``on_unsupported: abstain``): a sentence written
from a passage ships when the model judged the passage relevant and the sentence supported
(``[Fully supported]``/``[Partially supported]``); a sentence written without evidence ships as it is. Nothing
shipped (or the abstain sentence) is an abstention. The terms, each in [-1, 1] before its weight:

* ``correct``: answerable questions only: the shipped answer holds a gold answer (or its token F1);
* ``abstain``: +1 abstaining on an unanswerable question, -1 answering it, -1 abstaining on an answerable one;
* ``support``: the share of shipped sentences the claim judge (:mod:`selfrag.evaluation.claims`) finds supported by
  their own passage; a sentence without one counts unsupported, so writing ``[Fully supported]`` pays only where
  the passage bears it out;
* ``format``: -1 when the rollout breaks the grammar (the runtime's parser reports a problem);
* ``retrieval``: -1 per passage retrieved (a cost per round).

Gaming does not pay (``tests/rl/test_rl_reward.py``): on a mix of answerable and unanswerable questions, always
abstaining and always answering from a cited passage both score below the policy that answers where it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from selfrag import reflection as rf
from selfrag.evaluation.claims import Claim, Judge, NLIJudge, OverlapJudge
from selfrag.evaluation.metrics import match, token_f1
from selfrag.evaluation.modes import is_abstention

from .config import RewardConfig
from .rollout import Rollout, RolloutSegment

TERMS = ("correct", "abstain", "support", "format", "retrieval")


def ships(segment: RolloutSegment) -> bool:
    """Whether the runtime ships this sentence: no evidence, or evidence judged relevant and supporting it."""
    if segment.passage is None:
        return True
    return segment.relevance != rf.IRRELEVANT and segment.support in (rf.FULLY_SUPPORTED, rf.PARTIALLY_SUPPORTED)


def build_judge(config: RewardConfig) -> Judge:
    """The support term's claim judge."""
    judge = config.judge
    if judge.kind == "nli":
        assert judge.model is not None  # validate() says so
        return NLIJudge.load(judge.model, judge.threshold)
    return OverlapJudge(judge.threshold)


class Reward:
    """Scores rollouts by term; :meth:`functions` gives TRL one reward function per term (weights beside them)."""

    def __init__(self, config: RewardConfig, judge: Judge) -> None:
        self.config, self.judge = config, judge
        self._memo: tuple[tuple[int, ...], dict[str, list[float]]] | None = None

    @property
    def weights(self) -> list[float]:
        return [float(getattr(self.config, term)) for term in TERMS]

    def terms(self, rollouts: Sequence[Rollout], answers: Sequence[Sequence[str]],
              answerable: Sequence[bool]) -> dict[str, list[float]]:
        """Each term's value per rollout (before its weight)."""
        key = tuple(id(rollout) for rollout in rollouts)
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        shipped = [[segment for segment in rollout.segments if ships(segment)] for rollout in rollouts]
        texts = [" ".join(segment.text for segment in sentences) for sentences in shipped]
        abstained = [not text.strip() or is_abstention(text, self.config.abstain_text) for text in texts]
        values: dict[str, list[float]] = {term: [] for term in TERMS}
        supported = self._supported(rollouts, shipped, abstained)
        for index, rollout in enumerate(rollouts):
            golds, can = list(answers[index]), bool(answerable[index])
            if not can or abstained[index]:
                correct = 0.0
            elif self.config.correctness == "f1":
                correct = token_f1(texts[index], golds)
            else:
                correct = float(match(texts[index], golds))
            values["correct"].append(correct)
            values["abstain"].append((1.0 if abstained[index] else -1.0) if not can else
                                     (-1.0 if abstained[index] else 0.0))
            values["support"].append(supported[index])
            values["format"].append(0.0 if rollout.trajectory.well_formed else -1.0)
            values["retrieval"].append(-float(rollout.retrievals))
        self._memo = (key, values)
        return values

    def total(self, rollouts: Sequence[Rollout], answers: Sequence[Sequence[str]],
              answerable: Sequence[bool]) -> list[float]:
        """The weighted sum of the terms per rollout (what GRPO maximises)."""
        values = self.terms(rollouts, answers, answerable)
        return [sum(weight * values[term][i] for term, weight in zip(TERMS, self.weights, strict=True))
                for i in range(len(rollouts))]

    def _supported(self, rollouts: Sequence[Rollout], shipped: list[list[RolloutSegment]],
                   abstained: list[bool]) -> list[float]:
        claims = [Claim(rollout.question, segment.text, () if segment.passage is None else (segment.passage,))
                  for rollout, sentences, gone in zip(rollouts, shipped, abstained, strict=True)
                  if not gone for segment in sentences]
        verdicts = iter(self.judge.judge(claims) if claims else [])
        shares = []
        for sentences, gone in zip(shipped, abstained, strict=True):
            if gone:
                shares.append(0.0)
                continue
            judged = [next(verdicts) is True for _ in sentences]
            shares.append(sum(judged) / len(judged))
        return shares

    def functions(self) -> list[Any]:
        """One TRL reward function per term, named after it (TRL logs ``rewards/<name>/mean``)."""
        return [RewardTerm(self, term) for term in TERMS]


class RewardTerm:
    """One term as a TRL reward function: reads the ``rollout`` column the rollout function adds, and the data set's
    ``answers`` and ``answerable`` columns."""

    def __init__(self, reward: Reward, term: str) -> None:
        self.reward, self.term = reward, term
        self.__name__ = term

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], rollout: Sequence[Rollout],
                 answers: Sequence[Sequence[str]], answerable: Sequence[bool], **_: Any) -> list[float]:
        return self.reward.terms(rollout, answers, answerable)[self.term]
