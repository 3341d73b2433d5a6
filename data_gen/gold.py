"""The gold labeler: reflection labels derived from a data set's own annotations, no teacher model.

Per query (a record is one segment plus a utility label; a long-form ``output`` gives one segment per sentence)::

    no retrieval:  [No Retrieval]{answer}[Utility:5]
    gold G:        [Retrieval]<paragraph>G</paragraph>[Relevant]{answer}[Fully supported][Utility:5]
    gold, output:  [Retrieval]<paragraph>G</paragraph>[Relevant]{sentence 1}[Fully supported]
                   [Continue to Use Evidence]{sentence 2}[Fully supported]   (same passage)
                   [Retrieval]<paragraph>G2</paragraph>[Relevant]{sentence 3}[Fully supported]...[Utility:5]
    unanswerable:  [Retrieval]<paragraph>P</paragraph>[Irrelevant]{abstain}[No support / Contradictory][Utility:1]
    negative D:    [Retrieval]<paragraph>D</paragraph>[Irrelevant]{abstain}[No support / Contradictory][Utility:1]
    support neg.:  [Retrieval]<paragraph>G</paragraph>[Relevant]{wrong}[No support / Contradictory][Utility:1]
    off-answer:    [Retrieval]<paragraph>G</paragraph>[Relevant]{a sentence of G, no answer}[Fully supported][Utility:1]
    judged output: [Retrieval]<paragraph>G</paragraph>[Relevant]{output}{meta.support}[Utility:5 or 1]

The rule is one observable fact per label: a passage is ``[Relevant]`` exactly when it holds the evidence (the
gold passage, which contains the answer span); an unanswerable question has no relevant passage, so its own
paragraph P (the best BM25 match among its passages) is ``[Irrelevant]``. Negatives D come in four
kinds (see :mod:`selfrag.data_gen.distractors`): retrieved (BM25 top-k, record ``distractor-N``), easy
(another article, ``easy-N``), hard (the closest match of the same article without the answer, ``hard-N``) and
article (a random passage of the same article without the answer, ``article-N``), and erased (the gold passage with
its answer's sentences taken out, ``erased-0``). A support negative puts
another question's answer of the same form (``wrong``) after the gold passage. An off-answer negative
(``off-answer-N``) puts a sentence of the gold passage that states no answer after it: the passage supports it, it
answers nothing, so its utility is the worst -- ``[Utility]`` is then the one verdict that tells an answer from a
copied sentence of the right passage.

Text that must not be learned is marked ``meta.untrained_text = true`` (training masks the segment text, keeps
every reflection token trained): the abstain sentence after an ``[Irrelevant]`` verdict -- the runtime drops
such a continuation, and training it made 67% of retrieval records teach the abstain sentence, which became the
model's answer to everything -- and the wrong answer of a support negative, which the model must judge but
never say, and an off-answer sentence, which it must rate but never write. ``train_abstain_text=True`` trains the
abstain sentence as before.

A query whose data set judged its ``output`` against its gold passage (BEGIN: ``meta.support`` is
``[Fully supported]`` or ``[No support / Contradictory]``) gives one record, ``<query id>/response``: the gold
passage is ``[Relevant]`` (the knowledge the response was written from), the support label is the data set's.
Utility follows the rule of every retrieval record above, since BEGIN rates no utility: ``[Utility:5]`` for a
fully supported output (``meta.kind`` ``gold``), ``[Utility:1]`` otherwise (``support-negative``, text masked:
the model judges an unsupported response, never learns to say it). Such a query gets no negatives: with no
answer span, no other passage can be shown irrelevant without reading it (neighbouring dialogue turns share
their article).

``answer`` is the first gold answer, or the query's ``output`` where it has one besides its ``answers`` (a long-form
answer written from its gold passages; an output without answers is a data set's unjudged response, skipped as
before): then each sentence is a segment, on the gold passage that shares the most words with it
(``[Continue to Use Evidence]`` where that is the previous sentence's passage, else a new ``[Retrieval]``), and
without retrieval each sentence is a ``[No Retrieval]`` segment. ``form=long`` at run time needs such records: a model
trained on one-segment records writes one-sentence answers. ``abstain`` is :data:`ABSTAIN_TEXT` unless configured
otherwise.
Record ids are stable (``<query id>/gold``, ``<query id>/distractor-0``), so a rerun can skip them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from selfrag import reflection as rf
from selfrag.corpus import Query, retrieval_needed
from selfrag.data_gen.distractors import Evidence
from selfrag.errors import InputError
from selfrag.sentences import split_sentences
from selfrag.trajectory import Label, Passage, Record, Segment

#: What a trajectory answers when its passage does not support an answer (the paper's abstention).
ABSTAIN_TEXT = "The sources do not say."

LABELER = "gold"
BEST_UTILITY = rf.UTILITY_TOKENS[-1]  # [Utility:5]
WORST_UTILITY = rf.UTILITY_TOKENS[0]  # [Utility:1]


_WORD = re.compile(r"\w+")


def _label(value: str) -> Label:
    return Label(value, labeler=LABELER)


def has_judged_output(query: Query) -> bool:
    """Whether the data set judged the query's ``output`` against its gold passage (``meta.support``, BEGIN)."""
    return query.meta.get("support") is not None


