"""The fine-tuned RAG baseline's training examples: the same records, the reflection tokens stripped.

    selfrag train --config configs/train/smollm2-135m-cpu.yaml records=runs/demo-data/records.jsonl \
        output_dir=runs/smollm2-rag form=rag

The Self-RAG paper's baseline row ("Llama2-FT + retrieval") is the same base model fine-tuned on the same data without
reflection tokens, answering from its retrieved passages. Here each question's records (its gold passage and its
negatives, one record each) become **one** example: the plain-RAG prompt that ``selfrag eval``'s ``plain_rag`` and
``ft_rag`` modes ask (:data:`selfrag.prompting.PLAIN_RAG_PROMPT`) over the passages of those records, in a seeded
order, and as the target the answer the gold records give -- or the abstain sentence when none of the passages holds
it (an unanswerable question). A question answered without retrieval (``[No Retrieval]``) keeps the question alone
(:data:`selfrag.prompting.NO_RETRIEVAL_PROMPT`). Not targets: the wrong answers of support negatives
(``[No support / Contradictory]`` after a relevant passage) and any text the record marks untrained.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from selfrag import reflection as rf
from selfrag.prompting import no_retrieval_prompt, plain_rag_prompt
from selfrag.trajectory import Passage, Record, Segment

from .dataset import question_of

#: the answer when the passages do not hold one: the runtime's and the plain-RAG prompt's abstain sentence
ABSTAIN_TEXT = "The sources do not say."
#: what a converted record keeps of its question (``selfrag train`` lists it in trained-questions.json)
QUESTION_KEY = "question"


def rag_records(records: Sequence[Record], seed: int, abstain_text: str = ABSTAIN_TEXT) -> list[Record]:
    """One plain-RAG record per question of ``records`` (grouped by :func:`~selfrag.training.dataset.question_of`),
    in first-seen order; a question whose relevant passage comes with no answer to train (only a support negative's,
    or an unsupported response) is left out."""
    groups: dict[str, list[Record]] = {}
    for record in records:
        groups.setdefault(question_of(record), []).append(record)
    return [converted for key, group in groups.items()
            if (converted := _one(key, group, seed, abstain_text)) is not None]


def _one(key: str, group: Sequence[Record], seed: int, abstain_text: str) -> Record | None:
    question = group[0].instruction
    passages: list[Passage] = []
    for record in group:
        for segment in record.segments:
            if segment.passage is not None and segment.passage not in passages:
                passages.append(segment.passage)
    answer = _answer(group)
    if answer is None and any(_relevant(segment) for record in group for segment in record.segments):
        return None  # the passages hold an answer, but none that the records train
    if not passages:
        if answer is None:
            return None
        instruction = no_retrieval_prompt(question)
    else:
        random.Random(f"{seed}/{key}").shuffle(passages)  # the gold passage is not always first
        instruction = plain_rag_prompt(question, passages, abstain_text)
    first = group[0]
    meta = {"query_id": key, QUESTION_KEY: question, "form": "rag", "records": [record.id for record in group],
            **({"split": first.meta["split"]} if "split" in first.meta else {})}
    return Record(id=f"{key}/rag", instruction=instruction, segments=(Segment(text=answer or abstain_text),),
                  utility=None, source=first.source, meta=meta)


def _answer(group: Sequence[Record]) -> str | None:
    """The text a gold record trains: every segment's text where the record's passages are relevant and support it, or
    it was answered without retrieval; None when no record of the question has one."""
    for record in group:
        if record.meta.get("untrained_text"):
            continue
        segments = record.segments
        if all(_answers(segment) for segment in segments):
            text = " ".join(segment.text.strip() for segment in segments if segment.text.strip())
            if text:
                return text
    return None


def _relevant(segment: Segment) -> bool:
    return segment.relevance is not None and segment.relevance.value == rf.RELEVANT


def _answers(segment: Segment) -> bool:
    support = None if segment.support is None else segment.support.value
    supported = support in (None, rf.FULLY_SUPPORTED, rf.PARTIALLY_SUPPORTED)
    return supported and (segment.passage is None or _relevant(segment))
