"""The single-pass Self-RAG runtime: the model's own reflection tokens drive every decision.

    rag = SelfRAG(ENGINES["hf"](model_dir="runs/smollm2-selfrag"), RETRIEVERS["bm25"](corpus="corpus.jsonl"))
    print(rag.answer("Who wrote Hamlet?").to_json())

Short form (``form=short``), per question: (1) decide: one decode from the prompt; ``p_retrieve`` from
its first position, in probabilities; below the threshold that same decode is the answer; (2) retrieve
top-k passages; every ``prompt + [Retrieval]<paragraph>…</paragraph>`` branch decodes its relevance
token first and weak branches stop there (pruning), the rest decode to their end; (3) rank them
(:mod:`selfrag.inference.policy`), and when the best is unsupported re-retrieve with a rewritten query
(passages not tried yet) up to ``max_rounds``, then abstain or flag. ``answer_many`` batches across
questions: one engine call per phase. Long form (``form=long``) is :mod:`selfrag.inference.longform`.

The rounds (retrieve, judge, re-retrieve, give up) and the answer they ship are :mod:`.rounds` and :mod:`.finish`,
shared with the prompted critic; this model's decodes and passage branches are :mod:`.branches`.

The trace is a contract: each verdict in it is reflected in what the caller receives. The cases:

* a decode is cut where the model asks for evidence the short form does not fetch (a mid-answer
  ``[Retrieval]`` in the answer after ``[No Retrieval]``): ``[Retrieval]`` and ``<paragraph>`` are stop ids
  there, so a continuation can never write its own passage; the text before the cut ships,
  ``low_confidence=true`` with the reason (``form=long`` follows such requests instead). A passage branch
  already holds its evidence: both ids are held off there, and it writes on to its verdicts;
* the best candidate judged its passage ``[Irrelevant]``: unsupported (policy), and if flagged it cites
  nothing; a candidate the policy would not ship ranks below every one it would, and a missing verdict ranks a
  candidate below every complete one (see the policy module);
* every ``abstained``/``low_confidence`` carries its reasons in ``Answer.reasons``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence

from selfrag import reflection as rf
from selfrag.errors import ConfigError
from selfrag.prompting import encode_prompt
from selfrag.retrieval import Retriever

from .answer import Answer, Candidate
from .branches import Decoding, PromptWork
from .config import InferenceConfig
from .engines.base import Engine, Generation, GenerationRequest, context_limit
from .events import StreamEvent
from .longform import LongForm
from .rounds import Rounds
from .scoring import retrieve_probability
from .trace import Decide
from .work import call, check_question

logger = logging.getLogger(__name__)

#: Bumped when the same model, settings and question are answered differently: a saved answer of an older version
#: (eval's single-pass answers, the quickstart's calibration) is answered again. What each bump changed:
#: results/runtime-versions.md.
BEHAVIOUR_VERSION = 8


class SelfRAG(Rounds[PromptWork]):
    """Answer questions with a model trained to emit reflection tokens (see the module docstring)."""

    alone_from = f"the prompt + {rf.NO_RETRIEVAL}"
    ranks_by_retrieval = True  # short form: weights.retrieval x 1/(1 + rank) joins each branch's score

    def __init__(self, engine: Engine, retriever: Retriever | None, config: InferenceConfig | None = None) -> None:
        self.engine = engine
        self.retriever = retriever
        # threshold, relevance_threshold and support_bound left unset take the model's calibrated values, carried
        # by every engine from the model's selfrag.json
        self.config = (config or InferenceConfig()).resolved(engine.calibration)
        problems = self.config.validate()
        if retriever is None and self.config.mode != "never":
            problems.append(f"mode={self.config.mode} needs a retriever; pass one, or use mode=never")
        if problems:
            raise ConfigError(problems)
        self.decoding = Decoding(engine, self.config, self.weights)

    # -- public -------------------------------------------------------------------------------------

    def answer(self, question: str, choices: Sequence[str] | None = None) -> Answer:
        """Answer one question; ``choices`` makes it a closed-set task (see :mod:`.closedset`)."""
        return self.answer_many([question], None if choices is None else [choices])[0]

    def answer_many(
        self, questions: Sequence[str], choices: Sequence[Sequence[str] | None] | None = None
    ) -> list[Answer]:
        """Answer ``questions``, one engine call per phase for all of them (long form: one question at a time)."""
        if self.config.form == "long":
            return [self._long_form(question).run_to_end() for question in questions]
        works = self._works(questions, choices)
        for _ in self.phases(works):
            pass
        return [self.finish(work) for work in works]

    def stream(self, question: str) -> Iterator[StreamEvent]:
        """Events for one question (see :mod:`selfrag.inference.events`).

        Trace entries are sent as each phase ends. Short form ranks all branches before any text is final
        (a re-retrieval round can still replace it), so its text follows the last verdict; long form sends
        each segment as soon as every surviving beam agrees on it.
        """
        for _, event in self.stream_many([question]):
            yield event

    def stream_many(self, questions: Sequence[str]) -> Iterator[tuple[int, StreamEvent]]:
        """``(question index, event)`` for several questions, with the engine calls of :meth:`answer_many`.

        Each question gets the events :meth:`stream` sends for it. Short form interleaves them phase by phase (one
        engine call per phase for all) and sends a question's text once its own last verdict is in, not when the
        slowest question of the batch is done; long form answers one question after the other.
        """
        if self.config.form == "long":
            for index, question in enumerate(questions):
                for event in self._long_form(question).events():
                    yield index, event
            return
        yield from self.stream_works(self._works(questions, None))

    def _long_form(self, question: str) -> LongForm:
        return LongForm(self.engine, self.retriever, self.config, question)

    def _no_retrieval_request(self, prompt: Sequence[int]) -> GenerationRequest:
        """The request for the answer after ``[No Retrieval]`` (see :meth:`Decoding.no_retrieval_request`)."""
        return self.decoding.no_retrieval_request(prompt)

    def _works(self, questions: Sequence[str], choices: Sequence[Sequence[str] | None] | None) -> list[PromptWork]:
        if choices is not None and len(choices) != len(questions):
            raise ValueError(
                f"choices has {len(choices)} entries for {len(questions)} questions; give one per question"
            )
        template = self.engine.prompt_template
        limit = context_limit(self.engine)
        works = []
        for index, question in enumerate(questions):
            options = None if choices is None or choices[index] is None else tuple(choices[index] or ())
            prompt = tuple(encode_prompt(self.engine.tokenizer, question, template))
            check_question(question, len(prompt), self.config.max_tokens, limit, index if len(questions) > 1 else None)
            works.append(PromptWork(question, query=question, choices=options, prompt=prompt))
        return works

    # -- the loop's steps (see :mod:`.rounds`) --------------------------------------------------------

    def decide(self, works: list[PromptWork]) -> None:
        """Adaptive: one decode from each prompt, ``p_retrieve`` from its first position (below the threshold that
        decode is the answer); always/never: no decode."""
        if self.config.mode != "adaptive":
            for work in works:
                self._fixed_decision(work)
            return
        requests = [self.decoding.decision_request(work.prompt) for work in works]
        for work, generation in zip(works, call(self.engine, requests, works), strict=True):
            self._decide(work, generation)

    def branch(self, works: list[PromptWork]) -> None:
        self.decoding.decode(works)

    def answer_alone(self, works: list[PromptWork]) -> None:
        """Decode ``prompt + [No Retrieval]``, text first, for every work answered without passages (one call)."""
        for work in works:
            work.prefix = (self.decoding.no_retrieval_id,)
        requests = [self.decoding.no_retrieval_request(work.prompt + work.prefix) for work in works]
        for work, generation in zip(works, call(self.engine, requests, works), strict=True):
            work.alone = generation

    def alone_candidate(self, work: PromptWork) -> Candidate:
        assert work.alone is not None, "the no-retrieval path always decodes"
        return self.decoding.candidate(None, work.prefix, work.alone)

    def _decide(self, work: PromptWork, generation: Generation) -> None:
        first = generation.token_ids[0] if generation.token_ids else None
        first_token = None if first is None else self.engine.token_ids.token(first)
        logprobs = generation.score_logprobs[0] if generation.score_logprobs else {}
        p_retrieve = retrieve_probability(logprobs, self.engine.token_ids)
        if p_retrieve is None:
            work.retrieve = first == self.decoding.retrieval_id
            reason = f"neither retrieve token has a log-prob; fell back to the generated first token {first_token!r}"
        else:
            work.retrieve = p_retrieve > self.config.retrieve_threshold
            relation = ">" if work.retrieve else "<="
            reason = f"p_retrieve {p_retrieve:.4f} {relation} threshold {self.config.retrieve_threshold}"
        discarded = reused = None
        rest = generation.token_ids[1:] if first == self.decoding.no_retrieval_id else generation.token_ids
        if work.retrieve and first != self.decoding.retrieval_id:
            discarded = f"the model went on with {first_token!r}; that continuation is discarded"
        elif not work.retrieve and first == self.decoding.retrieval_id:
            work.prefix = (self.decoding.no_retrieval_id,)
            discarded = f"the model emitted {rf.RETRIEVAL}; continuing once from the prompt + {rf.NO_RETRIEVAL}"
        elif not work.retrieve and not self.decoding.opens_with_text(rest):
            # The model chose [No Retrieval] and went on with another decision or verdict, not an answer (the 150-step
            # CPU model repeats [No Retrieval] on arithmetic questions): decode once more, text first.
            work.prefix = (self.decoding.no_retrieval_id,)
            went_on = self.engine.tokenizer.decode(list(rest[:3]), skip_special_tokens=False)
            discarded = (
                f"the model's own continuation has no answer text ({went_on!r}…); continuing once from the prompt + "
                f"{rf.NO_RETRIEVAL}, text first"
            )
        elif not work.retrieve:
            work.alone = generation
            reused = "the decision's own generation is the answer (no second decode)"
        work.trace.append(Decide(
            mode="adaptive",
            probabilities={
                "retrieval": _probability(logprobs.get(self.decoding.retrieval_id)),
                "no_retrieval": _probability(logprobs.get(self.decoding.no_retrieval_id)),
                "p_retrieve": p_retrieve,
            },
            threshold=self.config.retrieve_threshold,
            first_token=first_token,
            chosen="retrieve" if work.retrieve else "no_retrieval",
            reason=reason,
            discarded=discarded,
            reused=reused,
        ))

    def _fixed_decision(self, work: PromptWork) -> None:
        mode = self.config.mode
        work.retrieve = mode == "always"
        if mode == "never":
            work.prefix = (self.decoding.no_retrieval_id,)
        work.trace.append(Decide(mode=mode, chosen="retrieve" if work.retrieve else "no_retrieval",
                                 reason=f"mode={mode} skips the decision"))


def _probability(logprob: float | None) -> float | None:
    return None if logprob is None else math.exp(logprob)
