"""The clean gold rule on hand-made examples: one observable fact per label, three negative difficulties,
support negatives of the same answer form, and text that is judged but never trained."""

from __future__ import annotations

from typing import Any

from selfrag import reflection as rf
from selfrag.corpus import Query
from selfrag.data_gen.distractors import (
    Evidence,
    NegativeMix,
    answer_form,
    erase_answers,
    find_evidence,
    off_answer_sentences,
)
from selfrag.data_gen.gold import ABSTAIN_TEXT, GoldLabeler
from selfrag.retrieval import BM25Retriever
from selfrag.trajectory import Passage

PASSAGES = [
    Passage("paris-0-0", "Paris", "Paris is the capital of France. It lies on the Seine."),
    Passage("paris-1-0", "Paris", "The Louvre in the French capital opened in 1793 as a museum."),
    Passage("paris-2-0", "Paris", "The capital of France hosts the Tour de France finish every July."),
    Passage("rome-0-0", "Rome", "Rome is the capital of Italy. The Colosseum stands in Rome."),
    Passage("rome-1-0", "Rome", "Legend says Rome was founded in 753 BC by Romulus."),
    Passage("berlin-0-0", "Berlin", "Berlin is the capital of Germany and its largest city."),
]
BY_ID = {p.id: p for p in PASSAGES}


def query(
    qid: str, question: str, answers: tuple[str, ...], gold: tuple[str, ...], title: str, own: list[str]
) -> Query:
    meta: dict[str, Any] = {"split": "train", "title": title, "own_passage_ids": own}
    return Query(qid, question, answers, bool(answers), gold, True, meta)


FRANCE = query("q-france", "What is the capital of France?", ("Paris",), ("paris-0-0",), "Paris", ["paris-0-0"])
ROME = query("q-rome", "Who founded Rome?", ("Romulus",), ("rome-1-0",), "Rome", ["rome-1-0"])
LOUVRE = query("q-louvre", "When did the Louvre open?", ("1793",), ("paris-1-0",), "Paris", ["paris-1-0"])
FOUNDED = query("q-founded", "When was Rome founded?", ("753",), ("rome-1-0",), "Rome", ["rome-1-0"])
UNANSWERABLE = query("q-none", "When did the Seine freeze?", (), (), "Paris", ["paris-0-0"])


def evidence(queries: list[Query], mix: NegativeMix) -> dict[str, Any]:
    found = find_evidence(queries, BM25Retriever(PASSAGES), BY_ID, mix, depth=10)
    return {q.id: e for q, e in zip(queries, found, strict=True)}


MUSEUM = query(
    "q-museum",
    "Which museum in the capital of France opened in 1793?",
    ("The Louvre",),
    ("paris-1-0",),
    "Paris",
    ["paris-1-0"],
)


def test_relevant_exactly_when_the_passage_holds_the_answer() -> None:
    (found,) = evidence([MUSEUM], NegativeMix(retrieved=0, easy=1, hard=1)).values()
    records = GoldLabeler(BY_ID).label(MUSEUM, found)
    labels = {r.id.split("/")[1]: r.segments[0].relevance.value for r in records}  # type: ignore[union-attr]
    assert labels == {"gold": rf.RELEVANT, "easy-0": rf.IRRELEVANT, "hard-0": rf.IRRELEVANT}
    (easy,) = found.easy
    (hard,) = found.hard
    assert easy.title != "Paris"  # another article
    assert hard.title == "Paris" and hard.id != "paris-1-0"  # same article, no answer
    assert "louvre" not in hard.text.casefold() and "louvre" not in easy.text.casefold()
    # the hard negative is the best BM25 match of the article: it shares "capital of France" with the question
    assert hard.id in {"paris-0-0", "paris-2-0"}
    # a passage whose title names the answer holds the evidence: never a negative
    (france,) = evidence([FRANCE], NegativeMix(retrieved=0, hard=1)).values()
    assert france.hard == ()
    kinds = {r.meta["kind"] for r in records}
    assert kinds == {"gold", "easy", "hard"}


ARTICLE = [
    *PASSAGES,
    Passage("paris-3-0", "Paris", "The city's metro has sixteen lines."),
    Passage("paris-4-0", "Paris", "Montmartre is a hill in the north of the city."),
    Passage("paris-5-0", "Paris", "The Louvre pyramid was added to the museum in 1989."),
]


