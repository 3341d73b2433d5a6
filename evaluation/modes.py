"""The five modes, each answering :class:`~selfrag.evaluation.data.Example` s into per-example records.

* ``no_retrieval``: the base model, the question alone, one decode;
* ``plain_rag``: the base model, one decode over the same top-k passages with a plain prompt;
* ``ft_rag``: the fine-tuned RAG baseline (``selfrag train form=rag``: the same base and records, no reflection
  tokens), one decode over the same top-k passages with the same plain prompt;
* ``prompted``: prompted-critic Self-RAG on the base model (``selfrag.inference.prompted.PromptedSelfRAG``);
* ``single_pass``: the trained model's own reflection tokens (``selfrag.inference.runtime.SelfRAG``).

Every record holds the answer, its decisions and its cost: engine calls, prompt and generated tokens, seconds.

One judgement for every mode: a baseline abstains when its answer is the one abstain sentence its prompt asks for
(:func:`is_abstention`), single-pass and prompted Self-RAG when the runtime says so; an answer that only hedges
("I don't know", "not mentioned", ...) is an answer, judged by its text like any other, and counted as ``hedged``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from selfrag import reflection as rf
from selfrag.inference.answer import Candidate
from selfrag.inference.engines.base import GenerationRequest
from selfrag.inference.trace import Decide, Retrieve, TraceEntry
from selfrag.prompting import encode_prompt, no_retrieval_prompt, plain_rag_prompt
from selfrag.retrieval import PrecomputedRetriever, Retriever
from selfrag.trajectory import Passage

from .counting import CountingEngine
from .data import Example
from .metrics import normalize

logger = logging.getLogger(__name__)

#: Phrases of an answer that hedges instead of answering. Reported (``hedged``), never taken as an abstention: an
#: answer is judged by its text, and only the abstain sentence the prompt asks for abstains.
HEDGE_PHRASES = ("i don't know", "i do not know", "not mentioned", "does not say", "do not contain",
                 "no information", "cannot answer", "can't answer", "not provided")


class ExampleRetriever(PrecomputedRetriever):
    """Returns an example's own ``ctxs`` (in their order) for its prompt or question; otherwise searches the corpus."""

    def __init__(self, examples: Sequence[Example], corpus: Retriever | None) -> None:
        by_query: dict[str, Sequence[Passage]] = {example.prompt: example.ctxs for example in examples if example.ctxs}
        by_query.update({example.question: example.ctxs for example in examples if example.ctxs})
        super().__init__(by_query, corpus)
        self.corpus = corpus


def is_abstention(text: str, abstain_text: str) -> bool:
    """The answer is empty or says the abstain sentence (``abstain_text``, normalised) -- nothing else abstains."""
    normalized = normalize(text)
    return not normalized or normalize(abstain_text) in normalized


def is_hedged(text: str, abstain_text: str) -> bool:
    """An answer (not an abstention) holding a hedge phrase; reported beside the abstentions, judged as answered."""
    normalized = normalize(text)
    return not is_abstention(text, abstain_text) and any(normalize(phrase) in normalized for phrase in HEDGE_PHRASES)


def _base_record(example: Example) -> dict[str, Any]:
    return {
        "id": example.id,
        "question": example.question,
        "kind": example.kind,
        "gold_answers": list(example.answers),
        "choices": [list(choice) for choice in example.choices],
        "answer_key": example.answer_key,
        "metric": example.metric,
        "answerable": example.answerable,
        "needs_retrieval": example.needs_retrieval,
    }


Runner = Callable[[Sequence[Example]], list[dict[str, Any]]]


def plain_runner(
    engine: CountingEngine, retriever: Retriever | None, top_k: int, max_tokens: int, abstain_text: str, rag: bool
) -> Runner:
    """No retrieval (``rag=False``) or plain RAG: one decode per question, a plain prompt."""

    def run(batch: Sequence[Example]) -> list[dict[str, Any]]:
        hits = retriever.search_many([e.prompt for e in batch], top_k) if rag and retriever else [[] for _ in batch]
        prompts = [_plain_prompt(example, [hit.passage for hit in found], abstain_text, rag) for example, found in
                   zip(batch, hits, strict=True)]
        requests = [
            GenerationRequest(prompt_ids=tuple(encode_prompt(engine.tokenizer, p, engine.prompt_template)),
                              max_tokens=max_tokens)
            for p in prompts
        ]
        generations = engine.generate(requests)
        records = []
        for example, found, generation in zip(batch, hits, generations, strict=True):
            text = engine.tokenizer.decode(list(generation.token_ids), skip_special_tokens=True).strip()
            records.append({
                **_base_record(example),
                "answer": text,
                "abstained": is_abstention(text, abstain_text),
                "hedged": is_hedged(text, abstain_text),
                "retrieved": bool(rag and found),
                "retrieval_rounds": 1 if rag and found else 0,
                "passages": [hit.passage.to_json() for hit in found],
                "cited": [hit.passage.to_json() for hit in found],  # plain RAG cites nothing: judge on all it read
                "trace": [],
                "engine_calls": 1,  # every question of the batch is in its one call
            })
        return records

    return run