def check_support_labels(queries: Iterable[Query], source: str) -> None:
    """Every ``meta.support`` must be an IsSUP token; ``InputError`` naming the file, query and value otherwise."""
    allowed = rf.GROUPS[rf.Group.SUPPORT]
    for query in queries:
        value = query.meta.get("support")
        if value is not None and value not in allowed:
            raise InputError(
                f"{source}: query {query.id!r}: meta.support must be one of {list(allowed)}, got {value!r}; "
                "write one of them (BEGIN's 'Fully attributable' is [Fully supported]) or remove meta.support"
            )


def _joined(index: int, sentence: str) -> str:
    """A segment's text: later sentences keep the space that joins them to the one before (as the assembler writes)."""
    return sentence if index == 0 else " " + sentence


def swapped_answer(query: Query, wrong: str) -> str:
    """A support negative's text in the form of the trained answer: where the query answers with an ``output`` that
    holds its first gold answer (a whole sentence around the span), that sentence with the wrong answer in the span's
    place, so the verdict cannot be read off the answer's length; else the wrong answer itself."""
    if query.output is None or not query.answers:
        return wrong
    at = query.output.casefold().find(query.answers[0].casefold())
    if at < 0:
        return wrong
    return query.output[:at] + wrong + query.output[at + len(query.answers[0]) :]


