"""LLM labelers: the teacher judges each reflection decision with the paper's instructions.

    labeler = LLMLabeler(cached_teacher, retries=2)
    result = await labeler.label(LabelItem("relevance", question, passage=passage))
    result.label  # Label("[Relevant]", labeler="llm", model=..., prompt_hash=...) or None
    result.drop   # None, or why the item was dropped ("relevance: label outside the vocabulary")

One interface for every type: ``retrieve`` (from the question alone: [Retrieval] / [No Retrieval]),
``retrieve_sentence`` (three-way, given the evidence so far: adds [Continue to Use Evidence]),
``relevance`` (IsREL), ``support`` (IsSUP, three-way) and ``utility`` (IsUSE, 1-5). Each prompt is the
paper's critic instruction and its few-shot demonstrations (:mod:`selfrag.data_gen.critic_prompts`, read from
AkariAsai/self-rag data_creation/critic/gpt4_reward/), then the item, then the request for a strict JSON reply.
A reply that is exactly one label of the vocabulary, without JSON, is taken as that label. A malformed reply or a
label outside the vocabulary is answered with a correction (the bad reply, what was wrong with it and the format
again) up to ``retries`` times — never the same prompt again, which a greedy teacher answers the same way — and
the labeler gives up at once when the teacher repeats a reply; then the item is dropped with a counted reason.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Literal

from selfrag import reflection as rf
from selfrag.data_gen.critic_prompts import DEMONSTRATIONS, INSTRUCTIONS, Demonstration
from selfrag.data_gen.teachers import ChatRequest, Teacher
from selfrag.runs import text_key
from selfrag.trajectory import Label, Passage

LABELER = "llm"
Kind = Literal["retrieve", "retrieve_sentence", "relevance", "support", "utility"]

SYSTEM = "You are a careful annotator. Follow the instruction exactly and reply with one JSON object only."

VOCABULARY: dict[str, tuple[str, ...]] = {
    "retrieve": (rf.RETRIEVAL, rf.NO_RETRIEVAL),
    "retrieve_sentence": (rf.RETRIEVAL, rf.NO_RETRIEVAL, rf.CONTINUE_EVIDENCE),
    "relevance": (rf.RELEVANT, rf.IRRELEVANT),
    "support": (rf.FULLY_SUPPORTED, rf.PARTIALLY_SUPPORTED, rf.NO_SUPPORT),
    "utility": rf.UTILITY_TOKENS,
}

CORRECTION = (
    "That reply cannot be used: {problem}. Reply again with exactly one JSON object and nothing else: "
    '{{"explanation": "<a short explanation>", "label": "<label>"}} where <label> is one of: {labels}.'
)

FORMAT = (
    "Reply with exactly one JSON object and nothing else: "
    '{{"explanation": "<a short explanation>", "label": "<label>"}} where <label> is one of: {labels}.'
)


def prompt_hash(kind: str) -> str:
    """Identifies the prompt version a label came from (instruction, demonstrations, format), recorded in every
    label."""
    text = SYSTEM + _preamble(kind) + FORMAT.format(labels=", ".join(VOCABULARY[kind]))
    return text_key(text, 16)


@dataclass(frozen=True)
class LabelItem:
    """One decision to label. ``output`` is the answer or sentence; ``preceding`` the sentences before it."""

    kind: Kind
    question: str
    passage: Passage | None = None
    output: str | None = None
    preceding: str = ""


@dataclass
class LabelResult:
    label: Label | None
    drop: str | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    replies: list[str] = field(default_factory=list)


def render_prompt(item: LabelItem) -> str:
    evidence = None if item.passage is None else item.passage.render()
    fields = _fields(item.kind, item.question, evidence, item.output, item.preceding)
    return "\n".join([_preamble(item.kind), "##", *fields, "", FORMAT.format(labels=", ".join(VOCABULARY[item.kind]))])


def _fields(kind: str, question: str, evidence: str | None, output: str | None, preceding: str) -> list[str]:
    """The item's lines, in the paper's order for its kind (support: output before evidence)."""
    lines = [f"Instruction: {question}"]
    if preceding:
        lines.append(f"Preceding sentences: {preceding}")
    evidence_line = [] if evidence is None else [f"Evidence: {evidence}"]
    output_line = [] if output is None else [f"Output: {output}"]
    return lines + (output_line + evidence_line if kind == "support" else evidence_line + output_line)


def _demonstration(kind: str, demo: Demonstration) -> str:
    reply = json.dumps({"explanation": demo.explanation, "label": demo.label}, ensure_ascii=False)
    fields = _fields(kind, demo.question, demo.evidence, demo.output, demo.preceding)
    return "\n".join(["##", *fields, f"Reply: {reply}"])


def _preamble(kind: str) -> str:
    """The instruction and the worked demonstrations, each block followed by a blank line."""
    return "\n\n".join([INSTRUCTIONS[kind], *(_demonstration(kind, demo) for demo in DEMONSTRATIONS[kind])]) + "\n"


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


_BARE = re.compile(r"""^[\s`"'*]*(.*?)[\s`"'*.]*$""", re.DOTALL)


