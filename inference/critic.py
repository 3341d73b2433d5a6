"""Prompted-critic Self-RAG: the same policy for any instruct model, one critic call per decision.

    rag = PromptedSelfRAG(engine, retriever, InferenceConfig(top_k=3))
    answer = rag.answer("Who wrote Hamlet?")          # an Answer, like SelfRAG's
    answers = rag.answer_many(["q1", "q2"])

The baseline a fine-tuned model is measured against (and what an LLM labeler reuses). Per question:
retrieve? (adaptive mode) -> top-k passages -> relevant? per passage -> an answer per relevant passage (all
passages when none is) -> supported? and useful? per answer -> rank, then the single-pass runtime's policy
(:mod:`selfrag.inference.policy`): re-retrieve with the rewritten query up to ``max_rounds``, then abstain or
flag. The engine needs no reflection tokens (``token_ids`` may be absent). Every call of a phase is one
batch for all questions.

Critic replies are parsed strictly: the whole reply (case, surrounding spaces and a final full stop aside)
must be one of the allowed words (``yes``/``no``; ``fully``/``partially``/``no``; ``1``..``5``) or the
matching reflection token (``[Relevant]`` ...). A malformed reply is asked once more with a reminder
(``CriticSettings.retries``); if it is still malformed, the fallback verdict is used and the trace says so.
Scores use the verdicts as probabilities 1/0: relevance 1 or 0, support 1 / 0.5 / 0, utility -1 .. 1.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from selfrag import reflection as rf
from selfrag.errors import ConfigError
from selfrag.prompting import encode_prompt
from selfrag.reflection import strip_reflection_tokens
from selfrag.retrieval import Retriever
from selfrag.trajectory import Passage, Piece, parse_trajectory

from . import policy
from .answer import Answer, AnswerSegment, Candidate
from .config import InferenceConfig
from .engines.base import Engine, GenerationRequest
from .events import StreamEvent, TraceEvent, final_events
from .scoring import CandidateScore

logger = logging.getLogger(__name__)

#: Each critic question: the instruction, then reply word -> verdict token.
QUESTIONS: dict[str, tuple[str, dict[str, str]]] = {
    "retrieve": (
        "Question: {question}\n\nWould looking up documents in a reference corpus help answer this question "
        "accurately? Reply with exactly one word: yes or no.",
        {"yes": rf.RETRIEVAL, "no": rf.NO_RETRIEVAL},
    ),
    "relevance": (
        "Passage: {passage}\n\nQuestion: {question}\n\nDoes the passage contain information that helps answer "
        "the question? Reply with exactly one word: yes or no.",
        {"yes": rf.RELEVANT, "no": rf.IRRELEVANT},
    ),
    "support": (
        "Passage: {passage}\n\nStatement: {answer}\n\nIs the statement supported by the passage? Reply with exactly "
        "one word: fully, partially or no.",
        {"fully": rf.FULLY_SUPPORTED, "partially": rf.PARTIALLY_SUPPORTED, "no": rf.NO_SUPPORT},
    ),
    "utility": (
        "Question: {question}\n\nAnswer: {answer}\n\nHow useful is the answer to the question, from 1 (useless) to "
        "5 (complete and helpful)? Reply with exactly one digit.",
        {str(k): f"[Utility:{k}]" for k in range(1, 6)},
    ),
}
ANSWER_WITH_PASSAGE = "Answer the question using the passage.\n\nPassage: {passage}\n\nQuestion: {question}"
ANSWER_ALONE = "Answer the question concisely.\n\nQuestion: {question}"


@dataclass
class CriticSettings:
    """How critic calls are made and parsed."""

    max_tokens: int = 6  # a verdict is one word; a little room for "Yes." or a reflection token
    retries: int = 1  # extra asks after a malformed reply
    fallback: dict[str, str] = field(
        default_factory=lambda: {
            "retrieve": rf.RETRIEVAL,
            "relevance": rf.RELEVANT,
            "support": rf.NO_SUPPORT,
            "utility": "[Utility:3]",
        }
    )  # the verdict used when every reply was malformed (recorded as a fallback in the trace)


def parse_verdict(reply: str, options: dict[str, str]) -> str | None:
    """The verdict token a reply states, or None when it is not exactly one allowed word or token."""
    text = reply.strip()
    for token in options.values():
        if text == token:
            return token
    word = text.rstrip(".").strip().lower()
    return options.get(word)


@dataclass
class _Work:
    question: str
    trace: list[dict[str, Any]] = field(default_factory=list)
    engine_calls: int = 0
    generated_tokens: int = 0
    critic_calls: int = 0
    retrieve: bool = True
    query: str = ""
    round: int = 0
    seen: set[str] = field(default_factory=set)
    passages: list[Passage] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    outcome: tuple[str, int, str] | None = None


class PromptedSelfRAG:
    """Self-RAG with critic prompts instead of reflection tokens (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        retriever: Retriever | None,
        config: InferenceConfig | None = None,
        critic: CriticSettings | None = None,
    ) -> None:
        self.engine, self.retriever = engine, retriever
        self.config = config or InferenceConfig()
        self.critic = critic or CriticSettings()
        problems = self.config.validate()
        if retriever is None and self.config.mode != "never":
            problems.append(f"mode={self.config.mode} needs a retriever; pass one, or use mode=never")
        if self.config.form != "short":
            problems.append("the prompted critic answers in short form only; use form=short")
        if problems:
            raise ConfigError(problems)
        self.template = getattr(engine, "prompt_template", "auto") or "auto"
        self.weights = {name: getattr(self.config.weights, name) for name in ("relevance", "support", "utility")}

    def answer(self, question: str) -> Answer:
        return self.answer_many([question])[0]

    def answer_many(self, questions: Sequence[str]) -> list[Answer]:
        works = [_Work(question, query=question) for question in questions]
        answers: dict[int, str] = {}
        for _ in self._phases(works, answers):
            pass
        return [self._finish(work, answers.get(id(work))) for work in works]

    def stream(self, question: str) -> Iterator[StreamEvent]:
        """Events for one question, as :meth:`SelfRAG.stream <selfrag.inference.runtime.SelfRAG.stream>` sends them.

        Trace entries go out as each phase (decision, retrieval, relevance, answers, support and utility, a
        re-retrieval round) ends; the text follows the last verdict, since a later round can still replace it.
        """
        work = _Work(question, query=question)
        answers: dict[int, str] = {}
        sent = 0
        for _ in self._phases([work], answers):
            while sent < len(work.trace):
                yield TraceEvent(dict(work.trace[sent]))
                sent += 1
        answer = self._finish(work, answers.get(id(work)))
        yield from final_events(answer, answer.trace[sent:])

    def _phases(self, works: list[_Work], answers: dict[int, str]) -> Iterator[None]:
        """The batched phases; yields after each so :meth:`stream` can send the new trace entries."""
        self._decide(works)
        yield
        active = self._retrieve([work for work in works if work.retrieve])
        yield
        while active:
            self._candidates(active)
            yield
            active = self._retrieve([work for work in active if self._judge_round(work)])
            yield
        alone = [work for work in works if not work.retrieve]
        replies = self._generate(
            [(work, ANSWER_ALONE.format(question=work.question)) for work in alone], self.config.max_tokens
        )
        answers.update(zip(map(id, alone), replies, strict=True))

    # -- calls --------------------------------------------------------------------------------------

    def _generate(self, asks: list[tuple[_Work, str]], max_tokens: int) -> list[str]:
        if not asks:
            return []
        requests = [
            GenerationRequest(tuple(encode_prompt(self.engine.tokenizer, text, self.template)), max_tokens)
            for _, text in asks
        ]
        generations = self.engine.generate(requests)
        for work in {id(work): work for work, _ in asks}.values():
            work.engine_calls += 1
        replies = []
        for (work, _), generation in zip(asks, generations, strict=True):
            work.generated_tokens += len(generation.token_ids)
            ids = list(generation.token_ids)
            if generation.finish_reason == "eos":
                ids = ids[:-1]
            text = self.engine.tokenizer.decode(ids, skip_special_tokens=False)
            replies.append(text)
        return replies

    def _ask(self, kind: str, asks: list[tuple[_Work, dict[str, str]]]) -> list[tuple[str, dict[str, Any]]]:
        """One critic call per ask (batched); strict parse, retries, fallback. Returns (verdict, record)."""
        instruction, options = QUESTIONS[kind]
        prompts = [instruction.format(**fields) for _, fields in asks]
        results: list[tuple[str, dict[str, Any]] | None] = [None] * len(asks)
        replies_of: list[list[str]] = [[] for _ in asks]
        pending = list(range(len(asks)))
        for attempt in range(self.critic.retries + 1):
            suffix = "" if attempt == 0 else f"\n\nReply with exactly one of: {', '.join(options)}. Nothing else."
            replies = self._generate([(asks[i][0], prompts[i] + suffix) for i in pending], self.critic.max_tokens)
            still = []
            for i, reply in zip(pending, replies, strict=True):
                asks[i][0].critic_calls += 1
                replies_of[i].append(reply)
                verdict = parse_verdict(reply, options)
                if verdict is None:
                    still.append(i)
                else:
                    results[i] = (verdict, {"replies": replies_of[i], "verdict": verdict, "retried": attempt > 0})
            pending = still
            if not pending:
                break
        for i in pending:
            fallback = self.critic.fallback[kind]
            results[i] = (fallback, {"replies": replies_of[i], "verdict": fallback, "fallback": True})
        return [result for result in results if result is not None]

    # -- phases -------------------------------------------------------------------------------------

    def _decide(self, works: list[_Work]) -> None:
        if self.config.mode != "adaptive":
            for work in works:
                work.retrieve = self.config.mode == "always"
                work.trace.append(
                    {
                        "step": "decide",
                        "mode": self.config.mode,
                        "chosen": "retrieve" if work.retrieve else "no_retrieval",
                        "reason": f"mode={self.config.mode} skips the decision",
                    }
                )
            return
        for work, (verdict, record) in zip(
            works, self._ask("retrieve", [(w, {"question": w.question}) for w in works]), strict=True
        ):
            work.retrieve = verdict == rf.RETRIEVAL
            work.trace.append(
                {
                    "step": "decide",
                    "mode": "adaptive",
                    "critic": record,
                    "chosen": "retrieve" if work.retrieve else "no_retrieval",
                    "reason": "the critic's verdict" + (" (fallback)" if record.get("fallback") else ""),
                }
            )

    def _retrieve(self, works: list[_Work]) -> list[_Work]:
        if not works or self.retriever is None:
            return []
        k = self.config.top_k
        results = self.retriever.search_many([w.query for w in works], k + max(len(w.seen) for w in works))
        found = []
        for work, hits in zip(works, results, strict=True):
            work.passages = [hit.passage for hit in hits if hit.passage.id not in work.seen][:k]
            work.seen.update(p.id for p in work.passages)
            work.trace.append(
                {
                    "step": "retrieve",
                    "round": work.round,
                    "query": work.query,
                    "chosen": [p.id for p in work.passages],
                    "reason": f"top {k} passages not tried yet",
                }
            )
            if work.passages:
                found.append(work)
            elif work.round == 0:
                work.retrieve = False
            else:
                self._give_up(work, "re-retrieval found no new passage")
        return found

    def _candidates(self, works: list[_Work]) -> None:
        pairs = [(work, passage) for work in works for passage in work.passages]
        relevance = self._ask("relevance", [(w, {"passage": p.render(), "question": w.question}) for w, p in pairs])
        chosen = []
        for work in works:
            mine = [i for i, (w, _) in enumerate(pairs) if w is work]
            relevant = [i for i in mine if relevance[i][0] == rf.RELEVANT]
            chosen += relevant or mine
            work.trace.append(
                {
                    "step": "relevance",
                    "round": work.round,
                    "critic": {pairs[i][1].id: relevance[i][1] for i in mine},
                    "chosen": [pairs[i][1].id for i in (relevant or mine)],
                    "reason": "answers are generated from the passages the critic judged relevant"
                    + ("" if relevant else "; none was, so from all"),
                }
            )
        answers = self._generate(
            [
                (pairs[i][0], ANSWER_WITH_PASSAGE.format(passage=pairs[i][1].render(), question=pairs[i][0].question))
                for i in chosen
            ],
            self.config.max_tokens,
        )
        answers = [strip_reflection_tokens(answer).strip() for answer in answers]
        support = self._ask(
            "support",
            [
                (pairs[i][0], {"passage": pairs[i][1].render(), "answer": answer})
                for i, answer in zip(chosen, answers, strict=True)
            ],
        )
        utility = self._ask(
            "utility",
            [
                (pairs[i][0], {"question": pairs[i][0].question, "answer": answer})
                for i, answer in zip(chosen, answers, strict=True)
            ],
        )
        for n, i in enumerate(chosen):
            work, passage = pairs[i]
            work.candidates.append(
                self._candidate(passage, answers[n], relevance[i][0], support[n][0], utility[n][0], work.round)
            )
            work.trace.append(
                {
                    "step": "critique",
                    "round": work.round,
                    "passage_id": passage.id,
                    "critic": {"support": support[n][1], "utility": utility[n][1]},
                    "chosen": [relevance[i][0], support[n][0], utility[n][0]],
                    "reason": "one critic call per decision",
                }
            )

    def _candidate(
        self, passage: Passage, answer: str, relevance: str, support: str, utility: str, round_: int
    ) -> Candidate:
        components = {
            "relevance": 1.0 if relevance == rf.RELEVANT else 0.0,
            "support": {rf.FULLY_SUPPORTED: 1.0, rf.PARTIALLY_SUPPORTED: 0.5}.get(support, 0.0),
            "utility": rf.UTILITY_WEIGHTS[rf.utility_value(utility) - 1],
        }
        total = sum(self.weights[name] * value for name, value in components.items())
        score = CandidateScore(
            components["relevance"],
            components["support"],
            components["utility"],
            total,
            relevance,
            support,
            utility,
            (),
        )
        pieces: list[Piece] = [
            (rf.RETRIEVAL, True),
            (rf.PARAGRAPH_OPEN, True),
            (passage.render(), False),
            (rf.PARAGRAPH_CLOSE, True),
            (relevance, True),
            (answer, False),
            (support, True),
            (utility, True),
        ]
        parsed = parse_trajectory(pieces)
        return Candidate(
            passage,
            "".join(content for content, _ in pieces),
            answer,
            parsed.well_formed,
            parsed.problems,
            score,
            "stop",
            round=round_,
            parsed=parsed,
        )

    # -- policy (the runtime's) ---------------------------------------------------------------------

    def _judge_round(self, work: _Work) -> bool:
        indices = [i for i, c in enumerate(work.candidates) if c.round == work.round]
        best, entry = policy.rank(work.candidates, indices, self.weights)
        work.trace.append(entry | {"round": work.round})
        supported, reason = policy.judge(work.candidates[best], self.config)
        if supported:
            work.outcome = ("accept", best, reason)
            work.trace.append(
                {
                    "step": "support",
                    "round": work.round,
                    "passage_id": policy.passage_id(work.candidates[best]),
                    "chosen": "accept",
                    "reason": reason,
                }
            )
            return False
        if work.round < self.config.max_rounds:
            work.round += 1
            work.query = policy.rewrite_query(self.config, work.question, work.candidates[best].answer)
            work.trace.append(
                {
                    "step": "support",
                    "round": work.round - 1,
                    "chosen": "re-retrieve",
                    "passage_id": policy.passage_id(work.candidates[best]),
                    "reason": reason,
                    "query": work.query,
                }
            )
            return True
        self._give_up(work, reason)
        return False

    def _give_up(self, work: _Work, why: str) -> None:
        best = max(range(len(work.candidates)), key=lambda i: (policy.rank_key(work.candidates[i]), -i))
        _, reason = policy.judge(work.candidates[best], self.config)
        action = self.config.on_unsupported
        work.trace.append(
            {
                "step": "support",
                "round": work.round,
                "passage_id": policy.passage_id(work.candidates[best]),
                "chosen": action,
                "reason": reason,
                "why": why,
            }
        )
        work.outcome = (action, best, reason if reason == why else f"{reason}; {why}")

    def _finish(self, work: _Work, alone: str | None) -> Answer:
        common: dict[str, Any] = {
            "question": work.question,
            "retrieved": work.retrieve,
            "engine_calls": work.engine_calls,
            "generated_tokens": work.generated_tokens,
        }
        if not work.retrieve:
            text = strip_reflection_tokens(alone or "").strip()
            step: dict[str, Any] = {
                "step": "generate",
                "chosen": "answer_without_retrieval",
                "critic_calls": work.critic_calls,
                "reason": "no passage was used",
            }
            empty = not text  # as the single-pass runtime: an empty answer is never shipped as a confident one
            if empty:
                step["abstain"] = "the reply has no answer text"
            work.trace.append(step)
            return Answer(
                answer=self.config.abstain_text if empty else text,
                citations=(),
                abstained=empty,
                low_confidence=False,
                trace=tuple(work.trace),
                trajectory=text,
                candidates=(),
                chosen=None,
                segments=() if empty else (AnswerSegment(text),),
                reasons=("abstained: the model wrote no answer without retrieval",) if empty else (),
                **common,
            )
        assert work.outcome is not None
        action, best, reason = work.outcome
        chosen = work.candidates[best]
        work.trace.append(
            {
                "step": "finish",
                "chosen": action,
                "critic_calls": work.critic_calls,
                "reason": f"{work.critic_calls} critic calls",
            }
        )
        reasons = [] if action == "accept" else [f"{'abstained' if action == 'abstain' else 'flagged'}: {reason}"]
        segments: list[AnswerSegment] = []
        if action != "abstain":
            cite = chosen.score is None or chosen.score.relevance_token != rf.IRRELEVANT
            segments, _ = policy.shipped_segments(chosen, self.config, cite=cite)
        abstained = not segments
        if abstained and action != "abstain":
            reasons.append("abstained: no sentence is left after on_partial=drop")
        return Answer(
            answer=self.config.abstain_text if abstained else policy.join_segments(segments),
            citations=policy.citations(segments),
            abstained=abstained,
            low_confidence=bool(reasons) and not abstained,
            trace=tuple(work.trace),
            trajectory=chosen.trajectory,
            candidates=tuple(work.candidates),
            chosen=best,
            segments=tuple(segments),
            reasons=tuple(reasons),
            **common,
        )
