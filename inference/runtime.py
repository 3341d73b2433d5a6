"""The single-pass Self-RAG runtime (short form): the model's own reflection tokens drive every decision.

    rag = SelfRAG(ENGINES["hf"](model_dir="runs/smollm2-selfrag"), RETRIEVERS["bm25"](corpus="corpus.jsonl"))
    print(rag.answer("Who wrote Hamlet?").to_json())

Per question: (1) decide: one decode from the prompt; ``p_retrieve`` from its first position, in
probabilities; below the threshold that same decode is the answer; (2) retrieve top-k passages and
decode every ``prompt + [Retrieval]<paragraph>…</paragraph>`` continuation in one batch; (3) score
each from its relevance, support and utility tokens, keep the best, and abstain or flag when it is
unsupported. ``answer_many`` batches across questions: one engine call per phase.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from selfrag import reflection as rf
from selfrag.errors import ConfigError
from selfrag.prompting import encode_prompt, passage_ids
from selfrag.reflection import Group
from selfrag.retrieval import Hit, Retriever
from selfrag.trajectory import Passage, lex_ids, parse_trajectory

from .answer import Answer, Candidate
from .config import InferenceConfig
from .engines.base import Engine, Generation, GenerationRequest
from .events import CitationEvent, FinalEvent, SegmentEvent, StreamEvent, TraceEvent
from .scoring import retrieve_probability, score_continuation

logger = logging.getLogger(__name__)


@dataclass
class _Work:
    """One question's state between the batched phases."""

    question: str
    prompt: tuple[int, ...]
    trace: list[dict[str, Any]] = field(default_factory=list)
    engine_calls: int = 0
    generated_tokens: int = 0
    retrieve: bool = False
    answer_generation: Generation | None = None  # the decision's own decode, reused as the answer
    prefix: tuple[int, ...] = ()  # ids forced after the prompt on the no-retrieval path
    hits: list[Hit] = field(default_factory=list)
    pending: list[GenerationRequest] = field(default_factory=list)
    results: list[Generation] = field(default_factory=list)