def bare_label(text: str, kind: str) -> str | None:
    """The label when the whole reply is exactly one label of ``kind`` (``[Relevant]``, or ``Relevant`` without
    brackets), give or take quotes, backticks, bold marks and a final period; None otherwise."""
    match = _BARE.match(text)
    body = match.group(1) if match else text.strip()
    for label in VOCABULARY[kind]:
        if body in (label, label[1:-1]):
            return label
    return None


def parse_label(text: str, kind: str) -> tuple[str | None, str | None]:
    """``(label, None)`` for a well-formed reply, ``(None, reason)`` otherwise.

    Well-formed: a JSON object with a ``label`` of the vocabulary (fenced or not), or exactly one label alone.
    """
    body = _FENCE.sub("", text.strip())
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        bare = bare_label(text, kind)
        if bare is not None:
            return bare, None
        wrong = next(((name, found) for name in _other_kinds(kind) if (found := bare_label(text, name))), None)
        return None, "reply is not JSON" if wrong is None else _wrong_kind(kind, *wrong)
    if not isinstance(data, dict) or not isinstance(data.get("label"), str):
        return None, "reply has no string 'label'"
    label = data["label"].strip()
    if label not in VOCABULARY[kind]:
        other = next((name for name in _other_kinds(kind) if label in VOCABULARY[name]), None)
        return None, "label outside the vocabulary" if other is None else _wrong_kind(kind, other, label)
    return label, None


def _other_kinds(kind: str) -> list[str]:
    """The label kinds that share no label with ``kind`` (retrieve and retrieve_sentence are one group's)."""
    return [name for name, labels in VOCABULARY.items() if not set(labels) & set(VOCABULARY[kind])]


def _wrong_kind(kind: str, other: str, label: str) -> str:
    return f"wrong label kind: expected a {kind} label, got {label}, a {other} label"


def label_usable(kind: str, text: str) -> bool:
    """Whether a reply gives a label of ``kind`` (else it is not cached: a rerun asks the teacher again)."""
    return parse_label(text, kind)[0] is not None


class LLMLabeler:
    """Labels any :class:`LabelItem` with a (cached) teacher; bounded re-asks, then a counted drop."""

    name = LABELER

    def __init__(
        self, teacher: Teacher, retries: int = 2, max_tokens: int = 128, seed: int = 0, temperature: float = 0.0
    ) -> None:
        self.teacher = teacher
        self.retries = retries
        self.max_tokens = max_tokens
        self.seed = seed
        self.temperature = temperature

    async def label(self, item: LabelItem) -> LabelResult:
        labels = ", ".join(VOCABULARY[item.kind])
        messages: tuple[tuple[str, str], ...] = (("system", SYSTEM), ("user", render_prompt(item)))
        result = LabelResult(None)
        reason = ""
        for attempt in range(self.retries + 1):
            request = ChatRequest(messages, self.max_tokens, self.temperature, seed=self.seed, attempt=attempt,
                                  usable=functools.partial(label_usable, item.kind))
            reply = await self.teacher.chat(request)  # TeacherError (transport) propagates: the query is retried
            result.calls += 1
            result.prompt_tokens += reply.prompt_tokens
            result.completion_tokens += reply.completion_tokens
            value, problem = parse_label(reply.text, item.kind)
            if value is not None:
                result.label = Label(value, LABELER, self.teacher.model, prompt_hash(item.kind))
                result.replies.append(reply.text)
                return result
            reason = problem or "malformed reply"
            if reply.text.strip() in (earlier.strip() for earlier in result.replies):
                reason += ", the same reply again after a correction"
                break  # a teacher that repeats itself will not be talked round: stop paying for it
            result.replies.append(reply.text)
            correction = CORRECTION.format(problem=reason, labels=labels)
            messages = (*messages, ("assistant", reply.text), ("user", correction))
        tries = "try" if result.calls == 1 else "tries"
        result.drop = f"{item.kind}: {reason} ({result.calls} {tries})"
        return result
