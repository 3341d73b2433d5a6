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

The trace is a contract: each verdict in it is reflected in what the caller receives. The cases:

* a decode is cut where the model asks for evidence the short form does not fetch (a mid-answer
  ``[Retrieval]``, or a ``[Retrieval]``/``<paragraph>`` after the passage): ``[Retrieval]`` and
  ``<paragraph>`` are stop ids, so a continuation can never write its own passage; the text before the
  cut ships, ``low_confidence=true`` with the reason (``form=long`` follows such requests instead);
* the best candidate judged its passage ``[Irrelevant]``: unsupported (policy), and if flagged it cites
  nothing; a missing verdict ranks a candidate below every complete one (see the policy module);
* every ``abstained``/``low_confidence`` carries its reasons in ``Answer.reasons``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from selfrag import reflection as rf
from selfrag.errors import ConfigError, InputError
from selfrag.prompting import encode_prompt, passage_ids
from selfrag.reflection import Group
from selfrag.retrieval import Hit, Retriever
from selfrag.trajectory import Passage, lex_ids, parse_trajectory

from . import closedset, policy
from .answer import Answer, AnswerSegment, Candidate, shorten
from .config import InferenceConfig
from .engines.base import Engine, Generation, GenerationRequest, concat_generations, context_limit, context_problem
from .events import StreamEvent, TraceEvent, final_events
from .scoring import (
    RelevanceVerdict,
    relevance_entry,
    relevance_verdict,
    retrieve_probability,
    score_continuation,
)

logger = logging.getLogger(__name__)


@dataclass
class _Work:
    """One question's state between the batched phases."""

    question: str
    prompt: tuple[int, ...]
    choices: tuple[str, ...] | None = None
    trace: list[dict[str, Any]] = field(default_factory=list)
    engine_calls: int = 0
    generated_tokens: int = 0
    retrieve: bool = False
    answer_generation: Generation | None = None  # the decision's own decode, reused as the answer
    prefix: tuple[int, ...] = ()  # ids forced after the prompt on the no-retrieval path
    query: str = ""
    round: int = 0
    seen: set[str] = field(default_factory=set)
    hits: list[Hit] = field(default_factory=list)  # this round's passages
    candidates: list[Candidate] = field(default_factory=list)  # every round's
    outcome: tuple[str, int, str] | None = None  # (accept | abstain | flag, candidate index, reason)


#: Bumped when the same model, settings and question are answered differently (a saved answer of an older version is
#: not this runtime's): 2 = the answer after [No Retrieval] is decoded text first (banned decisions and verdicts,
#: stops held back one id); 3 = the same for long-form segments after [No Retrieval] (verdicts and passage markup
#: banned, the segment's stops held back one id); 4 = where the model chose [No Retrieval] itself and its own decode
#: went on without answer text, the answer is decoded once more, text first (it was an abstain). `selfrag eval`'s
#: single-pass answers and the quickstart's calibration stage are fingerprinted with it. 5 = a passage branch that
#: judged its passage [Relevant] and wrote no answer text is decoded once more from [Relevant], text first.
BEHAVIOUR_VERSION = 5


