"""Which passages may stand as evidence for a question: negatives of three difficulties, and support negatives.

A negative is a passage that is safe to label ``[Irrelevant]`` without reading it: not a gold passage, not from
the question's own paragraph (SQuAD v2 keeps those in ``meta.own_passage_ids``), and not containing any gold
answer (case-insensitive). Three difficulties, each a configurable count per question:

- ``retrieved``: the top BM25 hits for the question (what the runtime's retriever shows the model);
- ``easy``: a passage of another article (``meta.title``, else the gold passage's title), drawn with a seed from
  the question id;
- ``hard``: the best BM25 match from the question's own article (same topic, no answer);
- ``article``: a passage of the question's own article drawn at random (same article, no answer, not the closest
  match: between easy and hard; the hard kind's passages are left out);
- ``erased``: the gold passage itself with every sentence that states an answer taken out (a minimal pair: the
  same title, topic and words as the evidence, only the answer's sentence missing). It is the one negative whose
  only difference from the gold passage is whether the answer is there, which is what the closest same-article
  passages demand of the model.

An off-answer negative is not a passage but a sentence: one of the gold passage's own sentences that states no
answer. After the gold passage it is ``[Relevant]`` and ``[Fully supported]`` (the passage says it) yet answers
nothing, so only ``[Utility]`` can tell it from the answer: the contrast a model needs that copies its passage's
first sentence whatever the question asks.

A support negative is another question's answer of the same *form* (number, name, phrase; similar length), so
that ``gold passage + wrong answer -> [No support / Contradictory]`` cannot be told from the right answer by its
shape. For an unanswerable question, its own paragraph's best BM25 match is the passage it is labelled against.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from selfrag.corpus import Query, retrieval_needed
from selfrag.retrieval import Retriever
from selfrag.sentences import split_sentences
from selfrag.splits import stable_hash
from selfrag.trajectory import Passage

#: How many BM25 hits to look through per question for distractors and the own passage.
SEARCH_DEPTH = 50


@dataclass(frozen=True)
class Evidence:
    """The passages one question is labelled against, besides its gold passage."""

    distractors: tuple[Passage, ...]  # retrieved negatives (BM25 top-k)
    own: Passage | None = None  # best-matching passage of the question's own paragraph
    easy: tuple[Passage, ...] = ()  # other article
    hard: tuple[Passage, ...] = ()  # same article, no answer
    wrong_answers: tuple[str, ...] = ()  # other questions' answers of the same form, absent from the gold passage
    article: tuple[Passage, ...] = ()  # same article, no answer, drawn at random
    erased: tuple[Passage, ...] = ()  # the gold passage without its answer's sentences
    off_answer: tuple[str, ...] = ()  # sentences of the gold passage that state no answer


def own_passage_ids(query: Query) -> frozenset[str]:
    """Passages of the question's own paragraph: ``meta.own_passage_ids`` plus the gold passages."""
    own = query.meta.get("own_passage_ids") or ()
    return frozenset(str(passage_id) for passage_id in own) | frozenset(query.gold_passage_ids)


def mentions(passage: Passage, answer: str) -> bool:
    """Whether ``answer`` occurs in the passage's title or text (case-insensitive)."""
    return _says(f"{passage.title}\n{passage.text}", answer)


def is_distractor(query: Query, passage: Passage) -> bool:
    """Whether ``passage`` can be labelled irrelevant to ``query`` without reading it."""
    if passage.id in own_passage_ids(query):
        return False
    return not any(mentions(passage, answer) for answer in query.answers)


def article_of(query: Query, passages_by_id: Mapping[str, Passage] | None = None) -> str | None:
    """The query's article: ``meta.title``, else the title of its first gold passage (or of its own paragraph's)
    that has one; None when neither says."""
    title = query.meta.get("title")
    if title is not None:
        return str(title).replace("_", " ")
    for passage_id in (*query.gold_passage_ids, *(query.meta.get("own_passage_ids") or ())):
        passage = (passages_by_id or {}).get(str(passage_id))
        if passage is not None and passage.title.strip():
            return passage.title.replace("_", " ")
    return None


def answer_form(answer: str) -> str:
    """A coarse shape of an answer: ``number``/``name``/``phrase`` and a length bucket (1, 2-3, 4+ words)."""
    words = answer.split()
    length = "1" if len(words) <= 1 else "2-3" if len(words) <= 3 else "4+"
    if re.search(r"\d", answer):
        kind = "number"
    elif words and all(word[:1].isupper() for word in words if word.isalpha() and len(word) > 3):
        kind = "name"
    else:
        kind = "phrase"
    return f"{kind}/{length}"


