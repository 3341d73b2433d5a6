"""The policy: how candidates are ranked, when a verdict makes an answer unsupported, what ships.

    index, entry = rank(candidates, weights)        # the trace's "rank" step (a trace.Rank)
    ok, reason = judge(candidates[index], config)   # False: re-retrieve, then abstain or flag
    segments, notes = shipped_segments(candidates[index], config)

Decisions this module makes (each is tested in ``tests/inference/test_runtime*.py``):

* **Ranking**: a candidate the policy would not ship (``judge`` below: a passage judged ``[Irrelevant]``, no
  support verdict, ``[No support / Contradictory]``, support below ``support_bound``) ranks below every candidate
  it would ship; then a candidate missing a verdict (no relevance, support or utility token to read: a truncated
  or malformed decode) ranks below every candidate that has all three; among equals the combined score
  decides; a tie keeps the earlier candidate (the retriever's order) and the trace says ``tie``.
  Scoring a missing component as 0 would let a truncated candidate outrank an honest ``[Utility:1]``; ranking by
  the score alone let a branch the relevance cut had turned ``[Irrelevant]`` (its raw relevance still high)
  outrank a supported ``[Relevant]`` one, and the question was abstained with a shippable answer in hand.
* **Unsupported** (re-retrieve, then abstain or flag): the model judged the passage ``[Irrelevant]``
  (its support verdict is about evidence it rejected), no support verdict at all, ``[No support /
  Contradictory]`` on any sentence, or a support score below ``support_bound``.
* **Nothing relevant** (``on_all_irrelevant=no_retrieval``): when every passage of every round so far is
  ``[Irrelevant]``, the runtime answers from the prompt + ``[No Retrieval]`` at once, uncited and flagged; the
  default (``unsupported``) treats it like any unsupported best candidate.
* **Shipped text**: the candidate's sentences; ``[Partially supported]`` ones kept, rewritten with
  ``partial_template`` or dropped (``on_partial``). A sentence cites the passage it was generated from:
  the retrieved passage, kept by ``[Continue to Use Evidence]``; a ``[No Retrieval]`` sentence cites
  nothing. A flagged candidate whose passage the model judged irrelevant still cites it (its text came from
  there), each segment carrying that ``[Irrelevant]`` verdict: the answer never hides where its text came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from selfrag import reflection as rf
from selfrag.trajectory import Passage, parse_trajectory

from .answer import AnswerSegment, Candidate, shorten
from .config import InferenceConfig
from .trace import Rank, RankedCandidate


def rank_key(candidate: Candidate, config: InferenceConfig | None = None) -> tuple[bool, bool, float]:
    """Sort key (higher is better): with ``config``, candidates the policy would ship (:func:`judge`) first; then
    complete candidates; then the combined score. Without ``config`` every candidate counts as shippable."""
    shippable = config is None or judge(candidate, config)[0]
    score = candidate.score
    if score is None:
        return (shippable, False, 0.0)
    return (shippable, not score.missing, score.total)


def rank(
    candidates: Sequence[Candidate], indices: Sequence[int], weights: Mapping[str, float],
    config: InferenceConfig | None = None,
) -> tuple[int, Rank]:
    """The best of ``candidates[indices]`` and the trace entry that explains the choice. With ``config`` the policy's
    verdict ranks first (see the module docstring); the closed-set vote ranks by the scores alone."""
    keys = {i: rank_key(candidates[i], config) for i in indices}
    best = indices[0]
    for index in indices[1:]:
        if keys[index] > keys[best]:
            best = index
    tied = [i for i in indices if keys[i] == keys[best]]
    shippable, complete, total = keys[best]
    reason = f"highest combined score {total:.4f} of {len(indices)} candidates"
    if not any(keys[i][1] for i in indices):
        reason += "; every candidate misses a verdict, so none is complete"
    elif not complete:
        reason += "; it misses a verdict, but every complete candidate is one the policy would not ship"
    elif any(not keys[i][1] for i in indices):
        reason += "; candidates missing a verdict rank below complete ones"
    if shippable and config is not None and (refused := [i for i in indices if not keys[i][0]]):
        top = max(refused, key=lambda i: (keys[i][1], keys[i][2], -i))
        if (keys[top][1], keys[top][2]) > (complete, total):
            reason += (f"; {passage_id(candidates[top]) or 'the answer without a passage'} scored higher "
                       f"({keys[top][2]:.4f}), but the policy would not ship it, so it ranks below")
    traced = tuple(
        candidate_trace(candidates[i], None if i == best else _why_not(candidates[i], keys[i], keys[best], config))
        for i in indices
    )
    tie = tuple(passage_id(candidates[i]) for i in tied) if len(tied) > 1 else None
    if tie:
        reason += f"; a tie of {len(tied)} is broken by retrieval order"
    return best, Rank(weights=dict(weights), candidates=traced, chosen=passage_id(candidates[best]), reason=reason,
                      tie=tie)


def _why_not(candidate: Candidate, key: tuple[bool, bool, float], best: tuple[bool, bool, float],
             config: InferenceConfig | None) -> str:
    """The rule by which ``candidate`` (sort key ``key``) lost the ranking to the best one (``best``)."""
    shippable, complete, total = key
    if best[0] and not shippable and config is not None:
        why = judge(candidate, config)[1]
        return f"the policy would not ship it ({why}): ranks below every candidate it would"
    if best[1] and not complete:
        missing = ", ".join(candidate.score.missing) if candidate.score else "every verdict"
        return f"misses a verdict ({missing}): ranks below every complete candidate (its problems say why)"
    return f"combined score {total:.4f} is not above the chosen one's {best[2]:.4f}"


def judge(candidate: Candidate, config: InferenceConfig) -> tuple[bool, str]:
    """Whether ``candidate`` is supported enough to ship as is, and why (see the module docstring)."""
    score = candidate.score
    if candidate.passage is not None and (score is None or score.relevance_token != rf.RELEVANT):
        token = None if score is None else score.relevance_token
        if token == rf.IRRELEVANT:
            return False, f"the model judged its own passage {rf.IRRELEVANT}; its support verdict rests on nothing"
        return False, "the best continuation has no relevance verdict"
    supports = [segment.support for segment in segments_of(candidate) if segment.support]
    if score is None or score.support_token is None or not supports:
        return False, "the best continuation has no support verdict, so nothing says the passage supports it"
    if rf.NO_SUPPORT in supports:
        return False, f"the model judged the best continuation {rf.NO_SUPPORT}"
    bound = config.support_floor
    if bound > 0 and (score.support is None or score.support < bound):
        return False, f"support score {score.support} is below support_bound {bound}"
    return True, f"the model judged the best continuation {score.support_token}"


def all_irrelevant(candidates: Sequence[Candidate]) -> bool:
    """Whether every candidate is a passage the model judged ``[Irrelevant]`` (and there is at least one)."""
    return bool(candidates) and all(
        c.passage is not None and c.score is not None and c.score.relevance_token == rf.IRRELEVANT for c in candidates
    )


def segments_of(candidate: Candidate) -> list[AnswerSegment]:
    """The candidate's sentences, each with the passage it was generated from, its support verdict and the model's
    relevance verdict on that passage."""
    trajectory = candidate.parsed
    if trajectory is None:  # built by hand (tests, other runtimes): only then is the text lexed
        trajectory = parse_trajectory(candidate.trajectory)
    segments: list[AnswerSegment] = []
    current: Passage | None = None
    for segment in trajectory.segments:
        if segment.passage is not None:
            current = candidate.passage
        elif segment.retrieve != rf.CONTINUE_EVIDENCE:
            current = None  # [No Retrieval] (or nothing): written without evidence
        if segment.text.strip():
            relevance = candidate.score.relevance_token if current is not None and candidate.score else None
            segments.append(AnswerSegment(segment.text.strip(), current, segment.support, relevance))
    return segments


def shipped_segments(candidate: Candidate, config: InferenceConfig) -> tuple[list[AnswerSegment], list[str]]:
    """The sentences that ship (after ``on_partial``), each citing the passage it came from, and notes for the
    trace."""
    shipped: list[AnswerSegment] = []
    notes: list[str] = []
    for segment in segments_of(candidate):
        if segment.support == rf.PARTIALLY_SUPPORTED and config.on_partial != "keep":
            notes.append(f"{config.on_partial} {rf.PARTIALLY_SUPPORTED} sentence {segment.text!r}")
            if config.on_partial == "drop":
                continue
            segment = replace(segment, text=config.partial_template.format(text=segment.text))
        shipped.append(segment)
    return shipped, notes


def join_segments(segments: Sequence[AnswerSegment]) -> str:
    return " ".join(segment.text for segment in segments)


def citations(segments: Sequence[AnswerSegment]) -> tuple[Passage, ...]:
    seen: dict[str, Passage] = {}
    for segment in segments:
        if segment.passage is not None:
            seen.setdefault(segment.passage.id, segment.passage)
    return tuple(seen.values())


def rewrite_query(config: InferenceConfig, question: str, generated: str) -> str:
    return " ".join(config.rewrite.format(question=question, generated=generated).split())


def passage_id(candidate: Candidate) -> str | None:
    return None if candidate.passage is None else candidate.passage.id


def candidate_trace(candidate: Candidate, rejected: str | None = None) -> RankedCandidate:
    """The candidate as a ``rank`` or ``vote`` entry lists it (``rejected``: why it lost, where it did)."""
    return RankedCandidate(
        passage_id=passage_id(candidate),
        score=candidate.score,
        well_formed=candidate.well_formed,
        problems=candidate.problems,
        generated=shorten(candidate.generated),
        retried=None if candidate.retried is None else shorten(candidate.retried),
        complete=rank_key(candidate)[1],
        pruned=candidate.pruned,
        truncated=candidate.truncated or None,
        round=candidate.round,
        rejected=rejected,
    )