class SelfRAG:
    """Answer questions with a model trained to emit reflection tokens (see the module docstring)."""

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
        ids = engine.token_ids
        self._utility_ids = ids.ids(Group.UTILITY)
        self._retrieval_id = ids.id(rf.RETRIEVAL)
        self._no_retrieval_id = ids.id(rf.NO_RETRIEVAL)
        self._paragraph_id = ids.id(rf.PARAGRAPH_OPEN)
        # after [No Retrieval] a trajectory is `{answer}[Utility:k]`: no other decision, verdict or passage markup
        self._after_no_retrieval_banned = tuple(
            i for i in ids.all_ids if i not in (*self._utility_ids, self._retrieval_id, self._paragraph_id)
        )

    @property
    def weights(self) -> dict[str, float]:
        return {name: getattr(self.config.weights, name) for name in ("relevance", "support", "utility")}

    # -- public -------------------------------------------------------------------------------------

    def answer(self, question: str, choices: Sequence[str] | None = None) -> Answer:
        """Answer one question; ``choices`` makes it a closed-set task (see :mod:`.closedset`)."""
        return self.answer_many([question], None if choices is None else [choices])[0]

    def answer_many(
        self, questions: Sequence[str], choices: Sequence[Sequence[str] | None] | None = None
    ) -> list[Answer]:
        """Answer ``questions``, one engine call per phase for all of them (long form: one question at a time)."""
        if self.config.form == "long":
            from .longform import LongForm

            return [LongForm(self, question).run_to_end() for question in questions]
        works = self._works(questions, choices)
        for _ in self._phases(works):
            pass
        return [self._finish(work) for work in works]

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
            from .longform import LongForm

            for index, question in enumerate(questions):
                for event in LongForm(self, question).events():
                    yield index, event
            return
        works = self._works(questions, None)
        pending = dict.fromkeys(range(len(works)), 0)  # question index -> its trace entries sent (until answered)
        for _ in self._phases(works):
            for index in list(pending):
                yield from self._progress(index, works[index], pending, _settled(works[index]))
        for index in list(pending):
            yield from self._progress(index, works[index], pending, True)

    def _progress(
        self, index: int, work: _Work, pending: dict[int, int], final: bool
    ) -> Iterator[tuple[int, StreamEvent]]:
        """The work's trace entries not sent yet; when ``final``, those and its answer's events (then it is done)."""
        sent = pending[index]
        if not final:
            for entry in work.trace[sent:]:
                yield index, TraceEvent(dict(entry))
            pending[index] = len(work.trace)
            return
        del pending[index]
        answer = self._finish(work)
        for event in final_events(answer, answer.trace[sent:], closed_set=bool(work.choices)):
            yield index, event

    # -- phases -------------------------------------------------------------------------------------

    def _works(self, questions: Sequence[str], choices: Sequence[Sequence[str] | None] | None) -> list[_Work]:
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
            works.append(_Work(question, prompt, options, query=question))
        return works

    def _phases(self, works: list[_Work]) -> Iterator[None]:
        """Run the batched phases; yields after each so :meth:`stream` can send the new trace entries."""
        adaptive = [work for work in works if self.config.mode == "adaptive"]
        decisions = self._call([self._decision_request(work.prompt) for work in adaptive], adaptive)
        for work, generation in zip(adaptive, decisions, strict=True):
            self._decide(work, generation)
        for work in works:
            if self.config.mode != "adaptive":
                self._fixed_decision(work)
        yield
        active = self._retrieve([work for work in works if work.retrieve])
        forced = [work for work in works if not work.retrieve and work.answer_generation is None]
        results = self._call(
            [self._no_retrieval_request(work.prompt + work.prefix) for work in forced], forced
        )
        for work, generation in zip(forced, results, strict=True):
            work.answer_generation = generation
        yield
        while active:
            self._decode_branches(active)
            again = [work for work in active if self._judge_round(work)]
            self._answer_without_passages([w for w in active if w.outcome and w.outcome[0] == "no_retrieval"])
            yield
            active = self._retrieve(again)

    def _answer_without_passages(self, works: Sequence[_Work]) -> None:
        """Decode ``prompt + [No Retrieval]`` for works whose every passage was judged irrelevant (one call)."""
        for work in works:
            work.prefix = (self._no_retrieval_id,)
        results = self._call(
            [self._no_retrieval_request(work.prompt + work.prefix) for work in works], works
        )
        for work, generation in zip(works, results, strict=True):
            work.answer_generation = generation

    # -- requests -----------------------------------------------------------------------------------

    def _stop_ids(self) -> tuple[int, ...]:
        # [Retrieval] and <paragraph> stop every decode: a continuation never writes its own evidence.
        return (self._retrieval_id, self._paragraph_id, *self._utility_ids)

    def _decision_request(self, prompt: tuple[int, ...]) -> GenerationRequest:
        return GenerationRequest(
            prompt_ids=prompt,
            max_tokens=self.config.max_tokens,
            stop_token_ids=self._stop_ids(),
            score_token_ids=self.engine.token_ids.all_ids,
            keep_prefix=True,  # every passage branch extends the question: an engine that keeps KV prefills it once
        )

    def _continuation_request(self, prompt: Sequence[int], max_tokens: int) -> GenerationRequest:
        return GenerationRequest(
            prompt_ids=tuple(prompt),
            max_tokens=max_tokens,
            stop_token_ids=self._stop_ids(),
            score_token_ids=self.engine.token_ids.all_ids,
        )

    def _no_retrieval_request(self, prompt: Sequence[int]) -> GenerationRequest:
        """The answer after ``[No Retrieval]`` (forced by the threshold, mode=never, no passage found, or every
        passage judged irrelevant): text first, never another decision or verdict. A model that wanted to retrieve
        and was held to ``[No Retrieval]`` otherwise repeats ``[No Retrieval]`` or stops at ``[Retrieval]`` and
        writes no answer at all (the 150-step CPU model did on arithmetic questions)."""
        request = self._continuation_request(prompt, self.config.max_tokens)
        if not prompt or prompt[-1] != self._no_retrieval_id:
            return request
        return replace(request, banned_token_ids=self._after_no_retrieval_banned, min_tokens=1)

    def _call(self, requests: list[GenerationRequest], works: Sequence[Any]) -> list[Generation]:
        if not requests:
            return []
        generations = self.engine.generate(requests)
        if len(generations) != len(requests):
            raise RuntimeError(f"{self.engine.name} returned {len(generations)} generations for {len(requests)}")
        for work in {id(work): work for work in works}.values():
            work.engine_calls += 1
        for work, generation in zip(works, generations, strict=True):  # works[i] asked for requests[i]
            work.generated_tokens += len(generation.token_ids)
        return generations

    # -- (1) decide ---------------------------------------------------------------------------------

    def _decide(self, work: _Work, generation: Generation) -> None:
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
            "threshold": self.config.retrieve_threshold,
            "first_token": first_token,
        }
        if p_retrieve is None:
            work.retrieve = first == self._retrieval_id
            step["reason"] = (
                f"neither retrieve token has a log-prob; fell back to the generated first token {first_token!r}"
            )
        else:
            work.retrieve = p_retrieve > self.config.retrieve_threshold
            relation = ">" if work.retrieve else "<="
            step["reason"] = f"p_retrieve {p_retrieve:.4f} {relation} threshold {self.config.retrieve_threshold}"
        step["chosen"] = "retrieve" if work.retrieve else "no_retrieval"
        rest = generation.token_ids[1:] if first == self._no_retrieval_id else generation.token_ids
        if work.retrieve and first != self._retrieval_id:
            step["discarded"] = f"the model went on with {first_token!r}; that continuation is discarded"
        elif not work.retrieve and first == self._retrieval_id:
            work.prefix = (self._no_retrieval_id,)
            step["discarded"] = f"the model emitted {rf.RETRIEVAL}; continuing once from the prompt + {rf.NO_RETRIEVAL}"
        elif not work.retrieve and not self._opens_with_text(rest):
            # The model chose [No Retrieval] and went on with another decision or verdict, not an answer (the 150-step
            # CPU model repeats [No Retrieval] on arithmetic questions): decode once more, text first.
            work.prefix = (self._no_retrieval_id,)
            went_on = self.engine.tokenizer.decode(list(rest[:3]), skip_special_tokens=False)
            step["discarded"] = (
                f"the model's own continuation has no answer text ({went_on!r}…); continuing once from the prompt + "
                f"{rf.NO_RETRIEVAL}, text first"
            )
        elif not work.retrieve:
            work.answer_generation = generation
            step["reused"] = "the decision's own generation is the answer (no second decode)"
        work.trace.append(step)

    def _opens_with_text(self, ids: Sequence[int]) -> bool:
        """Whether ``ids`` start with answer text: more than whitespace (or an end-of-sequence id) before the first
        reflection id."""
        tokenizer = self.engine.tokenizer
        pieces = lex_ids(ids, self.engine.token_ids, lambda run: tokenizer.decode(run, skip_special_tokens=True))
        return bool(pieces) and not pieces[0][1] and bool(pieces[0][0].strip())

    def _fixed_decision(self, work: _Work) -> None:
        mode = self.config.mode
        work.retrieve = mode == "always"
        if mode == "never":
            work.prefix = (self._no_retrieval_id,)
        work.trace.append(
            {
                "step": "decide",
                "mode": mode,
                "probabilities": None,
                "chosen": "retrieve" if work.retrieve else "no_retrieval",
                "reason": f"mode={mode} skips the decision",
            }
        )

    # -- (2) retrieve and decode the branches -------------------------------------------------------

    def _retrieve(self, works: Sequence[_Work]) -> list[_Work]:
        """Search for each work's query; keep passages not tried yet. Returns the works with new passages."""
        if not works or self.retriever is None:
            return []
        k = self.config.top_k
        results = self.retriever.search_many([work.query for work in works], k + max(len(w.seen) for w in works))
        found = []
        for work, hits in zip(works, results, strict=True):
            work.hits = [hit for hit in hits if hit.passage.id not in work.seen][:k]
            work.seen.update(hit.passage.id for hit in work.hits)
            entry: dict[str, Any] = {
                "step": "retrieve",
                "round": work.round,
                "query": work.query,
                "chosen": [hit.passage.id for hit in work.hits],
                "scores": [hit.score for hit in work.hits],
                "reason": f"top {k} passages for the question"
                if work.round == 0
                else f"top {k} passages not tried yet for the rewritten query",
            }
            work.trace.append(entry)
            if work.hits:
                found.append(work)
            elif work.round == 0:
                work.retrieve, work.prefix = False, (self._no_retrieval_id,)
                entry["reason"] = f"the retriever found nothing; answering from the prompt + {rf.NO_RETRIEVAL}"
            else:
                entry["reason"] = "the rewritten query found no passage not tried yet"
                self._give_up(work, "re-retrieval found no new passage")
        return found

    def _decode_branches(self, works: Sequence[_Work]) -> None:
        """Decode every passage branch of ``works`` and append the candidates.

        With pruning (the default): the relevance token of every branch first (its verdict read at
        ``relevance_threshold``, weak branches stopped), then the rest of each survivor from that verdict. Without:
        every branch whole in one call, and again from the verdict only where the verdict differs from the token the
        model generated.
        """
        tokenizer, ids = self.engine.tokenizer, self.engine.token_ids
        branches = [
            (work, hit, work.prompt + tuple(passage_ids(tokenizer, ids, hit.passage)))
            for work in works
            for hit in work.hits
        ]
        owners = [work for work, _, _ in branches]
        max_tokens = self.config.max_tokens
        pruning = self.config.pruning.enabled and max_tokens > 1
        whole = self._call(
            [replace(self._continuation_request(p, 1 if pruning else max_tokens), keep_prefix=pruning)
             for _, _, p in branches],
            owners,
        )
        verdicts = self._relevance(works, branches, whole)
        first = [verdict.generation for verdict in verdicts]  # a whole decode unless its verdict was overridden
        scores = [verdict.score for verdict in verdicts]
        pruned = self._prune(works, branches, scores) if pruning else [False] * len(branches)
        # continue from the verdict: every survivor of the pruning step; without pruning only an overridden branch
        rest = [
            i
            for i, g in enumerate(first)
            if max_tokens > 1
            and not pruned[i]
            and g.finish_reason == "length"
            and (pruning or verdicts[i].overridden)
        ]
        more = self._call(
            [self._continuation_request(branches[i][2] + first[i].token_ids, max_tokens - 1) for i in rest],
            [owners[i] for i in rest],
        )
        generations = list(first)
        for i, generation in zip(rest, more, strict=True):
            generations[i] = concat_generations(first[i], generation)
        prefixes = [tuple(passage_ids(tokenizer, ids, hit.passage)) for _, hit, _ in branches]
        candidates = [
            replace(self._candidate(hit.passage, prefix, generation), pruned=was_pruned, round=work.round)
            for (work, hit, _), prefix, generation, was_pruned in zip(
                branches, prefixes, generations, pruned, strict=True
            )
        ]
        again = [i for i, candidate in enumerate(candidates) if self._relevant_without_text(candidate, generations[i])]
        for i, generation in zip(again, self._text_first([branches[i] for i in again]), strict=True):
            retried = self._candidate(branches[i][1].passage, prefixes[i], concat_generations(
                _head(generations[i], rf.RELEVANT), generation))
            candidates[i] = replace(retried, round=candidates[i].round, retried=candidates[i].generated)
        for (work, _, _), candidate in zip(branches, candidates, strict=True):
            work.candidates.append(candidate)

    def _relevant_without_text(self, candidate: Candidate, generation: Generation) -> bool:
        """A branch that judged its passage [Relevant] and then wrote no answer text (the 150-step CPU model often
        stops right after the verdict on the gold passage): it earns one more decode, text first."""
        score = candidate.score
        return (
            not candidate.pruned
            and self.config.max_tokens > 2
            and score is not None
            and score.relevance_token == rf.RELEVANT
            and bool(generation.token_ids)
            and generation.token_ids[0] == self.engine.token_ids.id(rf.RELEVANT)
            and not candidate.answer.strip()
        )

    def _text_first(self, branches: list[Any]) -> list[Generation]:
        """Decode ``prompt + passage + [Relevant]`` once more: its first id must be text (no reflection id, no
        stop, no end), the rest as the model goes on (its support and utility verdicts). Two calls for all."""
        relevant = (self.engine.token_ids.id(rf.RELEVANT),)
        owners = [work for work, _, _ in branches]
        for work in {id(work): work for work in owners}.values():
            mine = [hit.passage.id for owner, hit, _ in branches if owner is work]
            work.trace.append({
                "step": "retry",
                "round": work.round,
                "chosen": mine,
                "reason": f"{len(mine)} branch(es) judged the passage {rf.RELEVANT} and wrote no answer text; "
                f"decoded once more from {rf.RELEVANT}, text first",
            })
        opening = self._call([
            replace(self._continuation_request(prompt + relevant, 1),
                    banned_token_ids=self._after_no_retrieval_banned, min_tokens=1)
            for _, _, prompt in branches
        ], owners)
        rest = self._call([
            self._continuation_request(prompt + relevant + text.token_ids, self.config.max_tokens - 2)
            for (_, _, prompt), text in zip(branches, opening, strict=True)
        ], owners)
        return [concat_generations(text, more) for text, more in zip(opening, rest, strict=True)]

    def _relevance(
        self, works: Sequence[_Work], branches: list[Any], first: list[Generation]
    ) -> list[RelevanceVerdict]:
        """Each branch's relevance verdict read at ``relevance_threshold`` (see :func:`relevance_verdict`)."""
        threshold = self.config.relevance_cut
        verdicts = [relevance_verdict(g, self.engine.token_ids, threshold) for g in first]
        for work in works:
            mine = [i for i, branch in enumerate(branches) if branch[0] is work]
            if mine:
                passages = [branches[i][1].passage.id for i in mine]
                entry = relevance_entry(passages, [verdicts[i] for i in mine], threshold)
                work.trace.append(entry | {"round": work.round})
        return verdicts

    def _prune(self, works: Sequence[_Work], branches: list[Any], relevance: list[float | None]) -> list[bool]:
        """Which branches stop after their relevance token (their scores, read once by :meth:`_relevance`)."""
        pruning = self.config.pruning
        pruned = [False] * len(branches)
        for work in works:
            mine = [i for i, branch in enumerate(branches) if branch[0] is work]
            values: dict[int, float] = {i: value for i in mine if (value := relevance[i]) is not None}
            if not values:
                continue
            best = max(values.values())
            stopped = []
            for i, value in values.items():
                if value < pruning.relevance_bound or best - value > pruning.margin:
                    pruned[i] = True
                    stopped.append({"passage_id": branches[i][1].passage.id, "relevance": value})
            work.trace.append(
                {
                    "step": "prune",
                    "round": work.round,
                    "relevance_bound": pruning.relevance_bound,
                    "margin": pruning.margin,
                    "relevance": {branches[i][1].passage.id: relevance[i] for i in mine},
                    "chosen": [entry["passage_id"] for entry in stopped],
                    "reason": f"{len(stopped)} of {len(mine)} branches stopped after their relevance token "
                    f"(below {pruning.relevance_bound} or more than {pruning.margin} behind the best {best:.4f})",
                }
            )
        return pruned

    # -- (3) rank, judge, policy --------------------------------------------------------------------

    def _judge_round(self, work: _Work) -> bool:
        """Rank this round's candidates; returns True when the work should re-retrieve."""
        indices = [i for i, c in enumerate(work.candidates) if c.round == work.round]
        if work.choices is not None:
            best, entry = closedset.vote(work.candidates, indices, work.choices)
        else:
            best, entry = policy.rank(work.candidates, indices, self.weights)
        entry["round"] = work.round
        work.trace.append(entry)
        chosen = work.candidates[best]
        if self.config.on_all_irrelevant == "no_retrieval" and policy.all_irrelevant(work.candidates):
            reason = f"the model judged all {len(work.candidates)} retrieved passages {rf.IRRELEVANT}"
            work.outcome = ("no_retrieval", best, reason)
            work.trace.append(
                self._support_entry(chosen, "answer_without_retrieval", reason, work.round)
                | {"why": f"on_all_irrelevant=no_retrieval: the answer comes from the prompt + {rf.NO_RETRIEVAL}"}
            )
            return False
        supported, reason = policy.judge(chosen, self.config)
        if supported:
            work.outcome = ("accept", best, reason)
            work.trace.append(self._support_entry(chosen, "accept", reason, work.round))
            return False
        if work.round < self.config.max_rounds:
            work.round += 1
            work.query = policy.rewrite_query(self.config, work.question, chosen.answer)
            work.trace.append(
                self._support_entry(chosen, "re-retrieve", reason, work.round - 1) | {"query": work.query}
            )
            return True
        work.trace.append(self._support_entry(chosen, "rounds exhausted", reason, work.round))
        self._give_up(work, reason)
        return False

    def _give_up(self, work: _Work, why: str) -> None:
        """After the last round: abstain, or flag the best candidate of every round (traced as the one used)."""
        everyone = list(range(len(work.candidates)))
        action = self.config.on_unsupported
        if action == "flag":
            # a flag ships text: the best candidate that has some (a pruned or empty branch has none), else abstain
            shippable = [i for i in everyone if policy.shipped_segments(work.candidates[i], self.config)[0]]
            if shippable:
                everyone = shippable
            else:
                action = "abstain"
                why += "; on_unsupported=flag, but no candidate wrote answer text to ship, so it abstains"
                if policy.all_irrelevant(work.candidates):
                    why += " (on_all_irrelevant=no_retrieval answers without the passages instead)"
        best = max(everyone, key=lambda i: (policy.rank_key(work.candidates[i]), -i))
        _, reason = policy.judge(work.candidates[best], self.config)
        entry = self._support_entry(work.candidates[best], action, reason, work.candidates[best].round)
        entry["why"] = f"best of all {work.round + 1} rounds; {why}"
        work.trace.append(entry)
        work.outcome = (action, best, reason if why == reason else f"{reason}; {why}")

    def _support_entry(self, chosen: Candidate, action: str, reason: str, round_: int) -> dict[str, Any]:
        score = chosen.score
        return {
            "step": "support",
            "round": round_,
            "passage_id": policy.passage_id(chosen),
            "verdict": score.support_token if score else None,
            "relevance_verdict": score.relevance_token if score else None,
            "probabilities": {"support": score.support if score else None},
            "support_bound": self.config.support_floor,
            "chosen": action,
            "reason": reason,
        }

    def _candidate(self, passage: Passage | None, prefix: Sequence[int], generation: Generation) -> Candidate:
        """Parse ``prefix + generated`` (ids are authoritative; a final stop/eos id is dropped) and score it."""
        generated = list(generation.token_ids)
        truncated = None
        if generation.finish_reason == "eos":
            generated = generated[:-1]  # eos is not text
        elif generation.finish_reason == "stop" and generated[-1] in (self._retrieval_id, self._paragraph_id):
            cut = self.engine.token_ids.token(generated[-1])
            generated = generated[:-1]
            if any(token_id not in self.engine.token_ids.all_ids for token_id in generated):
                truncated = (
                    f"the model asked for more evidence ({cut}) mid-answer; the short form stops the answer there"
                )
        tokenizer = self.engine.tokenizer
        pieces = lex_ids(
            [*prefix, *generated], self.engine.token_ids, lambda run: tokenizer.decode(run, skip_special_tokens=False)
        )
        trajectory = parse_trajectory(pieces)
        score = None
        if passage is not None:
            score = score_continuation(generated, generation.score_logprobs, self.engine.token_ids, self.weights)
        return Candidate(
            passage=passage,
            trajectory="".join(content for content, _ in pieces),
            answer=trajectory.answer,
            well_formed=trajectory.well_formed and truncated is None,
            problems=trajectory.problems + ((truncated,) if truncated else ()),
            score=score,
            finish_reason=generation.finish_reason,
            truncated=truncated,
            parsed=trajectory,
            generated=generation.text,
        )

    # -- the answer ---------------------------------------------------------------------------------

    def _finish(self, work: _Work) -> Answer:
        if not work.retrieve or (work.outcome is not None and work.outcome[0] == "no_retrieval"):
            return self._finish_without_retrieval(work)
        assert work.outcome is not None, "every retrieving question ends with an outcome"
        action, best, _ = work.outcome
        chosen = work.candidates[best]
        reasons = (
            [] if action == "accept" else [f"{'abstained' if action == 'abstain' else 'flagged'}: {work.outcome[2]}"]
        )
        if action == "abstain":
            return self._answer(work, self.config.abstain_text, best, [], reasons, abstained=True)
        cite = not (chosen.score is not None and chosen.score.relevance_token == rf.IRRELEVANT)
        segments, notes = policy.shipped_segments(chosen, self.config, cite=cite)
        if chosen.truncated:
            reasons.append(f"truncated: {chosen.truncated}")
        if notes:
            work.trace.append({"step": "partial", "chosen": self.config.on_partial, "reason": "; ".join(notes)})
        if not segments:
            left = "after on_partial=drop" if notes else "in the chosen continuation"
            reasons.append(f"abstained: no sentence is left {left}")
            work.trace.append({"step": "abstain", "chosen": "abstain", "reason": f"no sentence is left {left}"})
            return self._answer(work, self.config.abstain_text, best, [], reasons, abstained=True)
        text = join_or_choice(work, segments)
        return self._answer(work, text, best, segments, reasons, low_confidence=bool(reasons))

    def _finish_without_retrieval(self, work: _Work) -> Answer:
        generation = work.answer_generation
        assert generation is not None, "the no-retrieval path always decodes"
        candidate = self._candidate(None, work.prefix, generation)
        work.candidates.append(candidate)  # after the irrelevant passages' candidates, where there were any
        chosen = len(work.candidates) - 1
        step: dict[str, Any] = {
            "step": "generate",
            "chosen": "answer_without_retrieval",
            "reason": "no passage was used; there is no relevance or support verdict to apply",
            "well_formed": candidate.well_formed,
            "problems": list(candidate.problems),
            "generated": shorten(candidate.generated),
        }
        reasons = []
        if work.outcome is not None:  # on_all_irrelevant=no_retrieval: retrieved, every passage judged irrelevant
            reasons.append(f"flagged: {work.outcome[2]}; answered without sources")
        if candidate.truncated:
            step["truncated"] = candidate.truncated
            reasons.append(f"truncated: {candidate.truncated}")
        if not candidate.answer.strip():
            # e.g. a model that wanted to retrieve, held to [No Retrieval] by the threshold, repeating [No Retrieval]:
            # an empty answer is never shipped as a confident one
            step["abstain"] = "the continuation has no answer text"
            work.trace.append(step)
            why = "; ".join(candidate.problems) or "no text between its reflection tokens"
            reasons.append(f"abstained: the model wrote no answer without retrieval ({why})")
            return self._answer(work, self.config.abstain_text, chosen, [], reasons, abstained=True)
        work.trace.append(step)
        segments = [AnswerSegment(candidate.answer, None, None)]
        if work.choices is not None:
            choice = closedset.match(candidate.answer, work.choices)
            work.trace.append(closedset.no_retrieval_entry(candidate.answer, choice))
            if choice is None:
                reasons.append("closed set: the answer matches none of the choices")
        text = join_or_choice(work, segments)
        return self._answer(work, text, chosen, segments, reasons, low_confidence=bool(reasons))

    def _answer(
        self,
        work: _Work,
        text: str,
        chosen: int,
        segments: Sequence[AnswerSegment],
        reasons: list[str],
        low_confidence: bool = False,
        abstained: bool = False,
    ) -> Answer:
        return Answer(
            question=work.question,
            answer=text,
            citations=policy.citations(segments),
            retrieved=work.retrieve,
            abstained=abstained,
            low_confidence=low_confidence and not abstained,
            trace=tuple(work.trace),
            trajectory=work.candidates[chosen].trajectory,
            candidates=tuple(work.candidates),
            chosen=chosen,
            engine_calls=work.engine_calls,
            generated_tokens=work.generated_tokens,
            segments=tuple(segments),
            reasons=tuple(reasons),
        )