def _rng(query: Query, salt: str, seed: int) -> random.Random:
    return random.Random(stable_hash(f"{seed}/{salt}/{query.id}", algorithm="sha1", width=8))


@dataclass(frozen=True)
class NegativeMix:
    """How many negatives of each difficulty, and support negatives, to draw per question."""

    retrieved: int = 1
    easy: int = 0
    hard: int = 0
    support: int = 0
    seed: int = 0
    article: int = 0
    erased: int = 0
    off_answer: int = 0


def find_evidence(
    queries: Sequence[Query],
    retriever: Retriever,
    passages_by_id: Mapping[str, Passage],
    distractors: int | NegativeMix,
    depth: int = SEARCH_DEPTH,
    answer_pool: Sequence[Query] = (),
) -> list[Evidence]:
    """Negatives (and, for unanswerable questions, the own passage) for each query, in one batched search.

    ``distractors`` is the number of retrieved negatives, or a :class:`NegativeMix`. ``answer_pool`` holds the
    questions whose answers may serve as support negatives (default: ``queries``).
    """
    mix = distractors if isinstance(distractors, NegativeMix) else NegativeMix(retrieved=distractors)
    hits_per_query = retriever.search_many([query.question for query in queries], max(depth, mix.retrieved))
    by_article: dict[str, list[Passage]] = {}
    if mix.easy or mix.hard or mix.article:
        for passage in sorted(passages_by_id.values(), key=lambda p: p.id):
            by_article.setdefault(passage.title.replace("_", " "), []).append(passage)
    forms = _answers_by_form(answer_pool or queries) if mix.support else {}
    evidence = []
    for query, hits in zip(queries, hits_per_query, strict=True):
        ranked = [hit.passage for hit in hits]
        chosen = [p for p in ranked if is_distractor(query, p)][: mix.retrieved]
        own = _best_own(query, ranked, passages_by_id) if not query.answerable else None
        article = article_of(query, passages_by_id)
        easy = _easy(query, article, by_article, mix) if mix.easy else ()
        hard = _hard(query, article, ranked, by_article, mix) if mix.hard else ()
        wrong = _wrong_answers(query, passages_by_id, forms, mix) if mix.support and query.answerable else ()
        same_article = _article(query, article, by_article, mix, hard) if mix.article else ()
        erased = _erased(query, passages_by_id) if mix.erased and query.answerable else ()
        off = _off_answer(query, passages_by_id, mix.off_answer) if mix.off_answer and query.answerable else ()
        evidence.append(Evidence(tuple(chosen), own, easy, hard, wrong, same_article, erased, off))
    return evidence


def _easy(
    query: Query, article: str | None, by_article: Mapping[str, list[Passage]], mix: NegativeMix
) -> tuple[Passage, ...]:
    """Passages of other articles (each from a different one where possible), seeded by the query id."""
    others = sorted(title for title in by_article if title != article)
    if not others:
        return ()
    rng = _rng(query, "easy", mix.seed)
    picked: list[Passage] = []
    for title in rng.sample(others, min(mix.easy, len(others))) if len(others) >= mix.easy else others:
        candidates = [p for p in by_article[title] if is_distractor(query, p)]
        if candidates:
            picked.append(rng.choice(candidates))
    return tuple(picked[: mix.easy])


def _hard(
    query: Query,
    article: str | None,
    ranked: Sequence[Passage],
    by_article: Mapping[str, list[Passage]],
    mix: NegativeMix,
) -> tuple[Passage, ...]:
    """The best-ranked passages of the query's own article that are safe negatives; seeded draws if too few rank."""
    if article is None or article not in by_article:
        return ()
    picked = [p for p in ranked if p.title.replace("_", " ") == article and is_distractor(query, p)][: mix.hard]
    if len(picked) < mix.hard:
        rest = [p for p in by_article[article] if p not in picked and is_distractor(query, p)]
        rng = _rng(query, "hard", mix.seed)
        picked += rng.sample(rest, min(mix.hard - len(picked), len(rest)))
    return tuple(picked)


def _article(
    query: Query,
    article: str | None,
    by_article: Mapping[str, list[Passage]],
    mix: NegativeMix,
    hard: Sequence[Passage],
) -> tuple[Passage, ...]:
    """Passages of the query's own article that are safe negatives, drawn with a seed from the query id (not the
    best BM25 match: the passages ``hard`` already holds are left out)."""
    if article is None or article not in by_article:
        return ()
    taken = {passage.id for passage in hard}
    pool = [p for p in by_article[article] if p.id not in taken and is_distractor(query, p)]
    rng = _rng(query, "article", mix.seed)
    return tuple(rng.sample(pool, min(mix.article, len(pool))))


