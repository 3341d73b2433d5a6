"""Long form (``form=long``): segment-level beam search, retrieving whenever the model asks for evidence.

    rag = SelfRAG(engine, retriever, InferenceConfig(form="long", long_form=LongFormConfig(width=2)))
    for event in rag.stream("Tell me about the Seine."): ...

Every decode stops at the next reflection decision (a retrieve token, ``<paragraph>``, a utility token), so
one decode is one segment: ``[Relevant] text [Fully supported]`` and then the model's next retrieve token,
whose log-probs give the next ``p_retrieve`` for free. At a decision:

* ``[Retrieval]`` (or ``p_retrieve > threshold`` at a ``[No Retrieval]``/``[Continue to Use Evidence]``, or a
  ``<paragraph>`` the model tried to write itself) retrieves with the question plus the text generated so far,
  skipping passages already in context; each new passage is one branch (pruned on its relevance token like the
  short form), appended after the earlier evidence, which stays in context;
* ``[Continue to Use Evidence]`` keeps the current passage: the next sentence cites it and is judged against it;
* ``[No Retrieval]`` writes the next sentence without evidence (it cites nothing);
* a utility token ends the answer; its score is read at that position (the paper's code scored it 0).

A segment's score is ``w_rel s_rel + w_sup s_sup`` (plus ``w_use s_use`` at the end); a beam's score is the sum.
After each step the ``width`` best beams survive. A branch the model judged ``[Irrelevant]``, without a
support verdict or ``[No support / Contradictory]`` is unsupported; when every branch of a step is, the beam
re-retrieves with the rewritten query up to ``max_rounds``, then ``flag`` keeps the best branch
(``low_confidence``) or ``abstain`` ends that beam before the unsupported sentence.

Streaming: a segment is final once every surviving beam contains it (all later beams descend from them);
those are sent at once, one by one, before the answer is complete.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from selfrag import reflection as rf
from selfrag.prompting import encode_prompt, passage_ids
from selfrag.reflection import Group
from selfrag.retrieval import Hit
from selfrag.trajectory import Passage, lex_ids, parse_trajectory

from . import policy
from .answer import Answer, AnswerSegment, Candidate
from .engines.base import Generation, GenerationRequest, concat_generations, context_limit
from .events import CitationEvent, FinalEvent, SegmentEvent, StreamEvent, TraceEvent
from .scoring import (
    CandidateScore,
    RelevanceVerdict,
    relevance_entry,
    relevance_verdict,
    retrieve_probability,
    score_continuation,
)

if TYPE_CHECKING:
    from .runtime import SelfRAG


@dataclass
class _Counter:
    engine_calls: int = 0
    generated_tokens: int = 0


@dataclass
class _Beam:
    """One partial answer: its ids after the prompt, shipped sentences, evidence in context, score."""

    ids: tuple[int, ...] = ()
    segments: list[AnswerSegment] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # passage ids in context
    current: Passage | None = None  # the passage [Continue to Use Evidence] keeps
    score: float = 0.0
    retrievals: int = 0
    written: int = 0  # segments generated (shipped or not)
    steps: int = 0  # decodes along this beam (guards against a model that never writes text)
    done: str | None = None  # why it ended (None: still going)
    reasons: list[str] = field(default_factory=list)

    def child(self, ids: tuple[int, ...]) -> _Beam:
        return _Beam(
            ids,
            list(self.segments),
            list(self.evidence),
            self.current,
            self.score,
            self.retrievals,
            self.written,
            self.steps,
            None,
            list(self.reasons),
        )


class LongForm:
    """Beam search for one question (see the module docstring); :meth:`events` streams, :meth:`run_to_end` returns."""

    def __init__(self, rag: SelfRAG, question: str) -> None:
        self.rag, self.question, self.config = rag, question, rag.config
        self.ids = rag.engine.token_ids
        self.prompt = tuple(encode_prompt(rag.engine.tokenizer, question, rag.engine.prompt_template))
        from .runtime import check_question

        check_question(question, len(self.prompt), rag.config.max_tokens, context_limit(rag.engine))
        self.counter = _Counter()
        self.trace: list[dict[str, Any]] = []
        self.retrieve_ids = self.ids.ids(Group.RETRIEVE)
        self.stop_ids = (*self.retrieve_ids, self.ids.id(rf.PARAGRAPH_OPEN), *self.ids.ids(Group.UTILITY))
        # After [No Retrieval] a segment is text, then its stop (a retrieve decision, <paragraph> or a utility token):
        # no verdict or passage markup, and the stops wait one id. Unlike short-form the retrieve tokens stay allowed
        # (a long-form segment ends at one); without the hold the model may repeat [No Retrieval] and never write.
        self.no_retrieval_id = self.ids.id(rf.NO_RETRIEVAL)
        self.after_no_retrieval_banned = tuple(i for i in self.ids.all_ids if i not in self.stop_ids)
        self.answer: Answer | None = None

    def run_to_end(self) -> Answer:
        for _ in self.events():
            pass
        assert self.answer is not None
        return self.answer

    def events(self) -> Iterator[StreamEvent]:
        start = {"always": (self.ids.id(rf.RETRIEVAL),), "never": (self.ids.id(rf.NO_RETRIEVAL),)}
        beams = [_Beam(ids=start.get(self.config.mode, ()))]
        sent_trace, sent_segments, cited = 0, 0, set()
        while any(beam.done is None for beam in beams):
            beams = self._step(beams)
            final = _common_prefix([beam.segments for beam in beams])
            for entry in self.trace[sent_trace:]:
                yield TraceEvent(dict(entry))
            sent_trace = len(self.trace)
            for segment in final[sent_segments:]:
                if segment.passage is not None and segment.passage.id not in cited:
                    cited.add(segment.passage.id)
                    yield CitationEvent(segment.passage)
                yield SegmentEvent(segment.text if sent_segments == 0 else " " + segment.text, segment.passage)
                sent_segments += 1
        self.answer = self._finish(beams)
        for entry in self.answer.trace[sent_trace:]:
            yield TraceEvent(dict(entry))
        shipped = list(self.answer.segments) or [AnswerSegment(self.answer.answer)]
        for index, segment in enumerate(shipped[sent_segments:], start=sent_segments):
            if segment.passage is not None and segment.passage.id not in cited:
                cited.add(segment.passage.id)
                yield CitationEvent(segment.passage)
            yield SegmentEvent(segment.text if index == 0 else " " + segment.text, segment.passage)
        yield FinalEvent(self.answer)

    # -- one step of the beam search ----------------------------------------------------------------

    def _step(self, beams: list[_Beam]) -> list[_Beam]:
        expanded: list[_Beam] = [beam for beam in beams if beam.done is not None]
        live = [beam for beam in beams if beam.done is None]
        writing = [beam for beam in live if not self._wants_evidence(beam)]
        generations = self._decode([self.prompt + beam.ids for beam in writing])
        for beam, generation in zip(writing, generations, strict=True):
            expanded.append(self._extend(beam.child(beam.ids), generation, None))
        for beam in live:
            if self._wants_evidence(beam):
                expanded += self._retrieve_step(beam)
        expanded.sort(key=lambda beam: -beam.score)
        kept = expanded[: self.config.long_form.width]
        for beam in kept:
            limit = self.config.long_form.max_segments
            if beam.done is None and (beam.written >= limit or beam.steps >= 2 * limit + 1):
                beam.done = "max_segments"
                beam.reasons.append(f"truncated: stopped at long_form.max_segments={limit}")
        self.trace.append(
            {
                "step": "beam",
                "chosen": [_describe(beam) for beam in kept],
                "dropped": [_describe(beam) for beam in expanded[len(kept) :]],
                "reason": f"kept the {len(kept)} best of {len(expanded)} partial answers by summed segment score",
            }
        )
        return kept

    def _wants_evidence(self, beam: _Beam) -> bool:
        return bool(beam.ids) and beam.ids[-1] == self.ids.id(rf.RETRIEVAL)

    def _decode(
        self, prompts: list[tuple[int, ...]], max_tokens: int | None = None, keep_prefix: bool = False
    ) -> list[Generation]:
        requests = [
            GenerationRequest(
                prompt_ids=prompt,
                max_tokens=max_tokens or self.config.long_form.segment_tokens,
                stop_token_ids=self.stop_ids,
                score_token_ids=self.ids.all_ids,
                keep_prefix=keep_prefix,
            )
            for prompt in prompts
        ]
        requests = [
            replace(request, banned_token_ids=self.after_no_retrieval_banned, min_tokens=1)
            if request.prompt_ids and request.prompt_ids[-1] == self.no_retrieval_id
            else request
            for request in requests
        ]
        return self.rag._call(requests, [self.counter] * len(requests))

    def _extend(self, beam: _Beam, generation: Generation, passage: Passage | None) -> _Beam:
        """Append one decoded segment to ``beam``; decide what its final token asks for."""
        generated = list(generation.token_ids)
        stop = generated[-1] if generated and generation.finish_reason == "stop" else None
        body = generated[:-1] if stop is not None or generation.finish_reason == "eos" else generated
        score = score_continuation(generated, generation.score_logprobs, self.ids, self.rag.weights)
        pieces = lex_ids(body, self.ids, lambda run: self.rag.engine.tokenizer.decode(run, skip_special_tokens=False))
        text = "".join(content for content, is_token in pieces if not is_token).strip()
        beam.ids = beam.ids + tuple(body)
        beam.steps += 1
        if passage is not None:
            beam.current = passage
        elif beam.ids and self._last_retrieve(beam) == rf.NO_RETRIEVAL:
            beam.current = None
        weights = self.rag.weights
        gained = weights["support"] * (score.support or 0.0) if beam.current is not None else 0.0
        if passage is not None:
            gained += weights["relevance"] * (score.relevance or 0.0)
        if text:
            beam.written += 1
            segment = AnswerSegment(text, beam.current, score.support_token if beam.current is not None else None)
            self._ship(beam, segment)
        self._after(beam, generation, stop, score.utility)
        beam.score += gained + (
            weights["utility"] * score.utility
            if stop in self.ids.ids(Group.UTILITY) and score.utility is not None
            else 0.0
        )
        return beam

    def _ship(self, beam: _Beam, segment: AnswerSegment) -> None:
        if segment.support == rf.PARTIALLY_SUPPORTED and self.config.on_partial == "drop":
            self.trace.append({"step": "partial", "chosen": "drop", "reason": f"dropped {segment.text!r}"})
            return
        if segment.support == rf.PARTIALLY_SUPPORTED and self.config.on_partial == "rewrite":
            segment = AnswerSegment(
                self.config.partial_template.format(text=segment.text), segment.passage, segment.support
            )
        beam.segments.append(segment)

    def _after(self, beam: _Beam, generation: Generation, stop: int | None, utility: float | None) -> None:
        """Set what the beam does next from the decode's last token."""
        if generation.finish_reason == "eos":
            beam.done = "eos"
            return
        if stop is None:
            beam.done = "length"
            beam.reasons.append("truncated: a segment reached long_form.segment_tokens")
            return
        token = self.ids.token(stop)
        if token in rf.UTILITY_TOKENS:
            beam.ids += (stop,)
            beam.done = f"{token} (utility {utility})"
            return
        logprobs = generation.score_logprobs[-1] if generation.score_logprobs else {}
        p_retrieve = retrieve_probability(logprobs, self.ids)
        threshold = self.config.retrieve_threshold
        wants = token in (rf.RETRIEVAL, rf.PARAGRAPH_OPEN) if p_retrieve is None else p_retrieve > threshold
        if self.config.mode == "never" or beam.retrievals >= self.config.long_form.depth:
            wants = False
        if self.config.mode == "always" and token in (rf.RETRIEVAL, rf.PARAGRAPH_OPEN):
            wants = True
        if wants:
            chosen = rf.RETRIEVAL
        elif token == rf.CONTINUE_EVIDENCE and beam.current is not None:
            chosen = rf.CONTINUE_EVIDENCE
        else:
            chosen = rf.NO_RETRIEVAL
        beam.ids += (self.ids.id(chosen),)
        self.trace.append(
            {
                "step": "decide",
                "segment": beam.written,
                "first_token": token,
                "probabilities": {"p_retrieve": p_retrieve},
                "threshold": self.config.retrieve_threshold,
                "chosen": chosen,
                "reason": f"the model wrote {token}"
                + ("" if p_retrieve is None else f", p_retrieve {p_retrieve:.4f}")
                + ("" if beam.retrievals < self.config.long_form.depth else "; long_form.depth reached"),
            }
        )

    def _last_retrieve(self, beam: _Beam) -> str | None:
        for token_id in reversed(beam.ids):
            token = self.ids.token(token_id)
            if token is not None and rf.group_of(token) is Group.RETRIEVE:
                return token
        return None

    # -- retrieval steps ----------------------------------------------------------------------------

    def _retrieve_step(self, beam: _Beam) -> list[_Beam]:
        """Branch ``beam`` on fresh passages; re-retrieve while every branch is unsupported."""
        base = beam.ids[:-1]  # without the [Retrieval] the branches re-insert with their passage
        prefix_text = " ".join(segment.text for segment in beam.segments)
        query = " ".join(f"{self.question} {prefix_text}".split())
        tried = set(beam.evidence)
        judged = irrelevant = 0  # branches of this step, and those the model judged [Irrelevant]
        for round_ in range(self.config.max_rounds + 1):
            hits = self._search(query, tried)
            self.trace.append(
                {
                    "step": "retrieve",
                    "segment": beam.written,
                    "round": round_,
                    "query": query,
                    "chosen": [hit.passage.id for hit in hits],
                    "reason": "the question plus the text so far; passages in context are skipped",
                }
            )
            if not hits:
                break
            tried.update(hit.passage.id for hit in hits)
            children = self._branches(beam, base, hits)
            scores = [score_continuation(g.token_ids, g.score_logprobs, self.ids, self.rag.weights)
                      for _, g in children]
            verdicts = [self._verdict(score) for score in scores]
            good = [child for (child, _), (ok, _) in zip(children, verdicts, strict=True) if ok]
            if good:
                return good
            judged += len(children)
            irrelevant += sum(score.relevance_token == rf.IRRELEVANT for score in scores)
            if self.config.on_all_irrelevant == "no_retrieval" and judged and irrelevant == judged:
                return [self._without_evidence(beam, base, round_, judged)]
            best_child, best_generation = max(children, key=lambda pair: pair[0].score)
            reason = verdicts[children.index((best_child, best_generation))][1]
            query = policy.rewrite_query(self.config, self.question, prefix_text + " " + _last_text(best_child))
            last = round_ == self.config.max_rounds
            self.trace.append(
                {
                    "step": "support",
                    "segment": beam.written,
                    "round": round_,
                    "chosen": self.config.on_unsupported if last else "re-retrieve",
                    "reason": reason,
                    **({} if last else {"query": query}),
                }
            )
            if last:
                return [self._give_up(beam, best_child, reason)]
        return [self._give_up(beam, None, "no new passage to retrieve")]

    def _search(self, query: str, tried: set[str]) -> list[Hit]:
        assert self.rag.retriever is not None
        k = self.config.top_k
        hits = self.rag.retriever.search_many([query], k + len(tried))[0]
        return [hit for hit in hits if hit.passage.id not in tried][:k]

    def _branches(self, beam: _Beam, base: tuple[int, ...], hits: list[Hit]) -> list[tuple[_Beam, Generation]]:
        tokenizer = self.rag.engine.tokenizer
        contexts = [base + tuple(passage_ids(tokenizer, self.ids, hit.passage)) for hit in hits]
        first = self._decode([self.prompt + ids for ids in contexts], max_tokens=1, keep_prefix=True)
        verdicts = self._relevance(beam, hits, first)
        first = [verdict.generation for verdict in verdicts]
        keep = self._prune(beam, hits, [verdict.score for verdict in verdicts])
        rest = [i for i in keep if first[i].finish_reason == "length"]
        more = self._decode([self.prompt + contexts[i] + first[i].token_ids for i in rest])
        generations = {i: first[i] for i in keep}
        for i, generation in zip(rest, more, strict=True):
            generations[i] = concat_generations(first[i], generation)
        children = []
        for i, generation in sorted(generations.items()):
            child = beam.child(contexts[i])
            child.evidence.append(hits[i].passage.id)
            child.retrievals += 1
            children.append((self._extend(child, generation, hits[i].passage), generation))
        return children

    def _relevance(self, beam: _Beam, hits: list[Hit], first: list[Generation]) -> list[RelevanceVerdict]:
        """Each branch's relevance verdict read at ``relevance_threshold`` (as the short form does)."""
        threshold = self.config.relevance_cut
        verdicts = [relevance_verdict(g, self.ids, threshold) for g in first]  # one-token decodes
        entry = relevance_entry([hit.passage.id for hit in hits], verdicts, threshold)
        self.trace.append(entry | {"segment": beam.written})
        return verdicts

    def _prune(self, beam: _Beam, hits: list[Hit], relevance: list[float | None]) -> list[int]:
        pruning = self.config.pruning
        known = [value for value in relevance if value is not None]
        if not pruning.enabled or not known:
            return list(range(len(hits)))
        best = max(known)
        keep = [
            i
            for i, v in enumerate(relevance)
            if v is None or (v >= pruning.relevance_bound and best - v <= pruning.margin)
        ]
        self.trace.append(
            {
                "step": "prune",
                "segment": beam.written,
                "relevance": {hit.passage.id: value for hit, value in zip(hits, relevance, strict=True)},
                "chosen": [hits[i].passage.id for i in range(len(hits)) if i not in keep],
                "reason": f"{len(hits) - len(keep)} of {len(hits)} branches stopped after their relevance token",
            }
        )
        return keep

    def _verdict(self, score: CandidateScore) -> tuple[bool, str]:
        if score.relevance_token == rf.IRRELEVANT:
            return False, f"the model judged the passage {rf.IRRELEVANT}"
        if score.support_token is None:
            return False, "the segment has no support verdict"
        if score.support_token == rf.NO_SUPPORT:
            return False, f"the model judged the segment {rf.NO_SUPPORT}"
        bound = self.config.support_floor
        if bound > 0 and (score.support is None or score.support < bound):
            return False, f"support score {score.support} is below support_bound {bound}"
        return True, f"the model judged the segment {score.support_token}"

    def _without_evidence(self, beam: _Beam, base: tuple[int, ...], round_: int, judged: int) -> _Beam:
        """on_all_irrelevant=no_retrieval: every passage of this retrieval step was judged [Irrelevant], so the
        segment is written from the text so far + [No Retrieval] (uncited, flagged), as the short form answers."""
        reason = f"the model judged all {judged} retrieved passages {rf.IRRELEVANT}"
        self.trace.append(
            {
                "step": "support",
                "segment": beam.written,
                "round": round_,
                "chosen": "answer_without_retrieval",
                "reason": reason,
                "why": f"on_all_irrelevant=no_retrieval: the segment comes from the text so far + {rf.NO_RETRIEVAL}",
            }
        )
        child = beam.child(base + (self.ids.id(rf.NO_RETRIEVAL),))
        child.retrievals += 1  # the retrieval happened (and counts against long_form.depth); nothing of it is used
        child.reasons.append(f"flagged: {reason}; segment {beam.written + 1} was written without sources")
        (generation,) = self._decode([self.prompt + child.ids])
        return self._extend(child, generation, None)

    def _give_up(self, beam: _Beam, best: _Beam | None, reason: str) -> _Beam:
        if best is not None and self.config.on_unsupported == "flag":
            best.reasons.append(f"flagged: {reason}")
            return best
        ended = beam.child(beam.ids)
        ended.done = "abstained before an unsupported segment"
        ended.reasons.append(f"abstained: {reason}; the answer stops before that segment")
        return ended

    # -- the answer ---------------------------------------------------------------------------------

    def _finish(self, beams: list[_Beam]) -> Answer:
        best = max(range(len(beams)), key=lambda i: (beams[i].score, -i))
        beam = beams[best]
        candidates = tuple(self._candidate(b) for b in beams)
        self.trace.append({"step": "finish", "chosen": _describe(beam), "reason": f"highest beam score; {beam.done}"})
        abstained = not beam.segments
        text = self.config.abstain_text if abstained else policy.join_segments(beam.segments)
        reasons = list(beam.reasons) + (["abstained: no sentence is left"] if abstained and not beam.reasons else [])
        return Answer(
            question=self.question,
            answer=text,
            citations=policy.citations(beam.segments),
            retrieved=beam.retrievals > 0,
            abstained=abstained,
            low_confidence=bool(reasons) and not abstained,
            trace=tuple(self.trace),
            trajectory=candidates[best].trajectory,
            candidates=candidates,
            chosen=best,
            engine_calls=self.counter.engine_calls,
            generated_tokens=self.counter.generated_tokens,
            segments=tuple(beam.segments),
            reasons=tuple(reasons),
        )

    def _candidate(self, beam: _Beam) -> Candidate:
        tokenizer = self.rag.engine.tokenizer
        pieces = lex_ids(beam.ids, self.ids, lambda run: tokenizer.decode(run, skip_special_tokens=False))
        trajectory = parse_trajectory(pieces)
        return Candidate(
            passage=None,
            trajectory="".join(content for content, _ in pieces),
            answer=policy.join_segments(beam.segments),
            well_formed=trajectory.well_formed,
            problems=trajectory.problems,
            score=None,
            finish_reason=beam.done or "",
            parsed=trajectory,
        )


def _common_prefix(lists: list[list[AnswerSegment]]) -> list[AnswerSegment]:
    prefix: list[AnswerSegment] = []
    for items in zip(*lists, strict=False):
        if any(item is not items[0] for item in items):
            break
        prefix.append(items[0])
    return prefix


def _last_text(beam: _Beam) -> str:
    return beam.segments[-1].text if beam.segments else ""


def _describe(beam: _Beam) -> dict[str, Any]:
    return {"score": beam.score, "segments": len(beam.segments), "evidence": list(beam.evidence), "done": beam.done}