def _head(generation: Generation, text: str) -> Generation:
    """The generation's first position only (a branch's relevance verdict, ``text``), to be continued from."""
    return replace(
        generation,
        token_ids=generation.token_ids[:1],
        text=text,
        score_logprobs=generation.score_logprobs[:1],
        finish_reason="length",
        score_bounds=generation.score_bounds[:1],
    )


def _settled(work: _Work) -> bool:
    """No later phase touches the work: it answers from its own decode, or its last round has been judged."""
    return (not work.retrieve and work.answer_generation is not None) or work.outcome is not None


def join_or_choice(work: _Work, segments: Sequence[AnswerSegment]) -> str:
    """The answer text: the sentences, or for a closed-set question the choice they match."""
    text = policy.join_segments(segments)
    if work.choices is None:
        return text
    return closedset.match(text, work.choices) or text



def _probability(logprob: float | None) -> float | None:
    return None if logprob is None else math.exp(logprob)


def check_question(
    question: str, prompt_tokens: int, max_tokens: int, limit: int | None, index: int | None = None
) -> None:
    """Refuse, before any decoding, a question that is empty or does not fit the model's context."""
    where = "" if index is None else f"question {index + 1}: "
    if not question.strip():
        raise InputError(f"{where}the question is empty; ask something")
    problem = context_problem(prompt_tokens, max_tokens, limit)
    if problem:
        raise InputError(where + problem)

