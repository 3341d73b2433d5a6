"""The retrieval rounds every mode shares: retrieve, score the passages, judge the round, re-retrieve or give up.

    class MyMode(Rounds[Work]):
        def decide(self, works): ...         # sets work.retrieve
        def branch(self, works): ...         # this round's passages (work.hits) -> work.candidates
        def answer_alone(self, works): ...   # sets work.alone: the answer written without passages
        def alone_candidate(self, work): ... # work.alone as a Candidate

The single-pass runtime (:class:`~selfrag.inference.runtime.SelfRAG`, reflection tokens) and the prompted critic
(:class:`~selfrag.inference.prompted.PromptedSelfRAG`, one critic call per decision) differ only in those four
steps; the loop and its trace entries are this module's, the answer it ships is :mod:`.finish`'s. A round:

1. **retrieve** the query's top-k passages not tried yet. None at the first round: answer without passages; none at
   a later round: give up;
2. **branch**: each passage becomes a candidate (the mode's own way of scoring it);
3. **judge** (:func:`next_step`, the one rule long form follows too): every passage so far judged ``[Irrelevant]``
   and ``on_all_irrelevant=no_retrieval`` -> answer without passages, flagged; the best candidate supported ->
   accept; rounds left -> re-retrieve with the rewritten query; else give up: ``abstain``, or ``flag`` the best
   candidate of every round that wrote text (none did: abstain).

Every phase is one batch for all questions of a call; :meth:`Rounds.phases` yields after each so a stream can send
the new trace entries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Generic, Literal, TypeVar

from selfrag import reflection as rf
from selfrag.retrieval import Hit, Retriever

from . import closedset, policy
from .answer import Answer, Candidate
from .config import InferenceConfig, PruningConfig
from .engines.base import Engine
from .events import StreamEvent, TraceEvent, final_events
from .finish import cut_before_support, length_reason, with_passages, without_passages
from .trace import Outcome, Retrieve, Skip, SkipRule, Support, SupportAction
from .work import Work

Step = Literal["answer_without_retrieval", "accept", "re-retrieve", "give_up"]


def next_step(config: InferenceConfig, round_: int, *, all_irrelevant: bool, supported: bool) -> Step:
    """What follows a judged round (in this order): every passage so far judged irrelevant (with
    ``on_all_irrelevant=no_retrieval``), a supported best candidate, rounds left, else give up."""
    if all_irrelevant and config.on_all_irrelevant == "no_retrieval":
        return "answer_without_retrieval"
    if supported:
        return "accept"
    return "re-retrieve" if round_ < config.max_rounds else "give_up"


def new_passages(retriever: Retriever, queries: Sequence[str], seen: Sequence[set[str]], k: int) -> list[list[Hit]]:
    """Each query's top ``k`` passages not in its ``seen`` set (one batched search; ``seen`` is not updated)."""
    results = retriever.search_many(list(queries), k + max((len(ids) for ids in seen), default=0))
    return [[hit for hit in hits if hit.passage.id not in ids][:k] for hits, ids in zip(results, seen, strict=True)]


def normalise(text: str) -> str:
    """A query or passage as :class:`~selfrag.inference.config.SkipConfig` compares them: case and spacing ignored."""
    return " ".join(text.casefold().split())


def stopped_branches(relevance: Sequence[float | None], pruning: PruningConfig) -> list[bool]:
    """Which branches stop after their relevance token: below ``relevance_bound`` or more than ``margin`` behind the
    best branch (a branch whose score cannot be read is never stopped)."""
    known = [value for value in relevance if value is not None]
    best = max(known, default=0.0)
    return [value is not None and (value < pruning.relevance_bound or best - value > pruning.margin)
            for value in relevance]


