"""LLM labelers: the teacher judges each reflection decision with the paper's instructions.

    labeler = LLMLabeler(cached_teacher, retries=2)
    result = await labeler.label(LabelItem("relevance", question, passage=passage))
    result.label  # Label("[Relevant]", labeler="llm", model=..., prompt_hash=...) or None
    result.drop   # None, or why the item was dropped ("relevance: label outside the vocabulary")

One interface for every type: ``retrieve`` (from the question alone: [Retrieval] / [No Retrieval]),
``retrieve_sentence`` (three-way, given the evidence so far: adds [Continue to Use Evidence]),
``relevance`` (IsREL), ``support`` (IsSUP, three-way) and ``utility`` (IsUSE, 1-5). The instructions
follow the paper's critic prompts (AkariAsai/self-rag, data_creation/critic/gpt4_reward) and ask for a
strict JSON reply; a malformed reply or a label outside the vocabulary is asked again (a new call, so
the cache does not replay it) up to ``retries`` times, then the item is dropped with a counted reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Literal

from selfrag import reflection as rf
from selfrag.data_gen.teachers import ChatRequest, Teacher
from selfrag.trajectory import Label, Passage

LABELER = "llm"
Kind = Literal["retrieve", "retrieve_sentence", "relevance", "support", "utility"]

SYSTEM = "You are a careful annotator. Follow the instruction exactly and reply with one JSON object only."

INSTRUCTIONS: dict[str, str] = {
    "retrieve": (
        "Given an instruction, decide whether finding external documents (e.g., from Wikipedia) would help to "
        "produce a better response. If the instruction needs factual knowledge, answer [Retrieval]. If it does "
        "not (e.g., writing, arithmetic, opinions, or common knowledge), answer [No Retrieval]."
    ),
    "retrieve_sentence": (
        "You will be given an instruction, evidence, an output sentence and optionally the preceding sentences "
        "of the output. Decide whether the output sentence can be verified by the evidence alone or needs more "
        "external information. There are three cases:\n"
        "- If the sentence can be verified solely with the evidence, answer [Continue to Use Evidence].\n"
        "- If the sentence needs no factual verification (e.g., it is subjective or states common facts), "
        "answer [No Retrieval].\n"
        "- If additional information is needed to verify the sentence, answer [Retrieval]."
    ),
    "relevance": (
        "Given an instruction and evidence, decide whether the evidence is relevant to the instruction and "
        "provides useful information for responding to it. Answer [Relevant] if it is relevant and useful, "
        "[Irrelevant] otherwise."
    ),
    "support": (
        "You will be given an instruction, evidence and an output (and optionally the preceding sentences of "
        "the output). Decide whether the output is supported by the evidence, on this scale:\n"
        "- [Fully supported]: all information in the output is supported by the evidence or extracted from it.\n"
        "- [Partially supported]: the output is supported by the evidence to some extent, but major "
        "information in the output is not discussed in the evidence.\n"
        "- [No support / Contradictory]: the output ignores the evidence, is unrelated to it, or contradicts "
        "it.\n"
        "Do not use outside knowledge to judge whether the output is true; only check whether the evidence "
        "supports it, not whether it follows the instruction."
    ),
    "utility": (
        "Given an instruction and an output, rate whether the response is a helpful and informative answer to "
        "the query, from 1 (lowest) to 5 (highest) (perceived utility):\n"
        "5: a complete, highly detailed and informative response that fully satisfies the information need.\n"
        "4: mostly fulfils the need, with minor possible improvements (more detail, better structure or "
        "coherence).\n"
        "3: acceptable, but major additions or improvements are needed.\n"
        "2: still addresses the main request, but is incomplete or not relevant to the query.\n"
        "1: barely on-topic or completely irrelevant.\n"
        "Answer with [Utility:1] .. [Utility:5]."
    ),
}

VOCABULARY: dict[str, tuple[str, ...]] = {
    "retrieve": (rf.RETRIEVAL, rf.NO_RETRIEVAL),
    "retrieve_sentence": (rf.RETRIEVAL, rf.NO_RETRIEVAL, rf.CONTINUE_EVIDENCE),
    "relevance": (rf.RELEVANT, rf.IRRELEVANT),
    "support": (rf.FULLY_SUPPORTED, rf.PARTIALLY_SUPPORTED, rf.NO_SUPPORT),
    "utility": rf.UTILITY_TOKENS,
}

FORMAT = (
    'Reply with exactly one JSON object and nothing else: {{"explanation": "<one sentence>", "label": "<label>"}} '
    "where <label> is one of: {labels}."
)


def prompt_hash(kind: str) -> str:
    """Identifies the prompt version a label came from (instruction + format), recorded in every label."""
    text = SYSTEM + INSTRUCTIONS[kind] + FORMAT.format(labels=", ".join(VOCABULARY[kind]))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


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
    parts = [INSTRUCTIONS[item.kind], "", f"##\nInstruction: {item.question}"]
    if item.preceding:
        parts.append(f"Preceding sentences: {item.preceding}")
    if item.passage is not None:
        parts.append(f"Evidence: {item.passage.render()}")
    if item.output is not None:
        parts.append(("Output sentence: " if item.kind == "retrieve_sentence" else "Output: ") + item.output)
    parts += ["", FORMAT.format(labels=", ".join(VOCABULARY[item.kind]))]
    return "\n".join(parts)


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_label(text: str, kind: str) -> tuple[str | None, str | None]:
    """``(label, None)`` for a well-formed reply, ``(None, reason)`` otherwise."""
    body = _FENCE.sub("", text.strip())
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None, "reply is not JSON"
    if not isinstance(data, dict) or not isinstance(data.get("label"), str):
        return None, "reply has no string 'label'"
    label = data["label"].strip()
    if label not in VOCABULARY[kind]:
        return None, "label outside the vocabulary"
    return label, None


class LLMLabeler:
    """Labels any :class:`LabelItem` with a (cached) teacher; bounded re-asks, then a counted drop."""

    name = LABELER

    def __init__(self, teacher: Teacher, retries: int = 2, max_tokens: int = 128, seed: int = 0) -> None:
        self.teacher = teacher
        self.retries = retries
        self.max_tokens = max_tokens
        self.seed = seed

    async def label(self, item: LabelItem) -> LabelResult:
        prompt = render_prompt(item)
        result = LabelResult(None)
        reason = ""
        for attempt in range(self.retries + 1):
            request = ChatRequest(
                (("system", SYSTEM), ("user", prompt)),
                self.max_tokens,
                temperature=0.0,
                seed=self.seed,
                attempt=attempt,
            )
            reply = await self.teacher.chat(request)  # TeacherError (transport) propagates: the query is retried
            result.calls += 1
            result.prompt_tokens += reply.prompt_tokens
            result.completion_tokens += reply.completion_tokens
            result.replies.append(reply.text)
            value, problem = parse_label(reply.text, item.kind)
            if value is not None:
                result.label = Label(value, LABELER, self.teacher.model, prompt_hash(item.kind))
                return result
            reason = problem or "malformed reply"
        result.drop = f"{item.kind}: {reason} ({self.retries + 1} tries)"
        return result