def test_article_negatives_are_random_same_article_passages_without_the_answer() -> None:
    by_id = {p.id: p for p in ARTICLE}

    def drawn(mix: NegativeMix, question: Query = MUSEUM) -> Evidence:
        (found,) = find_evidence([question], BM25Retriever(ARTICLE), by_id, mix, depth=10)
        return found

    found = drawn(NegativeMix(retrieved=0, hard=1, article=2))
    (hard,) = found.hard
    assert len(found.article) == 2
    for passage in found.article:
        assert passage.title == "Paris"  # the question's own article
        assert passage.id not in {"paris-1-0", hard.id}  # not its paragraph, not its hard negative
        assert "louvre" not in passage.text.casefold()  # no answer: "paris-5-0" names the Louvre
    # seeded by the question id and the run's seed: the same draw every time, another with another seed
    assert drawn(NegativeMix(retrieved=0, hard=1, article=2)).article == found.article
    draws = {drawn(NegativeMix(retrieved=0, hard=1, article=1, seed=seed)).article for seed in range(12)}
    assert len(draws) > 1
    # the closest match goes to `hard`; without hard negatives it can be drawn as an article negative
    alone = {p.id for seed in range(12) for p in drawn(NegativeMix(retrieved=0, article=1, seed=seed)).article}
    assert hard.id in alone and "paris-5-0" not in alone
    # fewer safe passages than asked: all of them, no repeats
    (few,) = find_evidence([ROME], BM25Retriever(ARTICLE), by_id, NegativeMix(retrieved=0, article=5), depth=10)
    assert [p.id for p in few.article] == ["rome-0-0"]
    records = GoldLabeler(by_id).label(MUSEUM, found)
    article = [r for r in records if r.meta["kind"] == "article"]
    assert [r.id.split("/")[1] for r in article] == ["article-0", "article-1"]
    assert {r.segments[0].relevance.value for r in article} == {rf.IRRELEVANT}  # type: ignore[union-attr]


def test_erased_negative_is_the_gold_passage_without_its_answers_sentence() -> None:
    gold = Passage("seine-0-0", "Seine", "The Seine flows through Paris. It froze in 1895 during a cold winter. "
                   "Barges still carry sand and gravel on it.")
    frozen = query("q-frozen", "When did the Seine freeze?", ("1895",), ("seine-0-0",), "Seine", ["seine-0-0"])
    by_id = {**BY_ID, gold.id: gold}
    (found,) = find_evidence([frozen], BM25Retriever([*PASSAGES, gold]), by_id, NegativeMix(retrieved=0, erased=1))
    (erased,) = found.erased
    # a minimal pair: the same title and the other sentences, in order; only the answer's sentence is gone
    assert erased.title == "Seine" and erased.id == "seine-0-0#erased"
    assert erased.text == "The Seine flows through Paris. Barges still carry sand and gravel on it."
    (record,) = [r for r in GoldLabeler(by_id).label(frozen, found) if r.meta["kind"] == "erased"]
    assert record.id == "q-frozen/erased-0"
    assert record.segments[0].relevance.value == rf.IRRELEVANT  # type: ignore[union-attr]
    assert record.segments[0].text == ABSTAIN_TEXT and record.meta["untrained_text"] is True
    # off by default; unanswerable questions have no gold passage to erase
    assert find_evidence([frozen], BM25Retriever(PASSAGES), by_id, NegativeMix(retrieved=0))[0].erased == ()
    (none,) = find_evidence([UNANSWERABLE], BM25Retriever(PASSAGES), BY_ID, NegativeMix(retrieved=0, erased=1))
    assert none.erased == ()


def test_off_answer_negative_is_a_true_sentence_of_the_gold_passage_rated_useless_and_never_trained() -> None:
    gold = Passage("seine-0-0", "Seine", "The Seine flows through Paris. It froze in 1895 during a cold winter. "
                   "Barges still carry sand and gravel on it.")
    frozen = query("q-frozen", "When did the Seine freeze?", ("1895",), ("seine-0-0",), "Seine", ["seine-0-0"])
    by_id = {**BY_ID, gold.id: gold}
    mix = NegativeMix(retrieved=0, off_answer=2)
    (found,) = find_evidence([frozen], BM25Retriever([*PASSAGES, gold]), by_id, mix)
    # the passage's own sentences that state no answer, in passage order (the first one: what a copying model writes)
    assert found.off_answer == ("The Seine flows through Paris.", "Barges still carry sand and gravel on it.")
    records = GoldLabeler(by_id).label(frozen, found)
    off = [r for r in records if r.meta["kind"] == "off-answer"]
    assert [r.id for r in off] == ["q-frozen/off-answer-0", "q-frozen/off-answer-1"]
    for record, sentence in zip(off, found.off_answer, strict=True):
        (segment,) = record.segments
        assert segment.passage == gold and segment.text == sentence
        # relevant passage, supported sentence: only utility says it answers nothing
        assert segment.relevance.value == rf.RELEVANT  # type: ignore[union-attr]
        assert segment.support.value == rf.FULLY_SUPPORTED  # type: ignore[union-attr]
        assert record.utility.value == rf.UTILITY_TOKENS[0]  # type: ignore[union-attr]
        assert record.meta["untrained_text"] is True  # rated, never written
    (gold_record,) = [r for r in records if r.meta["kind"] == "gold"]
    assert gold_record.utility.value == rf.UTILITY_TOKENS[-1]  # type: ignore[union-attr]
    # off by default; one asked for gives the first; unanswerable questions have no gold passage
    assert find_evidence([frozen], BM25Retriever(PASSAGES), by_id, NegativeMix(retrieved=0))[0].off_answer == ()
    one = find_evidence([frozen], BM25Retriever(PASSAGES), by_id, NegativeMix(retrieved=0, off_answer=1))[0]
    assert one.off_answer == ("The Seine flows through Paris.",)
    (none,) = find_evidence([UNANSWERABLE], BM25Retriever(PASSAGES), BY_ID, NegativeMix(retrieved=0, off_answer=1))
    assert none.off_answer == ()


