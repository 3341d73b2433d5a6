"""Prompted-critic Self-RAG: the same policy for any instruct model, one critic call per decision.

    rag = PromptedSelfRAG(engine, retriever, InferenceConfig(top_k=3))
    answer = rag.answer("Who wrote Hamlet?")          # an Answer, like SelfRAG's
    answers = rag.answer_many(["q1", "q2"])

The baseline a fine-tuned model is measured against (and what an LLM labeler reuses). Per question:
retrieve? (adaptive mode) -> top-k passages -> relevant? per passage -> an answer per relevant passage (all
passages when none is) -> supported? and useful? per answer -> rank, then the single-pass runtime's rounds
(:mod:`selfrag.inference.rounds`, the same loop, policy and trace entries): re-retrieve with the rewritten query up to
``max_rounds``, then abstain or flag; with ``on_all_irrelevant=no_retrieval``, once every passage is judged irrelevant
the question is answered alone (uncited, flagged) and no answer is written from those passages. The engine needs no
reflection tokens (``token_ids`` may be absent). Every call of a phase is one batch for all questions.

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

from selfrag import reflection as rf
from selfrag.errors import ConfigError
from selfrag.prompting import encode_prompt
from selfrag.reflection import strip_reflection_tokens
from selfrag.retrieval import Retriever
from selfrag.trajectory import Passage, Piece, parse_trajectory

from . import policy
from .answer import Answer, Candidate
from .config import InferenceConfig
from .engines.base import Engine, GenerationRequest, context_limit
from .events import StreamEvent
from .rounds import Rounds
from .trace import CandidateScore, CriticRecord, CriticRelevance, Critique, Decide
from .work import Work, call, check_question

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


#: Bumped when the same model, settings and question are answered differently in this mode (the single-pass runtime
#: has its own, :data:`selfrag.inference.runtime.BEHAVIOUR_VERSION`). What each bump changed:
#: results/runtime-versions.md.
BEHAVIOUR_VERSION = 3


@dataclass
class _CriticWork(Work):
    critic_calls: int = 0


class PromptedSelfRAG(Rounds[_CriticWork]):
    """Self-RAG with critic prompts instead of reflection tokens (see the module docstring)."""

    alone_from = "the question alone"
    written = "reply"
    empty_because = None

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

    def answer(self, question: str) -> Answer:
        return self.answer_many([question])[0]

    def answer_many(self, questions: Sequence[str]) -> list[Answer]:
        works = self._works(questions)
        for _ in self.phases(works):
            pass
        return [self.finish(work) for work in works]

    def stream(self, question: str) -> Iterator[StreamEvent]:
        """Events for one question, as :meth:`SelfRAG.stream <selfrag.inference.runtime.SelfRAG.stream>` sends them.

        Trace entries go out as each phase (decision, retrieval, a round's critique and verdict) ends; the text
        follows the last verdict, since a later round can still replace it.
        """
        for _, event in self.stream_many([question]):
            yield event

    def stream_many(self, questions: Sequence[str]) -> Iterator[tuple[int, StreamEvent]]:
        """``(question index, event)`` for several questions, one call per phase for all (as SelfRAG's)."""
        yield from self.stream_works(self._works(questions))

    def _works(self, questions: Sequence[str]) -> list[_CriticWork]:
        """One work per question; an empty question, or one that leaves no room to answer, is refused first."""
        limit = context_limit(self.engine)
        for index, question in enumerate(questions):
            prompt = encode_prompt(self.engine.tokenizer, question, self.template)
            check_question(question, len(prompt), self.config.max_tokens, limit, index if len(questions) > 1 else None)
        return [_CriticWork(question, query=question) for question in questions]

    # -- calls --------------------------------------------------------------------------------------

    def _generate(self, asks: list[tuple[_CriticWork, str]], max_tokens: int) -> list[str]:
        """One engine call for every ``(work, instruction)``: the replies, special tokens kept, the end id dropped."""
        requests = [
            GenerationRequest(tuple(encode_prompt(self.engine.tokenizer, text, self.template)), max_tokens)
            for _, text in asks
        ]
        replies = []
        for generation in call(self.engine, requests, [work for work, _ in asks]):
            ids = list(generation.token_ids)
            if generation.finish_reason == "eos":
                ids = ids[:-1]
            replies.append(self.engine.tokenizer.decode(ids, skip_special_tokens=False))
        return replies

    def _ask(self, kind: str, asks: list[tuple[_CriticWork, dict[str, str]]]) -> list[tuple[str, CriticRecord]]:
        """One critic call per ask (batched); strict parse, retries, fallback. Returns (verdict, record)."""
        instruction, options = QUESTIONS[kind]
        prompts = [instruction.format(**fields) for _, fields in asks]
        results: list[tuple[str, CriticRecord] | None] = [None] * len(asks)
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
                    results[i] = (verdict, CriticRecord(tuple(replies_of[i]), verdict, retried=attempt > 0))
            pending = still
            if not pending:
                break
        for i in pending:
            fallback = self.critic.fallback[kind]
            results[i] = (fallback, CriticRecord(tuple(replies_of[i]), fallback, fallback=True))
        return [result for result in results if result is not None]

    # -- the loop's steps (see :mod:`.rounds`) --------------------------------------------------------

    def decide(self, works: list[_CriticWork]) -> None:
        if self.config.mode != "adaptive":
            for work in works:
                work.retrieve = self.config.mode == "always"
                work.trace.append(Decide(mode=self.config.mode, chosen="retrieve" if work.retrieve else "no_retrieval",
                                         reason=f"mode={self.config.mode} skips the decision"))
            return
        for work, (verdict, record) in zip(
            works, self._ask("retrieve", [(w, {"question": w.question}) for w in works]), strict=True
        ):
            work.retrieve = verdict == rf.RETRIEVAL
            work.trace.append(Decide(mode="adaptive", critic=record,
                                     chosen="retrieve" if work.retrieve else "no_retrieval",
                                     reason="the critic's verdict" + (" (fallback)" if record.fallback else "")))

    def answer_alone(self, works: list[_CriticWork]) -> None:
        asks = [(work, ANSWER_ALONE.format(question=work.question)) for work in works]
        for work, reply in zip(works, self._generate(asks, self.config.max_tokens), strict=True):
            work.alone = reply

    def alone_candidate(self, work: _CriticWork) -> Candidate:
        reply = work.alone or ""
        text = strip_reflection_tokens(reply).strip()
        return Candidate(None, text, text, True, (), None, "stop", generated=reply)

    def tally(self, work: _CriticWork) -> dict[str, int]:
        return {"critic_calls": work.critic_calls}

    def branch(self, works: list[_CriticWork]) -> None:
        """Relevant? per passage; an answer per relevant passage (all when none is, or none where
        on_all_irrelevant=no_retrieval answers alone); supported? and useful? per answer."""
        pairs = [(work, hit.passage) for work in works for hit in work.hits]
        relevance = self._ask("relevance", [(w, {"passage": p.render(), "question": w.question}) for w, p in pairs])
        chosen = []
        for work in works:
            mine = [i for i, (w, _) in enumerate(pairs) if w is work]
            relevant = [i for i in mine if relevance[i][0] == rf.RELEVANT]
            alone = not relevant and self.config.on_all_irrelevant == "no_retrieval" and (
                not work.candidates or policy.all_irrelevant(work.candidates))
            answered = relevant or ([] if alone else mine)
            chosen += answered
            for i in mine if alone else []:  # the round's verdict is known: no answer is written from these
                work.candidates.append(self._judged_only(pairs[i][1], relevance[i][0], work.round))
            why = "; none was, so from all" if not relevant and not alone else ""
            if alone:
                why = "; none was, and on_all_irrelevant=no_retrieval answers the question alone"
            work.trace.append(CriticRelevance(
                round=work.round,
                critic={pairs[i][1].id: relevance[i][1] for i in mine},
                chosen=tuple(pairs[i][1].id for i in answered),
                reason="answers are generated from the passages the critic judged relevant" + why,
            ))
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
            work.trace.append(Critique(
                round=work.round,
                passage_id=passage.id,
                critic={"support": support[n][1], "utility": utility[n][1]},
                chosen=(relevance[i][0], support[n][0], utility[n][0]),
                reason="one critic call per decision",
            ))

    def _judged_only(self, passage: Passage, relevance: str, round_: int) -> Candidate:
        """A passage with its relevance verdict only (no answer was written from it), like a pruned branch."""
        value = 1.0 if relevance == rf.RELEVANT else 0.0
        score = CandidateScore(value, None, None, self.weights["relevance"] * value, relevance, None, None,
                               ("support", "utility"))
        pieces: list[Piece] = [
            (rf.RETRIEVAL, True), (rf.PARAGRAPH_OPEN, True), (passage.render(), False), (rf.PARAGRAPH_CLOSE, True),
            (relevance, True),
        ]
        parsed = parse_trajectory(pieces)
        return Candidate(passage, "".join(content for content, _ in pieces), "", parsed.well_formed, parsed.problems,
                         score, "stop", pruned=True, round=round_, parsed=parsed)

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
