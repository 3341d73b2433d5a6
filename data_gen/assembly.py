"""Assembly of one question into a trajectory, following the paper's recipe, with a teacher for every label.

    outcome = await Assembler(teacher, labeler, retriever, top_k=3).assemble(query)

1. the answer: the query's own ``output`` (or first answer); without one the teacher writes it from the
   top passages;
2. the retrieve decision on the question alone ([Retrieval] / [No Retrieval]);
3. with retrieval, the answer is split into sentences; the first sentence retrieves, each later one gets a
   three-way decision given the evidence so far ([Retrieval] / [Continue to Use Evidence] / [No Retrieval]);
4. each retrieval labels the top-k BM25 passages for relevance, the relevant ones for support, and keeps
   the passage with the best support (then the better rank); with no relevant passage, the top one is kept
   as [Irrelevant] with its support label;
5. utility of the whole answer at the end.

Every label is also a critic row (question, passage, output -> one token). An item whose labels stay
malformed is dropped with its reason; the question is dropped when a decision it cannot do without is
(its retrieve decision, a sentence's decision, every candidate passage, its utility).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from selfrag import reflection as rf
from selfrag.corpus import Query
from selfrag.data_gen.labelers import LabelItem, LabelResult, LLMLabeler
from selfrag.data_gen.teachers import ChatRequest, Teacher
from selfrag.inference.retrievers.batched import BatchedSearcher
from selfrag.retrieval import Retriever
from selfrag.sentences import split_sentences
from selfrag.trajectory import Label, Passage, Record, Segment

SUPPORT_RANK = {rf.FULLY_SUPPORTED: 2, rf.PARTIALLY_SUPPORTED: 1, rf.NO_SUPPORT: 0}
CRITIC_TYPE = {
    "retrieve": "retrieve",
    "retrieve_sentence": "retrieve",
    "relevance": "relevance",
    "support": "support",
    "utility": "utility",
}

ANSWER_PROMPT = (
    "Answer the question in one to three sentences. Use the evidence where it helps.\n\n{evidence}\n"
    "Question: {question}\nAnswer:"
)
ANSWER_CORRECTION = "That reply was empty. Answer the question in one to three sentences."
QUESTION_CORRECTION = (
    "That reply cannot be used: {problem}. Reply again with exactly one JSON object and nothing else: "
    '{{"question": "<question>", "answer": "<answer in one or two sentences>"}}'
)
QUESTION_PROMPT = (
    "Write one question that the passage below answers, and its answer. The question must make sense without "
    "the passage. Reply with exactly one JSON object and nothing else: "
    '{{"question": "<question>", "answer": "<answer in one or two sentences>"}}\n\nPassage: {passage}'
)


@dataclass
class Outcome:
    """What one question produced; stored as one journal line, so a question is done entirely or not at all."""

    query_id: str
    source: str
    record: dict[str, Any] | None = None
    critic: list[dict[str, Any]] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)  # reasons; a dropped question has record None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id,
            "source": self.source,
            "record": self.record,
            "critic": self.critic,
            "drops": self.drops,
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


class QuestionDropped(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Assembler:
    def __init__(
        self, teacher: Teacher, labeler: LLMLabeler, retriever: Retriever, top_k: int = 3, seed: int = 0
    ) -> None:
        self.teacher = teacher
        self.labeler = labeler
        self.retriever = retriever
        self.searcher = BatchedSearcher(retriever)  # off the event loop, many questions' searches in one batch
        self.top_k = top_k
        self.seed = seed

    async def assemble(self, query: Query, seed_passage: Passage | None = None) -> Outcome:
        outcome = Outcome(query.id, str(query.meta.get("source", "")))
        try:
            if seed_passage is not None:
                query = await self._write_question(query, seed_passage, outcome)
            answer = query.output or (query.answers[0] if query.answers else None)
            if answer is None:
                answer = await self._write_answer(query, outcome)
            segments, decision = await self._segments(query, answer, outcome)
            utility = await self._label(outcome, LabelItem("utility", query.question, output=answer), required=True)
        except QuestionDropped as dropped:
            outcome.drops.append(dropped.reason)
            outcome.record = None
            return outcome
        assert utility is not None and decision is not None  # required labels raise instead
        meta: dict[str, Any] = {"query_id": query.id, "kind": "llm"}
        if "split" in query.meta:
            meta["split"] = query.meta["split"]
        record = Record(query.id + "/llm", query.question, tuple(segments), utility, outcome.source, meta)
        outcome.record = record.to_json()
        return outcome

    # --- the recipe ---------------------------------------------------------------------------------------

    async def _segments(self, query: Query, answer: str, outcome: Outcome) -> tuple[list[Segment], Label | None]:
        first = await self._label(outcome, LabelItem("retrieve", query.question), required=True)
        assert first is not None
        if first.value == rf.NO_RETRIEVAL:
            return [Segment(answer, retrieve=first)], first
        sentences = split_sentences(answer) or [answer]
        segments: list[Segment] = []
        evidence: Passage | None = None
        for index, sentence in enumerate(sentences):
            preceding = " ".join(sentences[:index])
            text = sentence if index == 0 else " " + sentence
            decision: Label | None = first
            if index > 0:
                item = LabelItem("retrieve_sentence", query.question, evidence, sentence, preceding)
                decision = await self._label(outcome, item, required=True)
            assert decision is not None
            if decision.value == rf.RETRIEVAL:
                search = query.question if index == 0 else f"{query.question} {sentence}"
                passage, relevance, support = await self._choose_passage(query, search, sentence, preceding, outcome)
                evidence = passage
                segments.append(Segment(text, decision, passage, relevance, support))
            elif decision.value == rf.CONTINUE_EVIDENCE:
                if evidence is None:  # cannot happen after a retrieving first sentence; never write a made-up label
                    raise QuestionDropped("retrieve_sentence: [Continue to Use Evidence] without evidence")
                item = LabelItem("support", query.question, evidence, sentence, preceding)
                continued = await self._label(outcome, item, required=True)
                segments.append(Segment(text, decision, support=continued))
            else:
                segments.append(Segment(text, decision))
        return segments, first

    async def _choose_passage(
        self, query: Query, search: str, sentence: str, preceding: str, outcome: Outcome
    ) -> tuple[Passage, Label, Label]:
        # a question with ctxs of its own answers every search of its sentences from them (by its question)
        search = query.question if query.ctxs else search
        hits = [hit.passage for hit in await self.searcher.search(search, self.top_k)]
        relevance = await self._label_many(outcome, [LabelItem("relevance", query.question, p) for p in hits])
        labelled = [(p, r) for p, r in zip(hits, relevance, strict=True) if r is not None]
        if not labelled:
            raise QuestionDropped("relevance: no candidate passage could be labelled")
        relevant = [(p, r) for p, r in labelled if r.value == rf.RELEVANT]
        if not relevant and len(labelled) < len(hits):
            # The unlabelled candidate may be the evidence: an [Irrelevant] fallback would teach a verdict about
            # the evidence that the teacher never gave.
            raise QuestionDropped("relevance: a candidate's label was dropped and no labelled candidate is relevant")
        relevant = relevant or labelled[:1]
        supports = await self._label_many(
            outcome, [LabelItem("support", query.question, p, sentence, preceding) for p, _ in relevant]
        )
        scored = [
            (SUPPORT_RANK[s.value], -rank, p, r, s)
            for rank, ((p, r), s) in enumerate(zip(relevant, supports, strict=True))
            if s is not None
        ]
        if not scored:
            raise QuestionDropped("support: no candidate passage could be labelled")
        _, _, passage, rel, sup = max(scored, key=lambda row: (row[0], row[1]))
        return passage, rel, sup

    # --- teacher calls ------------------------------------------------------------------------------------

    async def _label(self, outcome: Outcome, item: LabelItem, required: bool = False) -> Label | None:
        return (await self._label_many(outcome, [item], required))[0]

    async def _label_many(self, outcome: Outcome, items: list[LabelItem], required: bool = False) -> list[Label | None]:
        """Label items concurrently; book the results in the items' order, so output never depends on timing."""
        results = await asyncio.gather(*(self.labeler.label(item) for item in items))
        labels: list[Label | None] = []
        for item, result in zip(items, results, strict=True):
            self._count(outcome, result)
            if result.label is None:
                if required:
                    raise QuestionDropped(result.drop or f"{item.kind}: dropped")
                outcome.drops.append(result.drop or f"{item.kind}: dropped")
            else:
                outcome.critic.append(critic_row(outcome, item, result.label))
            labels.append(result.label)
        return labels

    def _count(self, outcome: Outcome, result: LabelResult) -> None:
        outcome.calls += result.calls
        outcome.prompt_tokens += result.prompt_tokens
        outcome.completion_tokens += result.completion_tokens

    async def _ask(self, outcome: Outcome, messages: tuple[tuple[str, str], ...], attempt: int = 0) -> str:
        request = ChatRequest(messages, 256, self.labeler.temperature, seed=self.seed, attempt=attempt)
        reply = await self.teacher.chat(request)
        outcome.calls += 1
        outcome.prompt_tokens += reply.prompt_tokens
        outcome.completion_tokens += reply.completion_tokens
        return reply.text.strip()

    async def _write_answer(self, query: Query, outcome: Outcome) -> str:
        hits = await self.searcher.search(query.question, self.top_k)
        evidence = "\n".join(f"Evidence: {hit.passage.render()}" for hit in hits)
        messages: tuple[tuple[str, str], ...] = (
            ("user", ANSWER_PROMPT.format(evidence=evidence, question=query.question)),
        )
        for attempt in range(self.labeler.retries + 1):
            text = await self._ask(outcome, messages, attempt)
            if text:
                return text
            messages = (*messages, ("assistant", text), ("user", ANSWER_CORRECTION))
        raise QuestionDropped("answer: the teacher wrote no answer")

    async def _write_question(self, query: Query, passage: Passage, outcome: Outcome) -> Query:
        messages: tuple[tuple[str, str], ...] = (("user", QUESTION_PROMPT.format(passage=passage.render())),)
        replies: list[str] = []
        reason = "reply is not JSON"
        calls = 0
        for attempt in range(self.labeler.retries + 1):
            text = await self._ask(outcome, messages, attempt)
            calls += 1
            try:
                data = json.loads(text.strip().removeprefix("```json").removeprefix("```").removesuffix("```"))
            except json.JSONDecodeError:
                data, reason = None, "reply is not JSON"
            question, answer = (data.get(k) if isinstance(data, dict) else None for k in ("question", "answer"))
            if isinstance(question, str) and question.strip() and isinstance(answer, str) and answer.strip():
                return Query(query.id, question.strip(), output=answer.strip(), meta=dict(query.meta))
            if data is not None:
                reason = "reply lacks a question or an answer"
            if text in replies:
                reason += ", the same reply again after a correction"
                break
            replies.append(text)
            messages = (*messages, ("assistant", text), ("user", QUESTION_CORRECTION.format(problem=reason)))
        raise QuestionDropped(f"question: {reason} ({calls} {'try' if calls == 1 else 'tries'})")


def critic_row(outcome: Outcome, item: LabelItem, label: Label) -> dict[str, Any]:
    """One critic training row: the decision's inputs and the single reflection token it should produce."""
    return {
        "id": f"{outcome.query_id}/critic-{len(outcome.critic):03d}",
        "query_id": outcome.query_id,
        "type": CRITIC_TYPE[item.kind],
        "task": item.kind,
        "instruction": item.question,
        "passage": None if item.passage is None else item.passage.to_json(),
        "output": item.output,
        "preceding": item.preceding,
        "target": label.value,
        "labeler": label.labeler,
        "model": label.model,
        "prompt_hash": label.prompt_hash,
        "source": outcome.source,
    }
