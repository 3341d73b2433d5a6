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
support verdict or ``[No support / Contradictory]`` is unsupported; when every branch of a step is (or pruning
stopped them all), the beam re-retrieves with the rewritten query up to ``max_rounds``, then ``flag`` keeps the best
branch (``low_confidence``) or ``abstain`` ends that beam before the unsupported sentence. A step's rounds follow the
short form's rule (:func:`selfrag.inference.rounds.next_step`), ``on_all_irrelevant`` included.

Streaming: a segment is final once every surviving beam contains it (all later beams descend from them);
those are sent at once, one by one, before the answer is complete.
"""

from __future__ import annotations

from collections.abc import Iterator

from selfrag import reflection as rf
from selfrag.prompting import encode_prompt, passage_ids
from selfrag.reflection import Group
from selfrag.retrieval import Hit, Retriever
from selfrag.trajectory import Passage

from . import policy
from .answer import Answer, AnswerSegment
from .beams import Beam, Counter, beam_candidate, common_prefix, describe, last_text, segment_verdict
from .config import InferenceConfig
from .engines.base import Engine, Generation, concat_generations, context_limit
from .events import CitationEvent, FinalEvent, SegmentEvent, StreamEvent, TraceEvent
from .rounds import new_passages, next_step, stopped_branches
from .scoring import (
    RelevanceVerdict,
    relevance_entry,
    relevance_verdict,
    score_continuation,
)
from .segments import SegmentGrammar, SegmentRead, ThresholdDecider, decide, segment_loop
from .trace import BeamStep, Decide, Finish, Partial, Prune, Retrieve, SegmentSupport, TraceEntry
from .work import call, check_question


class LongForm:
    """Beam search for one question (see the module docstring); :meth:`events` streams, :meth:`run_to_end` returns."""

    def __init__(self, engine: Engine, retriever: Retriever | None, config: InferenceConfig, question: str) -> None:
        self.engine, self.retriever, self.question, self.config = engine, retriever, question, config
        self.weights = {name: getattr(config.weights, name) for name in ("relevance", "support", "utility")}
        self.ids = engine.token_ids
        self.prompt = tuple(encode_prompt(engine.tokenizer, question, engine.prompt_template))
        check_question(question, len(self.prompt), config.max_tokens, context_limit(engine))
        self.counter = Counter()
        self.trace: list[TraceEntry] = []
        # one segment's request, reading and decision: the same as selfrag rl's rollouts (inference/segments.py)
        self.grammar = SegmentGrammar(self.ids, config.long_form.segment_tokens)
        self.decider = ThresholdDecider(self.ids, config.retrieve_threshold)
        self.answer: Answer | None = None

    def run_to_end(self) -> Answer:
        for _ in self.events():
            pass
        assert self.answer is not None
        return self.answer

    def events(self) -> Iterator[StreamEvent]:
        beams = [Beam(ids=self.grammar.start(self.config.mode))]
        sent_trace, sent_segments, cited = 0, 0, set()
        for kept in segment_loop(self, beams):
            beams = kept  # the last step's beams are the answer's
            final = common_prefix([beam.segments for beam in beams])
            for entry in self.trace[sent_trace:]:
                yield TraceEvent(entry)
            sent_trace = len(self.trace)
            for segment in final[sent_segments:]:
                if segment.passage is not None and segment.passage.id not in cited:
                    cited.add(segment.passage.id)
                    yield CitationEvent(segment.passage)
                yield SegmentEvent(segment.text if sent_segments == 0 else " " + segment.text, segment.passage)
                sent_segments += 1
        self.answer = self._finish(beams)
        for entry in self.answer.trace[sent_trace:]:
            yield TraceEvent(entry)
        shipped = list(self.answer.segments) or [AnswerSegment(self.answer.answer)]
        for index, segment in enumerate(shipped[sent_segments:], start=sent_segments):
            if segment.passage is not None and segment.passage.id not in cited:
                cited.add(segment.passage.id)
                yield CitationEvent(segment.passage)
            yield SegmentEvent(segment.text if index == 0 else " " + segment.text, segment.passage)
        yield FinalEvent(self.answer)

    # -- one step of the beam search: the segment loop's caller (inference/segments.py) ----------------

    def decode(self, beams: list[Beam]) -> list[Generation]:
        """The next segment of each writing beam, in one engine call."""
        return self._decode([self.prompt + beam.ids for beam in beams])

    def written(self, beam: Beam, generation: Generation) -> Beam:
        """A child of ``beam`` extended by the segment it wrote."""
        return self._extend(beam.child(beam.ids), generation, None)

    def evidence(self, beams: list[Beam]) -> list[Beam]:
        """Each beam that asked for evidence branched on fresh passages, round by round (:meth:`_retrieve_step`)."""
        return [child for beam in beams for child in self._retrieve_step(beam)]

    def keep(self, expanded: list[Beam]) -> list[Beam]:
        """The ``width`` best beams by summed segment score (traced); those at ``max_segments`` end."""
        expanded = sorted(expanded, key=lambda beam: -beam.score)
        kept = expanded[: self.config.long_form.width]
        for beam in kept:
            limit = self.config.long_form.max_segments
            if beam.done is None and (beam.written >= limit or beam.steps >= 2 * limit + 1):
                beam.done = "max_segments"
                beam.reasons.append(f"truncated: stopped at long_form.max_segments={limit}")
        self.trace.append(BeamStep(
            chosen=tuple(describe(beam) for beam in kept),
            dropped=tuple(describe(beam) for beam in expanded[len(kept) :]),
            reason=f"kept the {len(kept)} best of {len(expanded)} partial answers by summed segment score",
        ))
        return kept

    def _decode(
        self, prompts: list[tuple[int, ...]], max_tokens: int | None = None, keep_prefix: bool = False
    ) -> list[Generation]:
        requests = [self.grammar.request(prompt, max_tokens, keep_prefix=keep_prefix) for prompt in prompts]
        return call(self.engine, requests, [self.counter] * len(requests))

    def _extend(self, beam: Beam, generation: Generation, passage: Passage | None) -> Beam:
        """Append one decoded segment to ``beam``; decide what its final token asks for."""
        generated = list(generation.token_ids)
        read = self.grammar.read(generation, lambda run: self.engine.tokenizer.decode(run, skip_special_tokens=False))
        stop, text = read.stop, read.text
        score = score_continuation(generated, generation.score_logprobs, self.ids, self.weights)
        beam.ids = beam.ids + read.body
        beam.steps += 1
        if passage is not None:
            beam.current = passage
        elif beam.ids and self.ids.last_of(beam.ids, Group.RETRIEVE) == rf.NO_RETRIEVAL:
            beam.current = None
        weights = self.weights
        gained = weights["support"] * (score.support or 0.0) if beam.current is not None else 0.0
        if passage is not None:
            gained += weights["relevance"] * (score.relevance or 0.0)
        if text:
            beam.written += 1
            segment = AnswerSegment(text, beam.current, score.support_token if beam.current is not None else None)
            self._ship(beam, segment)
        self._after(beam, generation, read, score.utility)
        beam.score += gained + (
            weights["utility"] * score.utility
            if stop in self.ids.ids(Group.UTILITY) and score.utility is not None
            else 0.0
        )
        return beam

    def _ship(self, beam: Beam, segment: AnswerSegment) -> None:
        if segment.support == rf.PARTIALLY_SUPPORTED and self.config.on_partial == "drop":
            self.trace.append(Partial(chosen="drop", reason=f"dropped {segment.text!r}"))
            return
        if segment.support == rf.PARTIALLY_SUPPORTED and self.config.on_partial == "rewrite":
            segment = AnswerSegment(
                self.config.partial_template.format(text=segment.text), segment.passage, segment.support
            )
        beam.segments.append(segment)

    def _after(self, beam: Beam, generation: Generation, read: SegmentRead, utility: float | None) -> None:
        """Set what the beam does next from the decode's last token (the decider reads the decision)."""
        if read.end == "eos":
            beam.done = "eos"
            return
        if read.stop is None:
            beam.done = "length"
            beam.reasons.append("truncated: a segment reached long_form.segment_tokens")
            return
        token = self.ids.token(read.stop)
        if read.end == "utility":
            beam.ids += (read.stop,)
            beam.done = f"{token} (utility {utility})"
            return
        wants, p_retrieve = self.decider.wants(token, generation)
        chosen = decide(token, wants, mode=self.config.mode, retrievals=beam.retrievals,
                        depth=self.config.long_form.depth, holds_passage=beam.current is not None)
        beam.ids += (self.ids.id(chosen),)
        self.trace.append(Decide(
            segment=beam.written,
            first_token=token,
            probabilities={"p_retrieve": p_retrieve},
            threshold=self.config.retrieve_threshold,
            chosen=chosen,
            reason=f"the model wrote {token}"
            + ("" if p_retrieve is None else f", p_retrieve {p_retrieve:.4f}")
            + ("" if beam.retrievals < self.config.long_form.depth else "; long_form.depth reached"),
        ))

    # -- retrieval steps ----------------------------------------------------------------------------

    def _retrieve_step(self, beam: Beam) -> list[Beam]:
        """Branch ``beam`` on fresh passages, round by round, by the short form's rule (:func:`.rounds.next_step`)."""
        base = beam.ids[:-1]  # without the [Retrieval] the branches re-insert with their passage
        prefix_text = " ".join(segment.text for segment in beam.segments)
        query = " ".join(f"{self.question} {prefix_text}".split())
        tried = set(beam.evidence)
        judged = irrelevant = 0  # branches of this step (pruned ones too), and those the model judged [Irrelevant]
        for round_ in range(self.config.max_rounds + 1):
            assert self.retriever is not None
            (hits,) = new_passages(self.retriever, [query], [tried], self.config.top_k)
            self.trace.append(Retrieve(
                segment=beam.written,
                round=round_,
                query=query,
                chosen=tuple(hit.passage.id for hit in hits),
                reason="the question plus the text so far; passages in context are skipped",
            ))
            if not hits:
                break
            tried.update(hit.passage.id for hit in hits)
            children, tokens = self._branches(beam, base, hits)
            scores = [score_continuation(g.token_ids, g.score_logprobs, self.ids, self.weights) for _, g in children]
            verdicts = [segment_verdict(score, self.config) for score in scores]
            good = [child for (child, _), (ok, _) in zip(children, verdicts, strict=True) if ok]
            judged += len(tokens)
            irrelevant += tokens.count(rf.IRRELEVANT)
            step = next_step(self.config, round_, all_irrelevant=bool(judged) and irrelevant == judged,
                             supported=bool(good))
            if step == "answer_without_retrieval":
                return [self._without_evidence(beam, base, round_, judged)]
            if step == "accept":
                return good
            best: Beam | None = None
            reason = "pruning stopped every branch after its relevance token"
            if children:
                index = max(range(len(children)), key=lambda i: (children[i][0].score, -i))
                best, reason = children[index][0], verdicts[index][1]
            query = policy.rewrite_query(self.config, self.question, prefix_text + " " + last_text(best))
            last = step == "give_up"
            self.trace.append(SegmentSupport(
                segment=beam.written,
                round=round_,
                chosen=self.config.on_unsupported if last else "re-retrieve",
                reason=reason,
                query=None if last else query,
            ))
            if last:
                return [self._give_up(beam, best, reason)]
        return [self._give_up(beam, None, "no new passage to retrieve")]

    def _branches(
        self, beam: Beam, base: tuple[int, ...], hits: list[Hit]
    ) -> tuple[list[tuple[Beam, Generation]], list[str | None]]:
        """The surviving branches (each a child beam with its decode), and every branch's relevance verdict."""
        tokenizer = self.engine.tokenizer
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
        return children, [verdict.token for verdict in verdicts]

    def _relevance(self, beam: Beam, hits: list[Hit], first: list[Generation]) -> list[RelevanceVerdict]:
        """Each branch's relevance verdict read at ``relevance_threshold`` (as the short form does)."""
        threshold = self.config.relevance_cut
        verdicts = [relevance_verdict(g, self.ids, threshold) for g in first]  # one-token decodes
        self.trace.append(relevance_entry([hit.passage.id for hit in hits], verdicts, threshold, segment=beam.written))
        return verdicts

    def _prune(self, beam: Beam, hits: list[Hit], relevance: list[float | None]) -> list[int]:
        """The branches that go on after their relevance token (the short form's rule, :func:`.stopped_branches`)."""
        if not self.config.pruning.enabled or all(value is None for value in relevance):
            return list(range(len(hits)))
        stopped = stopped_branches(relevance, self.config.pruning)
        keep = [i for i, stop in enumerate(stopped) if not stop]
        self.trace.append(Prune(
            segment=beam.written,
            relevance={hit.passage.id: value for hit, value in zip(hits, relevance, strict=True)},
            chosen=tuple(hits[i].passage.id for i in range(len(hits)) if stopped[i]),
            reason=f"{len(hits) - len(keep)} of {len(hits)} branches stopped after their relevance token",
        ))
        return keep

    def _without_evidence(self, beam: Beam, base: tuple[int, ...], round_: int, judged: int) -> Beam:
        """on_all_irrelevant=no_retrieval: every passage of this retrieval step was judged [Irrelevant], so the
        segment is written from the text so far + [No Retrieval] (uncited, flagged), as the short form answers."""
        reason = f"the model judged all {judged} retrieved passages {rf.IRRELEVANT}"
        self.trace.append(SegmentSupport(
            segment=beam.written,
            round=round_,
            chosen="answer_without_retrieval",
            reason=reason,
            why=f"on_all_irrelevant=no_retrieval: the segment comes from the text so far + {rf.NO_RETRIEVAL}",
        ))
        child = beam.child(base + (self.ids.id(rf.NO_RETRIEVAL),))
        child.retrievals += 1  # the retrieval happened (and counts against long_form.depth); nothing of it is used
        child.reasons.append(f"flagged: {reason}; segment {beam.written + 1} was written without sources")
        (generation,) = self._decode([self.prompt + child.ids])
        return self._extend(child, generation, None)

    def _give_up(self, beam: Beam, best: Beam | None, reason: str) -> Beam:
        if best is not None and self.config.on_unsupported == "flag":
            best.reasons.append(f"flagged: {reason}")
            return best
        ended = beam.child(beam.ids)
        ended.done = "abstained before an unsupported segment"
        ended.reasons.append(f"abstained: {reason}; the answer stops before that segment")
        return ended

    # -- the answer ---------------------------------------------------------------------------------

    def _finish(self, beams: list[Beam]) -> Answer:
        best = max(range(len(beams)), key=lambda i: (beams[i].score, -i))
        beam = beams[best]
        candidates = tuple(beam_candidate(b, self.ids, self.engine.tokenizer) for b in beams)
        self.trace.append(Finish(chosen=describe(beam), reason=f"highest beam score; {beam.done}"))
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