#: An erased passage shorter than this many words is not drawn: too little left to be a passage.
MIN_ERASED_WORDS = 6


def erase_answers(passage: Passage, answers: Sequence[str]) -> Passage | None:
    """``passage`` without the sentences that mention any of ``answers``; None when nothing usable is left.

    None when no sentence mentions an answer (the answer is only in the title, or spans two sentences), when every
    sentence does, when fewer than :data:`MIN_ERASED_WORDS` words remain, or when the rest still mentions an answer
    (one split across a sentence boundary). The id is the passage's own plus ``#erased``: it is not a corpus passage.
    """
    parts = split_sentences(passage.text)  # a wrong split only ever removes more text or refuses the passage
    kept = [part for part in parts if not any(_says(part, answer) for answer in answers)]
    if len(kept) == len(parts) or not kept:
        return None
    erased = Passage(f"{passage.id}#erased", passage.title, " ".join(kept))
    if len(erased.text.split()) < MIN_ERASED_WORDS or any(mentions(erased, answer) for answer in answers):
        return None
    return erased


def _says(text: str, answer: str) -> bool:
    return bool(answer.strip()) and answer.strip().casefold() in text.casefold()


def _erased(query: Query, passages_by_id: Mapping[str, Passage]) -> tuple[Passage, ...]:
    """The first gold passage with its answer's sentences taken out, when something usable is left."""
    passage = passages_by_id.get(query.gold_passage_ids[0]) if query.gold_passage_ids else None
    erased = None if passage is None else erase_answers(passage, query.answers)
    return () if erased is None else (erased,)


#: An off-answer sentence shorter than this many words is not drawn (a heading, a fragment of a wrong split).
MIN_OFF_ANSWER_WORDS = 4


def off_answer_sentences(passage: Passage, answers: Sequence[str], count: int) -> tuple[str, ...]:
    """The first ``count`` sentences of ``passage`` (in passage order) that mention none of ``answers`` and have at
    least :data:`MIN_OFF_ANSWER_WORDS` words; none when no sentence states an answer (the answer is only in the
    title, or spans a sentence boundary: then no sentence can be shown to miss it)."""
    parts = split_sentences(passage.text)
    if not any(_says(part, answer) for part in parts for answer in answers):
        return ()
    off = [part for part in parts
           if len(part.split()) >= MIN_OFF_ANSWER_WORDS and not any(_says(part, answer) for answer in answers)]
    return tuple(off[:count])


def _off_answer(query: Query, passages_by_id: Mapping[str, Passage], count: int) -> tuple[str, ...]:
    passage = passages_by_id.get(query.gold_passage_ids[0]) if query.gold_passage_ids else None
    if passage is None:
        return ()
    # the trained answer is never its own negative (an output that words the answer without its span)
    answers = (*query.answers, query.output) if query.output else query.answers
    return off_answer_sentences(passage, answers, count)


def _answers_by_form(pool: Sequence[Query]) -> dict[str, list[str]]:
    forms: dict[str, list[str]] = {}
    for query in pool:
        if query.answerable and query.answers and retrieval_needed(query.needs_retrieval):
            forms.setdefault(answer_form(query.answers[0]), []).append(query.answers[0])
    return {form: sorted(set(answers)) for form, answers in forms.items()}


def _wrong_answers(
    query: Query, passages_by_id: Mapping[str, Passage], forms: Mapping[str, list[str]], mix: NegativeMix
) -> tuple[str, ...]:
    """Other questions' answers of this answer's form that the gold passage does not contain."""
    gold = [passages_by_id[i] for i in query.gold_passage_ids if i in passages_by_id]
    own = {answer.strip().casefold() for answer in query.answers}
    candidates = [
        answer
        for answer in forms.get(answer_form(query.answers[0]), [])
        if answer.strip().casefold() not in own and not any(mentions(p, answer) for p in gold)
    ]
    rng = _rng(query, "support", mix.seed)
    return tuple(rng.sample(candidates, min(mix.support, len(candidates))))


def _best_own(query: Query, ranked: Sequence[Passage], passages_by_id: Mapping[str, Passage]) -> Passage | None:
    """The highest-ranked passage of the question's own paragraph; its first passage when none ranks."""
    own = own_passage_ids(query)
    for passage in ranked:
        if passage.id in own:
            return passage
    # Not in the top hits (the question shares no word with it): fall back to the paragraph's first passage.
    listed = [str(i) for i in query.meta.get("own_passage_ids") or () if str(i) in passages_by_id]
    return passages_by_id[listed[0]] if listed else None
