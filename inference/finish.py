"""What a short-form question ships once its rounds are over (both runtimes; see :mod:`.rounds`).

* **with passages** (the work's outcome): ``accept`` ships the best candidate's sentences, ``flag`` ships them with
  ``low_confidence`` and the reasons, ``abstain`` ships ``abstain_text``. A flagged candidate whose passage the model
  judged ``[Irrelevant]`` still cites that passage (its segments carry the verdict, its reasons say so);
  ``on_partial`` may rewrite or drop sentences, and an answer with no sentence left abstains.
* **without passages** (no retrieval, nothing found, or ``on_all_irrelevant=no_retrieval``): the answer written
  without evidence, uncited; flagged where passages were retrieved and all judged irrelevant; an answer with no text
  is never shipped as a confident one: it abstains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from selfrag import reflection as rf

from . import closedset, policy
from .answer import Answer, AnswerSegment, Candidate, shorten
from .config import InferenceConfig
from .trace import Abstain, Finish, Generate, Length, Malformed, Partial
from .work import Work


def with_passages(work: Work, config: InferenceConfig, tally: Mapping[str, int]) -> Answer:
    """The answer of a work that ended its rounds with an outcome (accept, flag or abstain)."""
    assert work.outcome is not None, "every retrieving question ends with an outcome"
    action, best, why = work.outcome.kind, work.outcome.best, work.outcome.reason
    chosen = work.candidates[best]
    if action != "accept" and cut_before_support(chosen):
        # max_tokens ended the decode before its verdict: the support step already chose to flag it (Rounds.give_up)
        assert action == "flag", "a cut answer is flagged where its support step is traced"
        work.trace.append(Length(reason=length_reason(config, "before its support verdict")))
    reasons = [] if action == "accept" else [f"{'abstained' if action == 'abstain' else 'flagged'}: {why}"]
    segments: list[AnswerSegment] = []
    if action != "abstain":
        segments, notes = policy.shipped_segments(chosen, config)
        if chosen.truncated:
            reasons.append(f"truncated: {chosen.truncated}")
        if notes:
            work.trace.append(Partial(chosen=config.on_partial, reason="; ".join(notes)))
        if not segments:
            left = "after on_partial=drop" if notes else "in the chosen continuation"
            reasons.append(f"abstained: no sentence is left {left}")
            work.trace.append(Abstain(reason=f"no sentence is left {left}"))
    if tally:
        counts = ", ".join(f"{value} {name.replace('_', ' ')}" for name, value in tally.items())
        work.trace.append(Finish(chosen=action, counts=dict(tally), reason=counts))
    if not segments:
        return answer_of(work, config.abstain_text, best, [], reasons, abstained=True)
    return answer_of(work, join_or_choice(work, segments), best, segments, reasons, low_confidence=bool(reasons))


def without_passages(
    work: Work,
    candidate: Candidate,
    config: InferenceConfig,
    tally: Mapping[str, int],
    written: str = "continuation",
    empty_because: str | None = "no text between its reflection tokens",
) -> Answer:
    """The answer written without passages (``candidate``, appended to the work's candidates).

    ``written`` is how the trace names what the mode wrote (a decode's continuation, a critic model's reply);
    ``empty_because`` why an empty one is empty where its candidate lists no problem (None: not said).
    """
    work.candidates.append(candidate)  # after the irrelevant passages' candidates, where there were any
    chosen = len(work.candidates) - 1
    step = Generate(
        reason="no passage was used; there is no relevance or support verdict to apply",
        well_formed=candidate.well_formed,
        problems=candidate.problems,
        generated=shorten(candidate.generated),
        counts=dict(tally),
        truncated=candidate.truncated or None,
    )
    reasons = []
    if work.outcome is not None:  # on_all_irrelevant=no_retrieval: retrieved, every passage judged irrelevant
        reasons.append(f"flagged: {work.outcome.reason}; answered without sources")
    if candidate.truncated:
        reasons.append(f"truncated: {candidate.truncated}")
    if not candidate.answer.strip():
        # e.g. a model that wanted to retrieve, held to [No Retrieval] by the threshold, repeating [No Retrieval]:
        # an empty answer is never shipped as a confident one
        work.trace.append(replace(step, abstain=f"the {written} has no answer text"))
        why = "; ".join(candidate.problems) or empty_because
        reasons.append("abstained: the model wrote no answer without retrieval" + (f" ({why})" if why else ""))
        return answer_of(work, config.abstain_text, chosen, [], reasons, abstained=True)
    work.trace.append(step)
    flag = _unfinished(candidate, config)
    if flag is not None:
        work.trace.append(flag)
        reasons.append(f"flagged: {flag.reason}")
    segments = [AnswerSegment(candidate.answer, None, None)]
    if work.choices is not None:
        choice = closedset.match(candidate.answer, work.choices)
        work.trace.append(closedset.no_retrieval_entry(candidate.answer, choice))
        if choice is None:
            reasons.append("closed set: the answer matches none of the choices")
    text = join_or_choice(work, segments)
    return answer_of(work, text, chosen, segments, reasons, low_confidence=bool(reasons))


def _unfinished(candidate: Candidate, config: InferenceConfig) -> Length | Malformed | None:
    """The trace step flagging an answer without passages that max_tokens cut or whose reflection tokens are out of
    place (nothing then vouches for its text), or None."""
    if candidate.finish_reason == "length":
        return Length(reason=length_reason(config))
    malformed = [problem for problem in candidate.problems if problem != candidate.truncated]
    if malformed:
        return Malformed(reason=f"the answer is malformed ({'; '.join(dict.fromkeys(malformed))})")
    return None


def cut_before_support(candidate: Candidate) -> bool:
    """Whether ``max_tokens`` cut the candidate's answer text before its support verdict (a passage candidate)."""
    score = candidate.score
    return (candidate.finish_reason == "length" and candidate.passage is not None and bool(candidate.answer.strip())
            and score is not None and score.relevance_token == rf.RELEVANT and score.support_token is None)


def length_reason(config: InferenceConfig, where: str = "") -> str:
    """Why a cut answer is flagged: ``where`` says what the cut left out."""
    return f"the answer was cut at max_tokens={config.max_tokens}{' ' + where if where else ''} (raise max_tokens)"


def answer_of(
    work: Work,
    text: str,
    chosen: int,
    segments: Sequence[AnswerSegment],
    reasons: list[str],
    low_confidence: bool = False,
    abstained: bool = False,
) -> Answer:
    return Answer(
        question=work.question,
        answer=text,
        citations=policy.citations(segments),
        retrieved=work.retrieve,
        abstained=abstained,
        low_confidence=low_confidence and not abstained,
        trace=tuple(work.trace),
        trajectory=work.candidates[chosen].trajectory,
        candidates=tuple(work.candidates),
        chosen=chosen,
        engine_calls=work.engine_calls,
        generated_tokens=work.generated_tokens,
        segments=tuple(segments),
        reasons=tuple(reasons),
    )


def join_or_choice(work: Work, segments: Sequence[AnswerSegment]) -> str:
    """The answer text: the sentences, or for a closed-set question the choice they match."""
    text = policy.join_segments(segments)
    if work.choices is None:
        return text
    return closedset.match(text, work.choices) or text