class GoldLabeler:
    """Turns each query (with its evidence) into gold-labelled trajectory records."""

    name = LABELER

    def __init__(
        self, passages_by_id: Mapping[str, Passage], abstain_text: str = ABSTAIN_TEXT, train_abstain_text: bool = False
    ) -> None:
        self.passages_by_id = passages_by_id
        self.abstain_text = abstain_text
        self.train_abstain_text = train_abstain_text

    def problem(self, query: Query) -> str | None:
        """Why this query cannot be gold-labelled (a short reason for the stats), or None."""
        if has_judged_output(query):
            if query.output is None:
                return "meta.support without output"
            if not retrieval_needed(query.needs_retrieval) or not query.gold_passage_ids:
                return "meta.support without gold passage"
            return None
        if query.answerable and not query.answers:
            return "answerable without answers"
        if retrieval_needed(query.needs_retrieval) and query.answerable and not query.gold_passage_ids:
            return "answerable without gold passage"
        return None

    def gold_ids_used(self, query: Query) -> tuple[str, ...]:
        """The gold passage ids :meth:`label` reads from the corpus for ``query`` (checked before a run starts)."""
        if self.problem(query) is not None:
            return ()
        if has_judged_output(query):
            return query.gold_passage_ids[:1]
        if not retrieval_needed(query.needs_retrieval) or not query.answerable:
            return ()
        return query.gold_passage_ids

    def label(self, query: Query, evidence: Evidence) -> list[Record]:
        """The records of one query; empty when :meth:`problem` names a reason."""
        if self.problem(query) is not None:
            return []
        if has_judged_output(query):
            return [self._judged_output(query)]
        sentences = list(query.answers[:1]) if query.output is None else split_sentences(query.output) or [query.output]
        if not retrieval_needed(query.needs_retrieval):
            segments = [Segment(_joined(i, text), retrieve=_label(rf.NO_RETRIEVAL)) for i, text in enumerate(sentences)]
            return [self._record(query, "no-retrieval", "no-retrieval", segments, BEST_UTILITY)]
        records = []
        abstain_untrained = not self.train_abstain_text
        if query.answerable:
            gold = self._passage(query, query.gold_passage_ids[0])
            golds = [self._passage(query, passage_id) for passage_id in query.gold_passage_ids]
            records.append(self._record(query, "gold", "gold", self._grounded(sentences, golds), BEST_UTILITY))
            for number, wrong in enumerate(evidence.wrong_answers):
                records.append(
                    self._evidence_record(
                        query, f"support-negative-{number}", "support-negative", gold, rf.RELEVANT,
                        swapped_answer(query, wrong), rf.NO_SUPPORT, untrained=True,
                    )
                )
            for number, sentence in enumerate(evidence.off_answer):
                records.append(
                    self._evidence_record(
                        query, f"off-answer-{number}", "off-answer", gold, rf.RELEVANT, sentence,
                        rf.FULLY_SUPPORTED, untrained=True, utility=WORST_UTILITY,
                    )
                )
        elif evidence.own is not None:
            records.append(
                self._evidence_record(
                    query, "own-passage", "own-passage", evidence.own, rf.IRRELEVANT, self.abstain_text,
                    rf.NO_SUPPORT, untrained=abstain_untrained,
                )
            )
        for prefix, kind, passages in (
            ("distractor", "distractor", evidence.distractors),
            ("easy", "easy", evidence.easy),
            ("hard", "hard", evidence.hard),
            ("article", "article", evidence.article),
            ("erased", "erased", evidence.erased),
        ):
            for number, passage in enumerate(passages):
                records.append(
                    self._evidence_record(
                        query, f"{prefix}-{number}", kind, passage, rf.IRRELEVANT, self.abstain_text, rf.NO_SUPPORT,
                        untrained=abstain_untrained,
                    )
                )
        return records

    def _judged_output(self, query: Query) -> Record:
        assert query.output is not None  # problem() says so first
        support = str(query.meta["support"])
        supported = support == rf.FULLY_SUPPORTED
        gold = self._passage(query, query.gold_passage_ids[0])
        kind = "gold" if supported else "support-negative"
        return self._evidence_record(
            query, "response", kind, gold, rf.RELEVANT, query.output, support, untrained=not supported
        )

    def _passage(self, query: Query, passage_id: str) -> Passage:
        try:
            return self.passages_by_id[passage_id]
        except KeyError:
            raise InputError(
                f"query {query.id!r}: gold passage {passage_id!r} is not in the corpus; correct the id in the "
                "queries file, or add the passage to the corpus"
            ) from None

    def _evidence_record(
        self,
        query: Query,
        name: str,
        kind: str,
        passage: Passage,
        relevance: str,
        text: str,
        support: str,
        untrained: bool = False,
        utility: str | None = None,
    ) -> Record:
        segment = Segment(
            text,
            retrieve=_label(rf.RETRIEVAL),
            passage=passage,
            relevance=_label(relevance),
            support=_label(support),
        )
        if utility is None:
            utility = BEST_UTILITY if support == rf.FULLY_SUPPORTED else WORST_UTILITY
        return self._record(query, name, kind, [segment], utility, untrained)

    def _grounded(self, sentences: Sequence[str], golds: Sequence[Passage]) -> list[Segment]:
        """One ``[Fully supported]`` segment per sentence, on the gold passage sharing the most words with it (ties:
        the earlier passage); ``[Continue to Use Evidence]`` where that passage is the previous sentence's."""
        segments: list[Segment] = []
        current: Passage | None = None
        for index, sentence in enumerate(sentences):
            words = {word.lower() for word in _WORD.findall(sentence)}
            passage = max(golds, key=lambda p: (len(words & {w.lower() for w in _WORD.findall(p.text)}),
                                                -golds.index(p)))
            text = _joined(index, sentence)
            if passage is current:
                segments.append(Segment(text, retrieve=_label(rf.CONTINUE_EVIDENCE),
                                        support=_label(rf.FULLY_SUPPORTED)))
            else:
                segments.append(Segment(text, retrieve=_label(rf.RETRIEVAL), passage=passage,
                                        relevance=_label(rf.RELEVANT), support=_label(rf.FULLY_SUPPORTED)))
            current = passage
        return segments

    def _record(
        self, query: Query, name: str, kind: str, segments: Sequence[Segment], utility: str, untrained: bool = False
    ) -> Record:
        """``name`` makes the record id (``<query id>/<name>``); ``kind`` goes to ``meta.kind`` for stats."""
        meta: dict[str, Any] = {"query_id": query.id, "kind": kind}
        if "split" in query.meta:
            meta["split"] = query.meta["split"]
        if untrained:
            meta["untrained_text"] = True  # training masks the segment text (reflection tokens stay trained)
        return Record(
            id=f"{query.id}/{name}",
            instruction=query.question,
            segments=tuple(segments),
            utility=_label(utility),
            source=str(query.meta.get("source", "")),
            meta=meta,
        )
