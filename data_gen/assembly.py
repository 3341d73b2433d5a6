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

The recipe is a generator of steps (:class:`Recipe`: a search, a teacher call, labels of one kind), answered at once
by the :class:`Assembler` here, or stage by stage on Ray Data (:mod:`selfrag.data_gen.ray_stages`); for the same
answers both give the same :class:`Outcome`.

Every label is also a critic row (question, passage, output -> one token). An item whose labels stay
malformed is dropped with its reason; the question is dropped when a decision it cannot do without is
(its retrieve decision, a sentence's decision, every candidate passage, its utility).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from selfrag import reflection as rf
from selfrag.corpus import Query
from selfrag.data_gen.labelers import LabelItem, LabelResult, LLMLabeler
from selfrag.data_gen.teachers import ChatReply, ChatRequest, Teacher
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
    split: str | None = None  # the question's meta.split: a dev or test one goes to the held-out files

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
            **({"split": self.split} if self.split is not None else {}),
        }


class QuestionDropped(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Search:
    """A step of the recipe: the top ``k`` passages for ``query`` (answered with a list of passages)."""

    query: str
    k: int


@dataclass(frozen=True)
class Chat:
    """A step of the recipe: one free-text teacher call (answered with a :class:`ChatReply`)."""

    request: ChatRequest


@dataclass(frozen=True)
class Labels:
    """A step of the recipe: label these items, all of one kind (answered with a :class:`LabelResult` each)."""

    items: tuple[LabelItem, ...]


Step = Search | Chat | Labels
Steps = Generator[Step, Any, Outcome]


class Recipe:
    """The paper's recipe for one question as a generator of :data:`Step` s: it yields what it needs next (a search, a
    teacher call, labels) and is sent the answer. It does no I/O itself, so one recipe serves two drivers: the
    :class:`Assembler` (answers each step at once, in this process) and the Ray Data stages
    (:mod:`selfrag.data_gen.ray_stages`: each stage answers the steps of its kind, and the next stage replays the
    recipe from the answers so far). For the same answers both produce the same :class:`Outcome`."""

    def __init__(self, top_k: int = 3, seed: int = 0, retries: int = 2, temperature: float = 0.0) -> None:
        self.top_k = top_k
        self.seed = seed
        self.retries = retries
        self.temperature = temperature

    def steps(self, query: Query, seed_passage: Passage | None = None) -> Steps:
        split = query.meta.get("split")
        outcome = Outcome(query.id, str(query.meta.get("source", "")), split=None if split is None else str(split))
        try:
            if seed_passage is not None:
                query = yield from self._write_question(query, seed_passage, outcome)
            answer = query.output or (query.answers[0] if query.answers else None)
            if answer is None:
                answer = yield from self._write_answer(query, outcome)
            segments, decision = yield from self._segments(query, answer, outcome)
            item = LabelItem("utility", query.question, output=answer)
            utility = yield from self._label(outcome, item, required=True)
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

    def _segments(
        self, query: Query, answer: str, outcome: Outcome
    ) -> Generator[Step, Any, tuple[list[Segment], Label | None]]:
        first = yield from self._label(outcome, LabelItem("retrieve", query.question), required=True)
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
                decision = yield from self._label(outcome, item, required=True)
            assert decision is not None
            if decision.value == rf.RETRIEVAL:
                search = query.question if index == 0 else f"{query.question} {sentence}"
                passage, relevance, support = yield from self._choose_passage(
                    query, search, sentence, preceding, outcome
                )
                evidence = passage
                segments.append(Segment(text, decision, passage, relevance, support))
            elif decision.value == rf.CONTINUE_EVIDENCE:
                if evidence is None:  # cannot happen after a retrieving first sentence; never write a made-up label
                    raise QuestionDropped("retrieve_sentence: [Continue to Use Evidence] without evidence")
                item = LabelItem("support", query.question, evidence, sentence, preceding)
                continued = yield from self._label(outcome, item, required=True)
                segments.append(Segment(text, decision, support=continued))
            else:
                segments.append(Segment(text, decision))
        return segments, first

    def _choose_passage(
        self, query: Query, search: str, sentence: str, preceding: str, outcome: Outcome
    ) -> Generator[Step, Any, tuple[Passage, Label, Label]]:
        # a question with ctxs of its own answers every search of its sentences from them (by its question)
        search = query.question if query.ctxs else search
        hits: list[Passage] = yield Search(search, self.top_k)
        relevance = yield from self._label_many(outcome, [LabelItem("relevance", query.question, p) for p in hits])
        labelled = [(p, r) for p, r in zip(hits, relevance, strict=True) if r is not None]
        if not labelled:
            raise QuestionDropped("relevance: no candidate passage could be labelled")
        relevant = [(p, r) for p, r in labelled if r.value == rf.RELEVANT]
        if not relevant and len(labelled) < len(hits):
            # The unlabelled candidate may be the evidence: an [Irrelevant] fallback would teach a verdict about
            # the evidence that the teacher never gave.
            raise QuestionDropped("relevance: a candidate's label was dropped and no labelled candidate is relevant")
        relevant = relevant or labelled[:1]
        supports = yield from self._label_many(
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

    def _label(self, outcome: Outcome, item: LabelItem, required: bool = False) -> Generator[Step, Any, Label | None]:
        return (yield from self._label_many(outcome, [item], required))[0]

    def _label_many(
        self, outcome: Outcome, items: list[LabelItem], required: bool = False
    ) -> Generator[Step, Any, list[Label | None]]:
        """Label items (concurrently, in either driver); book the results in the items' order, so output never
        depends on timing."""
        results: list[LabelResult] = (yield Labels(tuple(items))) if items else []
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

    def _ask(
        self, outcome: Outcome, messages: tuple[tuple[str, str], ...], attempt: int = 0,
        usable: Callable[[str], bool] | None = None,
    ) -> Generator[Step, Any, str]:
        request = ChatRequest(messages, 256, self.temperature, seed=self.seed, attempt=attempt, usable=usable)
        reply: ChatReply = yield Chat(request)
        outcome.calls += 1
        outcome.prompt_tokens += reply.prompt_tokens
        outcome.completion_tokens += reply.completion_tokens
        return reply.text.strip()

    def _write_answer(self, query: Query, outcome: Outcome) -> Generator[Step, Any, str]:
        hits: list[Passage] = yield Search(query.question, self.top_k)
        evidence = "\n".join(f"Evidence: {passage.render()}" for passage in hits)
        messages: tuple[tuple[str, str], ...] = (
            ("user", ANSWER_PROMPT.format(evidence=evidence, question=query.question)),
        )
        for attempt in range(self.retries + 1):
            text = yield from self._ask(outcome, messages, attempt, answer_usable)
            if text:
                return text
            messages = (*messages, ("assistant", text), ("user", ANSWER_CORRECTION))
        raise QuestionDropped("answer: the teacher wrote no answer")

    def _write_question(self, query: Query, passage: Passage, outcome: Outcome) -> Generator[Step, Any, Query]:
        messages: tuple[tuple[str, str], ...] = (("user", QUESTION_PROMPT.format(passage=passage.render())),)
        replies: list[str] = []
        reason = "reply is not JSON"
        calls = 0
        for attempt in range(self.retries + 1):
            text = yield from self._ask(outcome, messages, attempt, question_usable)
            calls += 1
            written, reason = parse_question(text)
            if written is not None:
                return Query(query.id, written[0], output=written[1], meta=dict(query.meta))
            if text in replies:
                reason += ", the same reply again after a correction"
                break
            replies.append(text)
            messages = (*messages, ("assistant", text), ("user", QUESTION_CORRECTION.format(problem=reason)))
        raise QuestionDropped(f"question: {reason} ({calls} {'try' if calls == 1 else 'tries'})")


def parse_question(text: str) -> tuple[tuple[str, str] | None, str]:
    """A teacher-written ``{"question", "answer"}`` reply as ``((question, answer), "")``, or ``(None, reason)``."""
    try:
        data = json.loads(text.strip().removeprefix("```json").removeprefix("```").removesuffix("```"))
    except json.JSONDecodeError:
        return None, "reply is not JSON"
    question, answer = (data.get(k) if isinstance(data, dict) else None for k in ("question", "answer"))
    if isinstance(question, str) and question.strip() and isinstance(answer, str) and answer.strip():
        return (question.strip(), answer.strip()), ""
    return None, "reply lacks a question or an answer"


def question_usable(text: str) -> bool:
    """Whether a question-writing reply can be used (else it is not cached: a rerun asks again)."""
    return parse_question(text)[0] is not None


def answer_usable(text: str) -> bool:
    """Whether an answer-writing reply can be used (else it is not cached: a rerun asks again)."""
    return bool(text.strip())


class Assembler:
    """The recipe driven in this process: every step answered at once (labels of one step concurrently)."""

    def __init__(
        self, teacher: Teacher, labeler: LLMLabeler, retriever: Retriever, top_k: int = 3, seed: int = 0
    ) -> None:
        self.teacher = teacher
        self.labeler = labeler
        self.retriever = retriever
        self.searcher = BatchedSearcher(retriever)  # off the event loop, many questions' searches in one batch
        self.recipe = Recipe(top_k, seed, labeler.retries, labeler.temperature)

    async def assemble(self, query: Query, seed_passage: Passage | None = None) -> Outcome:
        steps = self.recipe.steps(query, seed_passage)
        answer: Any = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
            answer = await self.answer(step)

    async def answer(self, step: Step) -> Any:
        """What the recipe asked for: the passages of a search, a teacher's reply, or one result per label item."""
        if isinstance(step, Search):
            return [hit.passage for hit in await self.searcher.search(step.query, step.k)]
        if isinstance(step, Chat):
            return await self.teacher.chat(step.request)
        return list(await asyncio.gather(*(self.labeler.label(item) for item in step.items)))


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
