"""The single-pass runtime's decodes: its requests, how a decode becomes a candidate, and a round's passage branches.

With pruning (the default) every branch ``prompt + [Retrieval]<paragraph>…</paragraph>`` decodes its relevance token
first (the verdict read at ``relevance_threshold``, weak branches stopped there), then the rest of each survivor from
that verdict. A branch that judged its passage ``[Relevant]`` and wrote no answer text is decoded once more from
``[Relevant]``, text first. A branch never writes its own evidence or asks for more: ``[Retrieval]`` and
``<paragraph>`` are held off in every branch decode (the short form answers in one segment, from the passage the
runtime gave it), so a branch that would stop there mid-answer writes on to its verdicts. The question's decision and
the answer after ``[No Retrieval]`` stop at them instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from selfrag import reflection as rf
from selfrag.prompting import passage_ids
from selfrag.reflection import Group
from selfrag.trajectory import Passage, lex_ids, parse_trajectory

from .answer import Candidate
from .config import InferenceConfig
from .engines.base import Engine, Generation, GenerationRequest, concat_generations
from .rounds import hopeless_round, stopped_branches
from .scoring import RelevanceVerdict, relevance_entry, relevance_verdict, score_continuation, with_retrieval
from .trace import Prune, Retry, Skip, Together
from .work import Work, call


@dataclass
class PromptWork(Work):
    """A question of the single-pass runtime: its prompt ids, and the ids forced after them on the no-retrieval path."""

    prompt: tuple[int, ...] = ()
    prefix: tuple[int, ...] = ()


class Decoding:
    """The single-pass model's requests and candidates (see the module docstring)."""

    def __init__(self, engine: Engine, config: InferenceConfig, weights: dict[str, float]) -> None:
        self.engine, self.config, self.weights = engine, config, weights
        ids = engine.token_ids
        self.utility_ids = ids.ids(Group.UTILITY)
        self.retrieval_id = ids.id(rf.RETRIEVAL)
        self.no_retrieval_id = ids.id(rf.NO_RETRIEVAL)
        self.paragraph_id = ids.id(rf.PARAGRAPH_OPEN)
        # after [No Retrieval] a trajectory is `{answer}[Utility:k]`: no other decision, verdict or passage markup
        self.after_no_retrieval_banned = tuple(
            i for i in ids.all_ids if i not in (*self.utility_ids, self.retrieval_id, self.paragraph_id)
        )
        # After its relevance verdict a branch writes its answer, then its support and utility verdicts: a second
        # relevance verdict or a </paragraph> is never well-formed there. Held off, the model writes on instead of
        # looping `[Relevant]For</paragraph>[Relevant]For…` to max_tokens (a 150-step CPU model did, on one seed in
        # three, at 4x plain RAG's latency). The log-probs reported stay the model's own.
        self.relevance_ids = ids.ids(Group.RELEVANCE)
        # A branch already holds its evidence: a `[Retrieval]` or `<paragraph>` there asks for more, which the short
        # form never fetches. As stop ids they cut the branch before its support verdict, and a branch without one is
        # never accepted (a 300-step CPU model did this on the passage it judged [Relevant], on PopQA, and the
        # question was abstained). Held off, the model writes on to its verdicts.
        self.branch_banned = (self.retrieval_id, self.paragraph_id)
        self.after_verdict_banned = (*self.branch_banned, *self.relevance_ids, ids.id(rf.PARAGRAPH_CLOSE))

    # -- requests -----------------------------------------------------------------------------------

    def stop_ids(self) -> tuple[int, ...]:
        # [Retrieval] and <paragraph> stop every decode: a continuation never writes its own evidence.
        return (self.retrieval_id, self.paragraph_id, *self.utility_ids)

    def decision_request(self, prompt: tuple[int, ...]) -> GenerationRequest:
        return GenerationRequest(
            prompt_ids=prompt,
            max_tokens=self.config.max_tokens,
            stop_token_ids=self.stop_ids(),
            score_token_ids=self.engine.token_ids.all_ids,
            keep_prefix=True,  # every passage branch extends the question: an engine that keeps KV prefills it once
        )

    def continuation_request(self, prompt: Sequence[int], max_tokens: int) -> GenerationRequest:
        return GenerationRequest(
            prompt_ids=tuple(prompt),
            max_tokens=max_tokens,
            stop_token_ids=self.stop_ids(),
            score_token_ids=self.engine.token_ids.all_ids,
        )

    def branch_request(self, prompt: Sequence[int], max_tokens: int) -> GenerationRequest:
        """A passage branch's decode (``prompt`` ends in its passage, or goes on from there): it stops at its utility
        verdict or the end, and never writes ``[Retrieval]`` or ``<paragraph>`` (see ``branch_banned``)."""
        return GenerationRequest(
            prompt_ids=tuple(prompt),
            max_tokens=max_tokens,
            stop_token_ids=self.utility_ids,
            score_token_ids=self.engine.token_ids.all_ids,
            banned_token_ids=self.branch_banned,
        )

    def after_verdict_request(self, prompt: Sequence[int], max_tokens: int) -> GenerationRequest:
        """The rest of a branch after its relevance verdict (somewhere in ``prompt``'s generated part): its answer and
        verdicts, with no second relevance verdict or ``</paragraph>`` (see ``after_verdict_banned``)."""
        return replace(self.branch_request(prompt, max_tokens), banned_token_ids=self.after_verdict_banned)

    def no_retrieval_request(self, prompt: Sequence[int]) -> GenerationRequest:
        """The answer after ``[No Retrieval]`` (forced by the threshold, mode=never, no passage found, or every
        passage judged irrelevant): text first, never another decision or verdict. A model that wanted to retrieve
        and was held to ``[No Retrieval]`` otherwise repeats ``[No Retrieval]`` or stops at ``[Retrieval]`` and
        writes no answer at all (the 150-step CPU model did on arithmetic questions)."""
        request = self.continuation_request(prompt, self.config.max_tokens)
        if not prompt or prompt[-1] != self.no_retrieval_id:
            return request
        return replace(request, banned_token_ids=self.after_no_retrieval_banned, min_tokens=1)

    def opens_with_text(self, ids: Sequence[int]) -> bool:
        """Whether ``ids`` start with answer text: more than whitespace (or an end-of-sequence id) before the first
        reflection id."""
        tokenizer = self.engine.tokenizer
        pieces = lex_ids(ids, self.engine.token_ids, lambda run: tokenizer.decode(run, skip_special_tokens=True))
        return bool(pieces) and not pieces[0][1] and bool(pieces[0][0].strip())

    def candidate(self, passage: Passage | None, prefix: Sequence[int], generation: Generation) -> Candidate:
        """Parse ``prefix + generated`` (ids are authoritative; a final stop/eos id is dropped) and score it."""
        generated = list(generation.token_ids)
        truncated = None
        if generation.finish_reason == "eos":
            generated = generated[:-1]  # eos is not text
        elif generation.finish_reason == "stop" and generated[-1] in (self.retrieval_id, self.paragraph_id):
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

    def decode(self, works: Sequence[PromptWork]) -> None:
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
        whole = call(
            self.engine,
            [replace(self.branch_request(p, 1 if pruning else max_tokens), keep_prefix=pruning)
             for _, _, p in branches],
            owners,
        )
        verdicts = self._relevance(works, branches, whole)
        first = [verdict.generation for verdict in verdicts]  # a whole decode unless its verdict was overridden
        scores = [verdict.score for verdict in verdicts]
        pruned = self._prune(works, branches, scores) if pruning else [False] * len(branches)
        # read=together: the passages each judged [Relevant] are answered once, read in one paragraph (below)
        together = self._together(works, branches, verdicts, pruned) if self.config.read == "together" else []
        held = {i for _, members in together for i in members}
        # continue from the verdict: every survivor of the pruning step; without pruning only an overridden branch
        rest = [
            i
            for i, g in enumerate(first)
            if max_tokens > 1
            and not pruned[i]
            and i not in held
            and g.finish_reason == "length"
            and (pruning or verdicts[i].overridden)
        ]
        more = call(
            self.engine,
            [self.after_verdict_request(branches[i][2] + first[i].token_ids, max_tokens - 1)
             if set(first[i].token_ids) & set(self.relevance_ids)
             else self.branch_request(branches[i][2] + first[i].token_ids, max_tokens - 1) for i in rest],
            [owners[i] for i in rest],
        )
        generations = list(first)
        for i, generation in zip(rest, more, strict=True):
            generations[i] = concat_generations(first[i], generation)
        for i in held:  # read=together: only their verdicts stand (a whole decode without pruning is set aside)
            generations[i] = _head(first[i], rf.RELEVANT)
        prefixes = [tuple(passage_ids(tokenizer, ids, hit.passage)) for _, hit, _ in branches]
        candidates = [
            replace(self.candidate(hit.passage, prefix, generation), pruned=was_pruned or i in held, round=work.round)
            for i, ((work, hit, _), prefix, generation, was_pruned) in enumerate(zip(
                branches, prefixes, generations, pruned, strict=True
            ))
        ]
        again = [i for i, candidate in enumerate(candidates) if self._relevant_without_text(candidate, generations[i])]
        for i, generation in zip(again, self._text_first([branches[i] for i in again]), strict=True):
            retried = self.candidate(branches[i][1].passage, prefixes[i], concat_generations(
                _head(generations[i], rf.RELEVANT), generation))
            candidates[i] = replace(retried, round=candidates[i].round, retried=candidates[i].generated)
        weight = self.config.weights.retrieval
        ranks = [rank for work in works for rank, _ in enumerate(work.hits)]  # each branch's passage's, in its round
        for (work, _, _), candidate, rank in zip(branches, candidates, ranks, strict=True):
            work.candidates.append(replace(candidate, score=with_retrieval(candidate.score, rank, weight)))
        if together:
            best_ranks = [min(ranks[i] for i in members) for _, members in together]
            for (work, candidate), rank in zip(self._read_together(together, branches, first, scores), best_ranks,
                                               strict=True):
                work.candidates.append(replace(candidate, score=with_retrieval(candidate.score, rank, weight)))

    def _together(
        self, works: Sequence[PromptWork], branches: list[Any], verdicts: list[RelevanceVerdict], pruned: list[bool]
    ) -> list[tuple[PromptWork, list[int]]]:
        """read=together: per question, the branches (two or more, in retrieval order) that go on from [Relevant]."""
        groups = []
        for work in works:
            mine = [i for i, branch in enumerate(branches)
                    if branch[0] is work and not pruned[i] and verdicts[i].token == rf.RELEVANT]
            if len(mine) >= 2:
                groups.append((work, mine))
        return groups

    def _read_together(
        self,
        groups: list[tuple[PromptWork, list[int]]],
        branches: list[Any],
        first: list[Generation],
        relevance: list[float | None],
    ) -> list[tuple[PromptWork, Candidate]]:
        """One branch per group: ``prompt + [Retrieval]<paragraph>{the passages, each title and text, a blank line
        between}</paragraph>[Relevant]``, decoded text first like a retried branch; its relevance verdict is the best
        of its passages' (that branch's first position), so the ranking weighs it as it would that passage."""
        tokenizer, ids = self.engine.tokenizer, self.engine.token_ids
        joined, heads = [], []
        for work, members in groups:
            passages = [branches[i][1].passage for i in members]
            passage = Passage(id=" + ".join(p.id for p in passages), title="",
                              text="\n\n".join(p.render() for p in passages))
            best = max(members, key=lambda i: -1.0 if relevance[i] is None else float(relevance[i]))  # type: ignore[arg-type]
            joined.append((work, passage, work.prompt + tuple(passage_ids(tokenizer, ids, passage))))
            heads.append(_head(first[best], rf.RELEVANT))
            work.trace.append(Together(
                round=work.round,
                chosen=tuple(p.id for p in passages),
                reason=f"{len(passages)} passages judged {rf.RELEVANT} read in one paragraph and answered once "
                f"(read=together); its relevance is the best of theirs, {branches[best][1].passage.id}'s",
            ))
        texts = self._from_relevant([(work, prompt) for work, _, prompt in joined])
        return [
            (work, replace(self.candidate(passage, tuple(passage_ids(tokenizer, ids, passage)),
                                          concat_generations(head, text)), round=work.round))
            for (work, passage, _), head, text in zip(joined, heads, texts, strict=True)
        ]

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
        owners = [work for work, _, _ in branches]
        for work in {id(work): work for work in owners}.values():
            mine = [hit.passage.id for owner, hit, _ in branches if owner is work]
            work.trace.append(Retry(
                round=work.round,
                chosen=tuple(mine),
                reason=f"{len(mine)} branch(es) judged the passage {rf.RELEVANT} and wrote no answer text; "
                f"decoded once more from {rf.RELEVANT}, text first",
            ))
        return self._from_relevant([(work, prompt) for work, _, prompt in branches])

    def _from_relevant(self, prompts: list[tuple[PromptWork, tuple[int, ...]]]) -> list[Generation]:
        """``prompt + [Relevant]`` decoded: a first id that must be text, then the rest as the model goes on."""
        relevant = (self.engine.token_ids.id(rf.RELEVANT),)
        owners = [work for work, _ in prompts]
        opening = call(self.engine, [
            # kept (keep_prefix): the rest extends it by the one id decoded here, so it prefills only that id
            replace(self.continuation_request(prompt + relevant, 1),
                    banned_token_ids=self.after_no_retrieval_banned, min_tokens=1, keep_prefix=True)
            for _, prompt in prompts
        ], owners)
        rest = call(self.engine, [
            self.after_verdict_request(prompt + relevant + text.token_ids, self.config.max_tokens - 2)
            for (_, prompt), text in zip(prompts, opening, strict=True)
        ], owners)
        return [concat_generations(text, more) for text, more in zip(opening, rest, strict=True)]

    def _relevance(
        self, works: Sequence[PromptWork], branches: list[Any], first: list[Generation]
    ) -> list[RelevanceVerdict]:
        """Each branch's relevance verdict read at ``relevance_threshold`` (see :func:`relevance_verdict`)."""
        threshold = self.config.relevance_cut
        verdicts = [relevance_verdict(g, self.engine.token_ids, threshold) for g in first]
        for work in works:
            mine = [i for i, branch in enumerate(branches) if branch[0] is work]
            if mine:
                passages = [branches[i][1].passage.id for i in mine]
                work.trace.append(relevance_entry(passages, [verdicts[i] for i in mine], threshold, round_=work.round))
        return verdicts

    def _prune(self, works: Sequence[PromptWork], branches: list[Any], relevance: list[float | None]) -> list[bool]:
        """Which branches stop after their relevance token (their scores, read once by :meth:`_relevance`)."""
        pruning = self.config.pruning
        pruned = [False] * len(branches)
        for work in works:
            mine = [i for i, branch in enumerate(branches) if branch[0] is work]
            known = [value for i in mine if (value := relevance[i]) is not None]
            if not known:
                continue
            stopped = [i for i, stop in zip(mine, stopped_branches([relevance[i] for i in mine], pruning), strict=True)
                       if stop]
            for i in stopped:
                pruned[i] = True
            work.trace.append(Prune(
                round=work.round,
                relevance_bound=pruning.relevance_bound,
                margin=pruning.margin,
                relevance={branches[i][1].passage.id: relevance[i] for i in mine},
                chosen=tuple(branches[i][1].passage.id for i in stopped),
                reason=f"{len(stopped)} of {len(mine)} branches stopped after their relevance token "
                f"(below {pruning.relevance_bound} or more than {pruning.margin} behind the best {max(known):.4f})",
            ))
            hopeless = hopeless_round([relevance[i] for i in mine], self.config)
            if hopeless is not None:  # skip.relevance_gap: the rest of the round stops here too
                work.trace.append(Skip(round=work.round, rule="relevance_gap",
                                       chosen=tuple(branches[i][1].passage.id for i in mine if not pruned[i]),
                                       reason=hopeless))
                for i in mine:
                    pruned[i] = True
        return pruned


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