def _plain_prompt(example: Example, passages: Sequence[Passage], abstain_text: str, rag: bool) -> str:
    if not rag:
        return no_retrieval_prompt(example.prompt)
    return plain_rag_prompt(example.prompt, passages, abstain_text)


def selfrag_runner(runtime: Any) -> Runner:
    """Prompted-critic or single-pass Self-RAG: anything with ``answer_many(questions) -> [Answer]`` and a ``config``
    holding its ``abstain_text``."""

    def run(batch: Sequence[Example]) -> list[dict[str, Any]]:
        answers = runtime.answer_many([example.prompt for example in batch])
        records = []
        for example, answer in zip(batch, answers, strict=True):
            records.append({
                **_base_record(example),
                "answer": answer.answer,
                "abstained": answer.abstained,
                "hedged": not answer.abstained and is_hedged(answer.answer, runtime.config.abstain_text),
                "low_confidence": answer.low_confidence,
                "retrieved": answer.retrieved,
                "retrieval_rounds": sum(isinstance(entry, Retrieve) for entry in answer.trace),
                "passages": [c.passage.to_json() for c in answer.candidates if c.passage is not None],
                "cited": [p.to_json() for p in answer.citations],
                "p_retrieve": _p_retrieve(answer.trace),
                "well_formed": well_formed_flags(answer.candidates),
                "trace": [entry.to_dict() for entry in answer.trace],
                "trajectory": answer.trajectory,
                "engine_calls": answer.engine_calls,  # the calls holding one of this question's requests
            })
        return records

    return run


def _p_retrieve(trace: Sequence[TraceEntry]) -> float | None:
    """The first decision's p_retrieve (None: no decision read one)."""
    for entry in trace:
        if isinstance(entry, Decide) and entry.probabilities:
            value = entry.probabilities.get("p_retrieve")
            return None if value is None else float(value)
    return None


def prompted_runtime(engine: Any, retriever: Retriever | None, config: Any) -> Any:
    """The runtime's prompted-critic mode (one critic call per decision) over a model without reflection tokens."""
    from selfrag.inference.prompted import PromptedSelfRAG

    return PromptedSelfRAG(engine, retriever, config)


def answer_all(
    runner: Runner,
    engine: CountingEngine,
    examples: Sequence[Example],
    batch_size: int,
    progress: Any,
    on_batch: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Answer in batches; each record gets its share of the batch's tokens and seconds, and its engine calls: those
    that held one of its own requests (the runner's count), so the figure does not grow with the batch.

    ``on_batch`` receives each batch's records as soon as they are complete (``selfrag eval`` keeps them for a
    resume).
    """
    records: list[dict[str, Any]] = []
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        engine.reset()
        began = time.monotonic()
        answered = runner(batch)
        seconds = time.monotonic() - began
        usage = engine.reset()
        for record in answered:
            record.update({
                "engine_calls": record.get("engine_calls", usage.calls),  # a runner without a count: the batch's
                "prompt_tokens": usage.prompt_tokens / len(batch),
                "prompt_tokens_computed": usage.prompt_tokens_computed / len(batch),
                "generated_tokens": usage.generated_tokens / len(batch),
                "seconds": seconds / len(batch) if len(batch) > 1 else seconds,
            })
        records += answered
        if on_batch is not None:
            on_batch(answered)
        progress.update(len(batch))
    return records


def well_formed_flags(candidates: Sequence[Candidate]) -> list[bool]:
    """Whether each trained output parses as a trajectory. Not outputs: a branch the runtime stopped after its relevance
    token (pruning), and a branch the model itself marked ``[Irrelevant]``: the text after that verdict is masked in
    training (the runtime never ships it), so what the model writes there is not a format it was taught."""

    def is_output(candidate: Candidate) -> bool:
        judged_irrelevant = candidate.score is not None and candidate.score.relevance_token == rf.IRRELEVANT
        return not candidate.pruned and not judged_irrelevant

    return [candidate.well_formed for candidate in candidates if is_output(candidate)]
