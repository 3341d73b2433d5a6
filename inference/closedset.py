"""Closed-set tasks (multiple choice, true/false): candidates vote for a choice with their scores.

    rag.answer("Is the Seine in France?", choices=["true", "false"])

As in the paper, each candidate's answer is mapped to a choice after normalisation (lower case, no
punctuation, no articles) and the combined scores of the candidates are summed per choice; the choice
with the highest sum wins (a tie keeps the earlier choice). The policy then judges the best candidate
that voted for the winner. A candidate whose answer matches no choice does not vote (the trace lists it).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import replace

from . import policy
from .answer import Candidate
from .trace import ChoiceMatch, Rank, Vote

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalise(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def match(answer: str, choices: Sequence[str]) -> str | None:
    """The choice ``answer`` states: equal after normalisation, or its first words (longest choice first)."""
    said = normalise(answer)
    options = sorted(choices, key=lambda choice: -len(normalise(choice)))
    for choice in options:
        if said == normalise(choice):
            return choice
    for choice in options:
        wanted = normalise(choice)
        if wanted and said.startswith(wanted + " "):
            return choice
    return None


def vote(candidates: Sequence[Candidate], indices: Sequence[int], choices: Sequence[str]) -> tuple[int, Vote | Rank]:
    """The best candidate voting for the winning choice, and the trace entry (a :class:`~.trace.Vote`; where no
    candidate matches a choice, the :class:`~.trace.Rank` the scores alone give)."""
    totals: dict[str, float] = {}
    voters: dict[str, list[int]] = {}
    abstaining = []
    for index in indices:
        choice = match(candidates[index].answer, choices)
        if choice is None:
            abstaining.append(policy.passage_id(candidates[index]))
            continue
        score = candidates[index].score
        totals[choice] = totals.get(choice, 0.0) + (score.total if score is not None else 0.0)
        voters.setdefault(choice, []).append(index)
    if not totals:
        best, ranked = policy.rank(candidates, indices, {})
        return best, replace(ranked, reason="no candidate's answer matches a choice; ranked by score instead. "
                             + ranked.reason, no_match=tuple(abstaining))
    order = [choice for choice in choices if choice in totals]
    winner = max(order, key=lambda choice: (totals[choice], -order.index(choice)))
    best = max(voters[winner], key=lambda i: (policy.rank_key(candidates[i]), -i))
    return best, Vote(
        choices=tuple(choices),
        totals=totals,
        voters={choice: tuple(policy.passage_id(candidates[i]) for i in members) for choice, members in voters.items()},
        no_match=tuple(abstaining),
        candidates=tuple(policy.candidate_trace(candidates[i]) for i in indices),
        chosen=policy.passage_id(candidates[best]),
        answer=winner,
        reason=f"{winner!r} has the highest summed score {totals[winner]:.4f}",
    )


def no_retrieval_entry(answer: str, choice: str | None) -> ChoiceMatch:
    """The trace entry of a closed-set answer written without passages: the choice it matches."""
    return ChoiceMatch(answer=choice, chosen=choice,
                       reason=f"the answer {answer!r} " + ("matches a choice" if choice else "matches no choice"))