class SelfRAG:
    """Answer questions with a model trained to emit reflection tokens (see the module docstring)."""

    def __init__(self, engine: Engine, retriever: Retriever | None, config: InferenceConfig | None = None) -> None:
        self.engine = engine
        self.retriever = retriever
        # threshold/support_bound left at their defaults take the model's calibrated values (selfrag calibrate)
        self.config = (config or InferenceConfig()).resolved(getattr(engine, "calibration", None))
        problems = self.config.validate()
        if retriever is None and self.config.mode != "never":
            problems.append(f"mode={self.config.mode} needs a retriever; pass one, or use mode=never")
        if problems:
            raise ConfigError(problems)
        ids = engine.token_ids
        self._utility_ids = ids.ids(Group.UTILITY)
        self._retrieval_id = ids.id(rf.RETRIEVAL)
        self._no_retrieval_id = ids.id(rf.NO_RETRIEVAL)

    # -- public -------------------------------------------------------------------------------------

    def answer(self, question: str) -> Answer:
        return self.answer_many([question])[0]

    def stream(self, question: str) -> Iterator[StreamEvent]:
        """Events for one question (see :mod:`selfrag.inference.events`).

        Short form decides once per question, so every verdict is final only when the answer is: the trace,
        the citations and the accepted text are sent after it, never text that a later verdict retracts.
        """
        answer = self.answer(question)
        for entry in answer.trace:
            yield TraceEvent(dict(entry))
        for passage in answer.citations:
            yield CitationEvent(passage)
        if answer.answer:
            yield SegmentEvent(answer.answer, answer.citations[0] if answer.citations else None)
        yield FinalEvent(answer)

    def answer_many(self, questions: Sequence[str]) -> list[Answer]:
        """Answer ``questions`` with one engine call for all decisions and one for all continuations."""
        template = self.engine.prompt_template
        works = [_Work(q, tuple(encode_prompt(self.engine.tokenizer, q, template))) for q in questions]
        # (1) decide
        adaptive = [work for work in works if self.config.mode == "adaptive"]
        decisions = self._call([self._decision_request(work.prompt) for work in adaptive], adaptive)
        for work, generation in zip(adaptive, decisions, strict=True):
            self._decide(work, generation)
        for work in works:
            if self.config.mode != "adaptive":
                self._fixed_decision(work)
        # (2) retrieve, then decode every continuation of every question in one call
        self._retrieve([work for work in works if work.retrieve])
        for work in works:
            self._plan_continuations(work)
        waiting = [work for work in works if work.pending]
        generations = self._call([request for work in waiting for request in work.pending], waiting)
        for work in waiting:
            work.results, generations = generations[: len(work.pending)], generations[len(work.pending) :]
        # (3) score, choose, apply the policy
        return [self._finish(work) for work in works]

    # -- requests -----------------------------------------------------------------------------------

    def _decision_request(self, prompt: tuple[int, ...]) -> GenerationRequest:
        return GenerationRequest(
            prompt_ids=prompt,
            max_tokens=self.config.max_tokens,
            stop_token_ids=(self._retrieval_id, *self._utility_ids),
            score_token_ids=self.engine.token_ids.all_ids,
        )

    def _continuation_request(self, prompt: Sequence[int]) -> GenerationRequest:
        return GenerationRequest(
            prompt_ids=tuple(prompt),
            max_tokens=self.config.max_tokens,
            stop_token_ids=self._utility_ids,
            score_token_ids=self.engine.token_ids.all_ids,
        )

    def _call(self, requests: list[GenerationRequest], works: Sequence[_Work]) -> list[Generation]:
        if not requests:
            return []
        generations = self.engine.generate(requests)
        if len(generations) != len(requests):
            raise RuntimeError(f"{self.engine.name} returned {len(generations)} generations for {len(requests)}")
        for work in works:
            work.engine_calls += 1
        return generations

    # -- (1) decide ---------------------------------------------------------------------------------

    def _decide(self, work: _Work, generation: Generation) -> None:
        work.generated_tokens += len(generation.token_ids)
        first = generation.token_ids[0] if generation.token_ids else None
        first_token = None if first is None else self.engine.token_ids.token(first)
        logprobs = generation.score_logprobs[0] if generation.score_logprobs else {}
        p_retrieve = retrieve_probability(logprobs, self.engine.token_ids)
        step: dict[str, Any] = {
            "step": "decide",
            "mode": "adaptive",
            "probabilities": {
                "retrieval": _probability(logprobs.get(self._retrieval_id)),
                "no_retrieval": _probability(logprobs.get(self._no_retrieval_id)),
                "p_retrieve": p_retrieve,
            },
            "threshold": self.config.threshold,
            "first_token": first_token,
        }
        if p_retrieve is None:
            work.retrieve = first == self._retrieval_id
            step["reason"] = (
                f"neither retrieve token has a log-prob; fell back to the generated first token {first_token!r}"
            )
        else:
            work.retrieve = p_retrieve > self.config.threshold
            relation = ">" if work.retrieve else "<="
            step["reason"] = f"p_retrieve {p_retrieve:.4f} {relation} threshold {self.config.threshold}"
        step["chosen"] = "retrieve" if work.retrieve else "no_retrieval"
        if work.retrieve and first != self._retrieval_id:
            step["discarded"] = f"the model went on with {first_token!r}; that continuation is discarded"
        elif not work.retrieve and first == self._retrieval_id:
            work.prefix = (self._no_retrieval_id,)
            step["discarded"] = f"the model emitted {rf.RETRIEVAL}; continuing once from the prompt + {rf.NO_RETRIEVAL}"
        elif not work.retrieve:
            work.answer_generation = generation
            step["reused"] = "the decision's own generation is the answer (no second decode)"
        work.trace.append(step)

    def _fixed_decision(self, work: _Work) -> None:
        mode = self.config.mode
        work.retrieve = mode == "always"
        if mode == "never":
            work.prefix = (self._no_retrieval_id,)
        work.trace.append({
            "step": "decide",
            "mode": mode,
            "probabilities": None,
            "chosen": "retrieve" if work.retrieve else "no_retrieval",
            "reason": f"mode={mode} skips the decision",
        })

    # -- (2) retrieve and plan continuations --------------------------------------------------------

    def _retrieve(self, works: Sequence[_Work]) -> None:
        if not works or self.retriever is None:
            return
        results = self.retriever.search_many([work.question for work in works], self.config.top_k)
        for work, hits in zip(works, results, strict=True):
            work.hits = list(hits)
            reason = f"top {self.config.top_k} passages for the question"
            if not hits:
                work.retrieve, work.prefix = False, (self._no_retrieval_id,)
                reason = f"the retriever found nothing; answering from the prompt + {rf.NO_RETRIEVAL}"
            work.trace.append({
                "step": "retrieve",
                "query": work.question,
                "chosen": [hit.passage.id for hit in hits],
                "scores": [hit.score for hit in hits],
                "reason": reason,
            })

    def _plan_continuations(self, work: _Work) -> None:
        if work.retrieve:
            tokenizer, ids = self.engine.tokenizer, self.engine.token_ids
            work.pending = [
                self._continuation_request(work.prompt + tuple(passage_ids(tokenizer, ids, hit.passage)))
                for hit in work.hits
            ]
        elif work.answer_generation is None:
            work.pending = [self._continuation_request(work.prompt + work.prefix)]

    # -- (3) score, choose, policy ------------------------------------------------------------------

    def _finish(self, work: _Work) -> Answer:
        work.generated_tokens += sum(len(generation.token_ids) for generation in work.results)
        if work.retrieve:
            return self._finish_retrieved(work)
        generation = work.answer_generation or work.results[0]
        candidate = self._candidate(None, work.prefix, generation)
        step: dict[str, Any] = {
            "step": "generate",
            "chosen": "answer_without_retrieval",
            "reason": "no passage was used; there is no relevance or support verdict to apply",
            "well_formed": candidate.well_formed,
            "problems": list(candidate.problems),
        }
        if generation.finish_reason == "stop" and generation.token_ids[-1] == self._retrieval_id:
            step["truncated"] = f"the model asked for {rf.RETRIEVAL} mid-answer; the short form stops the answer there"
        work.trace.append(step)
        return self._answer(work, candidate.answer, (candidate,), 0, citations=(), low_confidence=False)

    def _finish_retrieved(self, work: _Work) -> Answer:
        tokenizer, ids = self.engine.tokenizer, self.engine.token_ids
        candidates = tuple(
            self._candidate(hit.passage, tuple(passage_ids(tokenizer, ids, hit.passage)), generation)
            for hit, generation in zip(work.hits, work.results, strict=True)
        )
        best = max(range(len(candidates)), key=lambda index: _total(candidates[index]))
        chosen = candidates[best]
        work.trace.append({
            "step": "rank",
            "weights": {name: getattr(self.config.weights, name) for name in ("relevance", "support", "utility")},
            "candidates": [_candidate_trace(candidate) for candidate in candidates],
            "chosen": chosen.passage.id if chosen.passage else None,
            "reason": f"highest combined score {_total(chosen):.4f} of {len(candidates)} candidates",
        })
        unsupported, reason = self._unsupported(chosen)
        action = ("abstain" if self.config.on_unsupported == "abstain" else "flag") if unsupported else "accept"
        work.trace.append({
            "step": "support",
            "verdict": chosen.score.support_token if chosen.score else None,
            "probabilities": {"support": chosen.score.support if chosen.score else None},
            "support_bound": self.config.support_bound,
            "chosen": action,
            "reason": reason,
        })
        if action == "abstain":
            return self._answer(work, self.config.abstain_text, candidates, best, (), False, abstained=True)
        passages = () if chosen.passage is None else (chosen.passage,)
        return self._answer(work, chosen.answer, candidates, best, passages, low_confidence=action == "flag")

    def _unsupported(self, chosen: Candidate) -> tuple[bool, str]:
        score = chosen.score
        token = None if score is None else score.support_token
        if token is None:
            return True, "the best continuation has no support verdict, so nothing says the passage supports it"
        if token == rf.NO_SUPPORT:
            return True, f"the model judged the best continuation {token}"
        bound = self.config.support_bound
        if bound > 0 and (score is None or score.support is None or score.support < bound):
            value = None if score is None else score.support
            return True, f"support score {value} is below support_bound {bound}"
        return False, f"the model judged the best continuation {token}"

    def _candidate(self, passage: Passage | None, prefix: Sequence[int], generation: Generation) -> Candidate:
        """Parse ``prefix + generated`` (ids are authoritative; a final eos is dropped) and score it."""
        generated = list(generation.token_ids)
        if generation.finish_reason == "eos" or (generated and generated[-1] == self._retrieval_id and passage is None):
            generated = generated[:-1]  # eos is not text; a [Retrieval] stop after the answer started is cut
        tokenizer = self.engine.tokenizer
        pieces = lex_ids([*prefix, *generated], self.engine.token_ids,
                         lambda run: tokenizer.decode(run, skip_special_tokens=False))
        trajectory = parse_trajectory(pieces)
        weights = {name: getattr(self.config.weights, name) for name in ("relevance", "support", "utility")}
        score = None
        if passage is not None:
            score = score_continuation(generated, generation.score_logprobs, self.engine.token_ids, weights)
        return Candidate(
            passage=passage,
            trajectory="".join(content for content, _ in pieces),
            answer=trajectory.answer,
            well_formed=trajectory.well_formed,
            problems=trajectory.problems,
            score=score,
            finish_reason=generation.finish_reason,
        )

    def _answer(
        self,
        work: _Work,
        text: str,
        candidates: tuple[Candidate, ...],
        chosen: int,
        citations: tuple[Passage, ...],
        low_confidence: bool,
        abstained: bool = False,
    ) -> Answer:
        return Answer(
            question=work.question,
            answer=text,
            citations=citations,
            retrieved=work.retrieve,
            abstained=abstained,
            low_confidence=low_confidence,
            trace=tuple(work.trace),
            trajectory=candidates[chosen].trajectory,
            candidates=candidates,
            chosen=chosen,
            engine_calls=work.engine_calls,
            generated_tokens=work.generated_tokens,
        )


def _probability(logprob: float | None) -> float | None:
    return None if logprob is None else math.exp(logprob)


def _total(candidate: Candidate) -> float:
    return candidate.score.total if candidate.score is not None else 0.0


def _candidate_trace(candidate: Candidate) -> dict[str, Any]:
    data: dict[str, Any] = {"passage_id": candidate.passage.id if candidate.passage else None}
    if candidate.score is not None:
        data.update(candidate.score.to_json())
    data["well_formed"] = candidate.well_formed
    return data