def test_off_answer_sentences_are_drawn_only_where_a_sentence_shows_the_answer() -> None:
    passage = Passage("p", "Louvre", "The Louvre opened in 1793. Closed. It was a royal palace before the museum.")
    # a fragment under four words is no sentence to rate
    assert off_answer_sentences(passage, ["1793"], 5) == ("It was a royal palace before the museum.",)
    # the answer only in the title, or in no sentence: nothing shows which sentences miss it
    assert off_answer_sentences(passage, ["Louvre museum"], 5) == ()
    assert off_answer_sentences(Passage("t", "1793", "It was a royal palace before the museum."), ["1793"], 5) == ()


def test_erase_answers_refuses_what_would_not_be_a_clean_negative() -> None:
    passage = Passage("p", "Louvre", "The Louvre opened in 1793. It was a royal palace before. Its pyramid is glass.")
    assert erase_answers(passage, ["1793"]) == Passage(
        "p#erased", "Louvre", "It was a royal palace before. Its pyramid is glass.")
    # every sentence states the answer, or none does (the answer only in the title): nothing to erase
    assert erase_answers(Passage("p", "T", "In 1793 it opened. By 1793 it was full."), ["1793"]) is None
    assert erase_answers(passage, ["Louvre"]) is None  # the title names it: what is left still mentions it
    assert erase_answers(passage, ["1066"]) is None
    # too little left to be a passage
    assert erase_answers(Passage("p", "T", "It opened in 1793. Then it rained."), ["1793"]) is None
    # an abbreviation inside the answer's sentence does not end it ("St. Louis" stays whole, selfrag.sentences)
    fair = Passage("p", "T", "The fair was held in St. Louis in 1904. Millions came to see the exhibits there.")
    assert erase_answers(fair, ["St. Louis"]) == Passage("p#erased", "T", "Millions came to see the exhibits there.")
    # an answer across a sentence boundary is in no one sentence: refused, never a passage that still names it
    spring = Passage("p", "T", "The fair opened in May. June brought millions of visitors to see the exhibits.")
    assert erase_answers(spring, ["May. June"]) is None
    # every alias is erased, case-insensitively
    two = Passage("p", "T", "The museum opened in 1793. The Palais du Louvre was its name. "
                  "Visitors came from all over Europe to see it.")
    assert erase_answers(two, ["1793", "palais du louvre"]) == Passage(
        "p#erased", "T", "Visitors came from all over Europe to see it.")


def test_unanswerable_has_no_relevant_passage() -> None:
    (found,) = evidence([UNANSWERABLE], NegativeMix(retrieved=1)).values()
    records = GoldLabeler(BY_ID).label(UNANSWERABLE, found)
    assert all(r.segments[0].relevance.value == rf.IRRELEVANT for r in records)  # type: ignore[union-attr]
    assert records[0].segments[0].passage.id == "paris-0-0"  # type: ignore[union-attr]  # its own paragraph


def test_support_negative_uses_an_answer_of_the_same_form() -> None:
    pool = [FRANCE, ROME, LOUVRE, FOUNDED]
    found = evidence(pool, NegativeMix(retrieved=0, support=1))
    records = GoldLabeler(BY_ID).label(LOUVRE, found["q-louvre"])
    negative = next(r for r in records if r.meta["kind"] == "support-negative")
    segment = negative.segments[0]
    assert segment.text == "753"  # the only other number-shaped answer
    assert answer_form(segment.text).split("/")[0] == answer_form("1793").split("/")[0] == "number"
    assert segment.passage.id == "paris-1-0"  # type: ignore[union-attr]  # the gold passage
    assert segment.relevance.value == rf.RELEVANT  # type: ignore[union-attr]
    assert segment.support.value == rf.NO_SUPPORT  # type: ignore[union-attr]
    assert negative.meta["untrained_text"] is True  # judged, never trained to say
    names = GoldLabeler(BY_ID).label(FRANCE, found["q-france"])
    wrong = next(r for r in names if r.meta["kind"] == "support-negative").segments[0].text
    assert wrong == "Romulus"  # a one-word name for a one-word name