def hopeless_round(relevance: Sequence[float | None], config: InferenceConfig) -> str | None:
    """Why a round is not decoded past its branches' relevance position (skip.relevance_gap), or None: its best
    relevance is more than the gap below the cut, so every branch goes on from ``[Irrelevant]``, which the policy
    never accepts (with on_unsupported=abstain nothing of it could ship)."""
    gap, cut = config.skip.relevance_gap, config.relevance_cut
    known = [value for value in relevance if value is not None]
    if gap is None or config.on_unsupported != "abstain" or not known or len(known) < len(relevance):
        return None
    best = max(known)
    if best >= cut - gap:
        return None
    return (f"the best relevance {best:.4f} is more than {gap} below relevance_threshold {cut:.4f}: every branch "
            f"would go on from {rf.IRRELEVANT}, which is never accepted; not decoded further")


W = TypeVar("W", bound=Work)


class Rounds(ABC, Generic[W]):
    """The short-form loop both runtimes run (see the module docstring); subclasses supply the four steps."""

    engine: Engine
    retriever: Retriever | None
    config: InferenceConfig
    #: where the answer written without passages comes from, as the trace says it ("the prompt + [No Retrieval]")
    alone_from = "the prompt alone"
    #: how the trace names what the mode writes (a decode's "continuation", a critic model's "reply")
    written = "continuation"
    #: why an answer written without passages is empty, where its candidate lists no problem (None: not said)
    empty_because: str | None = "no text between its reflection tokens"
    #: whether the mode adds ``weights.retrieval`` x the retriever's rank score to a candidate's (single-pass does)
    ranks_by_retrieval = False

    @property
    def weights(self) -> dict[str, float]:
        weights = {name: getattr(self.config.weights, name) for name in ("relevance", "support", "utility")}
        if self.ranks_by_retrieval and self.config.weights.retrieval:  # the retriever's rank counts too
            weights["retrieval"] = self.config.weights.retrieval
        return weights

    # -- the mode's steps ---------------------------------------------------------------------------

    @abstractmethod
    def decide(self, works: list[W]) -> None:
        """Set ``work.retrieve`` for every work (may also set ``work.alone``, a decode reused as the answer)."""
        ...

    @abstractmethod
    def branch(self, works: list[W]) -> None:
        """Turn every work's ``hits`` into candidates of round ``work.round`` (appended to ``work.candidates``)."""
        ...

    @abstractmethod
    def answer_alone(self, works: list[W]) -> None:
        """Set ``work.alone``: the answer written without passages (one call for all ``works``)."""
        ...

    @abstractmethod
    def alone_candidate(self, work: W) -> Candidate:
        """``work.alone`` as a candidate without a passage."""
        ...

    def tally(self, work: W) -> Mapping[str, int]:
        """Counts a mode adds to the trace's closing entry (the prompted critic: its critic calls)."""
        return {}

    # -- the loop -----------------------------------------------------------------------------------

    def phases(self, works: list[W]) -> Iterator[None]:
        """Run the batched phases; yields after each so a stream can send the new trace entries."""
        self.decide(works)
        yield
        active = self.retrieve([work for work in works if work.retrieve])
        self.answer_alone([work for work in works if not work.retrieve and work.alone is None])
        yield
        while active:
            self.branch(active)
            again = [work for work in active if self.judge_round(work)]
            self.answer_alone([work for work in active if work.outcome and work.outcome.kind == "no_retrieval"])
            yield
            active = self.retrieve(again)

    def stream_works(self, works: list[W]) -> Iterator[tuple[int, StreamEvent]]:
        """``(work index, event)``: each work's trace entries as its phases end, then its answer's events once its
        own last verdict is in (not when the slowest work of the batch is done)."""
        pending = dict.fromkeys(range(len(works)), 0)  # work index -> its trace entries sent (until answered)
        for _ in self.phases(works):
            for index in list(pending):
                yield from self._progress(index, works[index], pending, _settled(works[index]))
        for index in list(pending):
            yield from self._progress(index, works[index], pending, True)

    def _progress(self, index: int, work: W, pending: dict[int, int], final: bool) -> Iterator[tuple[int, StreamEvent]]:
        """The work's trace entries not sent yet; when ``final``, those and its answer's events (then it is done)."""
        sent = pending[index]
        if not final:
            for entry in work.trace[sent:]:
                yield index, TraceEvent(entry)
            pending[index] = len(work.trace)
            return
        del pending[index]
        answer = self.finish(work)
        for event in final_events(answer, answer.trace[sent:], closed_set=bool(work.choices)):
            yield index, event

    def retrieve(self, works: Sequence[W]) -> list[W]:
        """Search for each work's query; keep passages not tried yet. Returns the works with new passages."""
        if not works or self.retriever is None:
            return []
        k = self.config.top_k
        found = []
        works = [work for work in works if not self._repeated_query(work)]
        results = new_passages(self.retriever, [work.query for work in works], [work.seen for work in works], k)
        for work, hits in zip(works, results, strict=True):
            work.queries.append(normalise(work.query))
            work.seen.update(hit.passage.id for hit in hits)
            work.hits, repeated = self._unread(work, hits)
            if work.hits or repeated:
                reason = (f"top {k} passages for the question" if work.round == 0
                          else f"top {k} passages not tried yet for the rewritten query")
                if repeated:
                    reason += f"; {len(repeated)} repeat the text of a passage already read, not decoded again"
            elif work.round == 0:
                reason = f"the retriever found nothing; answering from {self.alone_from}"
            else:
                reason = "the rewritten query found no passage not tried yet"
            work.trace.append(Retrieve(
                round=work.round, query=work.query, chosen=tuple(hit.passage.id for hit in work.hits),
                scores=tuple(hit.score for hit in work.hits), reason=reason, repeated=tuple(repeated) or None,
            ))
            if work.hits:
                found.append(work)
            elif repeated:
                self._skip(work, "repeated_passages", f"every passage found ({', '.join(repeated)}) repeats the text "
                           "of one already read; the round would decode nothing new")
            elif work.round == 0:
                work.retrieve = False
            else:
                self.give_up(work, "re-retrieval found no new passage")
        return found

    def _unpaid(self) -> str | None:
        """skip.unpaid_rounds: why no re-retrieval round runs for this model (its calibration measured that none paid),
        or None."""
        if not self.config.skip.unpaid_rounds or not self.config.use_calibration:
            return None  # use_calibration=false: what calibrate itself runs to measure the rounds
        calibration = getattr(self.engine, "calibration", None) or {}
        measured = calibration.get("measured") or {}
        went, answered = measured.get("re_retrieved"), measured.get("rescued_by_re_retrieval")
        if not isinstance(went, int) or went < 1 or answered != 0:
            return None
        return (f"the model's calibration measured that re-retrieval answered none of the {went} dev questions that "
                "went on to another round (skip.unpaid_rounds=false re-retrieves anyway)")

    def _repeated_query(self, work: W) -> bool:
        """skip.repeated: a re-retrieval round whose query repeats an earlier round's is not run (traced)."""
        if not self.config.skip.repeated or normalise(work.query) not in work.queries:
            return False
        earlier = work.queries.index(normalise(work.query))
        self._skip(work, "repeated_query", f"the rewritten query {work.query!r} repeats round {earlier}'s query; "
                   "it would only reach lower-ranked passages of the same search")
        return True

    def _unread(self, work: W, hits: Sequence[Hit]) -> tuple[list[Hit], list[str]]:
        """``hits`` without those whose title and text repeat a passage already read for ``work`` (skip.repeated),
        and the ids left out; records what is read."""
        kept, repeated = [], []
        for hit in hits:
            key = (normalise(hit.passage.title), normalise(hit.passage.text))
            if self.config.skip.repeated and key in work.read:
                repeated.append(hit.passage.id)
            else:
                kept.append(hit)
                work.read.add(key)
        return kept, repeated

    def _skip(self, work: W, rule: SkipRule, reason: str, round_: int | None = None) -> None:
        """Round ``round_`` (default: the work's current one) not run: traced (a :class:`~.trace.Skip`), then the
        question gives up as when nothing new is found."""
        round_ = work.round if round_ is None else round_
        work.trace.append(Skip(round=round_, rule=rule, chosen="give_up", reason=reason))
        self.give_up(work, f"round {round_} was not run: {reason}")

    def judge_round(self, work: W) -> bool:
        """Rank this round's candidates and act on the verdict; returns True when the work should re-retrieve."""
        indices = [i for i, c in enumerate(work.candidates) if c.round == work.round]
        if work.choices is not None:
            best, entry = closedset.vote(work.candidates, indices, work.choices)
        else:
            best, entry = policy.rank(work.candidates, indices, self.weights, self.config)
        work.trace.append(replace(entry, round=work.round))
        chosen = work.candidates[best]
        supported, reason = policy.judge(chosen, self.config)
        step = next_step(self.config, work.round, all_irrelevant=policy.all_irrelevant(work.candidates),
                         supported=supported)
        if step == "answer_without_retrieval":
            reason = f"the model judged all {len(work.candidates)} retrieved passages {rf.IRRELEVANT}"
            work.outcome = Outcome("no_retrieval", best, reason)
            work.trace.append(self.support_entry(
                chosen, step, reason, work.round,
                why=f"on_all_irrelevant=no_retrieval: the answer comes from {self.alone_from}",
            ))
        elif step == "accept":
            work.outcome = Outcome("accept", best, reason)
            work.trace.append(self.support_entry(chosen, "accept", reason, work.round))
        elif step == "re-retrieve" and (unpaid := self._unpaid()) is not None:
            self._skip(work, "unpaid_rounds", unpaid, work.round + 1)
        elif step == "re-retrieve":
            work.round += 1
            work.query = policy.rewrite_query(self.config, work.question, chosen.answer)
            work.trace.append(self.support_entry(chosen, "re-retrieve", reason, work.round - 1, query=work.query))
            return True
        else:
            work.trace.append(self.support_entry(chosen, "rounds exhausted", reason, work.round))
            self.give_up(work, reason)
        return False

    def give_up(self, work: W, why: str) -> None:
        """After the last round: abstain, or flag the best candidate of every round (traced as the one used)."""
        everyone = list(range(len(work.candidates)))
        action = self.config.on_unsupported
        if action == "flag":
            # a flag ships text: the best candidate that has some (a pruned or empty branch has none), else abstain
            shippable = [i for i in everyone if policy.shipped_segments(work.candidates[i], self.config)[0]]
            if shippable:
                everyone = shippable
            else:
                action = "abstain"
                why += "; on_unsupported=flag, but no candidate wrote answer text to ship, so it abstains"
                if policy.all_irrelevant(work.candidates):
                    why += " (on_all_irrelevant=no_retrieval answers without the passages instead)"
        best = max(everyone, key=lambda i: (policy.rank_key(work.candidates[i], self.config), -i))
        _, reason = policy.judge(work.candidates[best], self.config)
        if cut_before_support(work.candidates[best]):
            # max_tokens ended the decode before the model could give its verdict: a cut answer, flagged (what ships
            # says so here, where the trace records the decision, not in a later step that contradicts it)
            action = "flag"
            cut = length_reason(self.config, "before its support verdict")
            why += f"; {cut}: a cut answer is flagged, not abstained"
        work.trace.append(self.support_entry(work.candidates[best], action, reason, work.candidates[best].round,
                                             why=f"best of all {work.round + 1} rounds; {why}"))
        work.outcome = Outcome(action, best, reason if why == reason else f"{reason}; {why}")

    def support_entry(
        self, chosen: Candidate, action: SupportAction, reason: str, round_: int,
        why: str | None = None, query: str | None = None,
    ) -> Support:
        score = chosen.score
        return Support(
            round=round_,
            passage_id=policy.passage_id(chosen),
            verdict=score.support_token if score else None,
            relevance_verdict=score.relevance_token if score else None,
            support=score.support if score else None,
            support_bound=self.config.support_floor,
            chosen=action,
            reason=reason,
            why=why,
            query=query,
        )

    def finish(self, work: W) -> Answer:
        """The work's answer (see :mod:`.finish`)."""
        if not work.retrieve or (work.outcome is not None and work.outcome.kind == "no_retrieval"):
            candidate = self.alone_candidate(work)
            return without_passages(work, candidate, self.config, self.tally(work), self.written, self.empty_because)
        return with_passages(work, self.config, self.tally(work))


def _settled(work: Work) -> bool:
    """No later phase touches the work: it answers without passages, or its last round has been judged."""
    return (not work.retrieve and work.alone is not None) or work.outcome is not None