def test_abstain_text_after_irrelevant_is_untrained_unless_asked() -> None:
    (found,) = evidence([FRANCE], NegativeMix(retrieved=1)).values()
    distractor = GoldLabeler(BY_ID).label(FRANCE, found)[1]
    assert distractor.segments[0].text == ABSTAIN_TEXT and distractor.meta["untrained_text"] is True
    trained = GoldLabeler(BY_ID, train_abstain_text=True).label(FRANCE, found)[1]
    assert "untrained_text" not in trained.meta
    gold = GoldLabeler(BY_ID).label(FRANCE, found)[0]
    assert "untrained_text" not in gold.meta


def test_untrained_text_is_masked_but_reflection_tokens_are_trained(tiny_tokenizer, tiny_model_builder) -> None:  # type: ignore[no-untyped-def]
    import copy

    from selfrag.training.dataset import IGNORE, encode_record
    from selfrag.training.tokens import prepare_tokens

    tokenizer = copy.deepcopy(tiny_tokenizer)
    token_ids = prepare_tokens(tiny_model_builder(len(tokenizer)), tokenizer, "add")
    (found,) = evidence([FRANCE], NegativeMix(retrieved=1)).values()
    masked, plain = (
        GoldLabeler(BY_ID).label(FRANCE, found)[1],
        GoldLabeler(BY_ID, train_abstain_text=True).label(FRANCE, found)[1],
    )
    a = encode_record(masked, tokenizer, token_ids, "auto")
    b = encode_record(plain, tokenizer, token_ids, "auto")
    assert a["input_ids"] == b["input_ids"]
    trained_a = [t for t in a["labels"] if t != IGNORE]
    trained_b = [t for t in b["labels"] if t != IGNORE]
    reflection = [t for t in trained_b if token_ids.token(t) is not None]
    assert [t for t in trained_a if token_ids.token(t) is not None] == reflection
    assert token_ids.id(rf.IRRELEVANT) in reflection and token_ids.id(rf.NO_SUPPORT) in reflection
    text_a = [t for t in trained_a if token_ids.token(t) is None]
    assert text_a == [tokenizer.eos_token_id]  # only the closing EOS; the abstain words are masked
    assert len(trained_b) > len(trained_a)


def begin_query(qid: str, support: str | None, output: str | None = "Paris is the capital of France.") -> Query:
    """A BEGIN-style query: a dialogue turn, a response judged against its knowledge snippet (the gold passage)."""
    meta: dict[str, Any] = {"split": "train", "source": "begin"}
    if support is not None:
        meta["support"] = support
    return Query(qid, "I would love to visit France one day.", (), True, ("paris-0-0",), True, meta, output)


def test_judged_output_keeps_the_data_sets_support_label() -> None:
    labeler = GoldLabeler(BY_ID)
    (supported,) = labeler.label(begin_query("b-yes", rf.FULLY_SUPPORTED), Evidence(()))
    assert supported.id == "b-yes/response" and supported.meta["kind"] == "gold"
    assert supported.render() == (
        "[Retrieval]<paragraph>Paris\nParis is the capital of France. It lies on the Seine.</paragraph>"
        "[Relevant]Paris is the capital of France.[Fully supported][Utility:5]"
    )
    assert "untrained_text" not in supported.meta  # a supported response is trained like a gold answer
    wrong = "Paris lies on the Danube."
    (unsupported,) = labeler.label(begin_query("b-no", rf.NO_SUPPORT, wrong), Evidence(()))
    assert unsupported.render() == (
        "[Retrieval]<paragraph>Paris\nParis is the capital of France. It lies on the Seine.</paragraph>"
        f"[Relevant]{wrong}[No support / Contradictory][Utility:1]"
    )
    assert unsupported.meta["kind"] == "support-negative"
    assert unsupported.meta["untrained_text"] is True  # judged, never trained to say
    assert all(label.labeler == "gold" for label in (unsupported.utility, unsupported.segments[0].support))  # type: ignore[union-attr]


def test_judged_output_problems() -> None:
    labeler = GoldLabeler(BY_ID)
    assert labeler.problem(begin_query("b", rf.NO_SUPPORT)) is None
    assert labeler.problem(begin_query("b", rf.NO_SUPPORT, output=None)) == "meta.support without output"
    no_passage = Query("b", "Hi?", (), True, (), True, {"support": rf.FULLY_SUPPORTED}, "Hello.")
    assert labeler.problem(no_passage) == "meta.support without gold passage"
    assert labeler.problem(begin_query("b", None)) == "answerable without answers"  # no support label: as before
