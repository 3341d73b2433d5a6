"""Build the demo data shipped in ``data_gen/demo/`` from SQuAD v2.0 and GSM8K (a dev-time script).

    python scripts/make_demo_data.py \\
        --squad /work/shared/data/squad_v2/dev-v2.0.cs224n_half.json \\
        --gsm8k /work/shared/data/gsm8k/test.jsonl \\
        --out data_gen/demo

Writes ``corpus.jsonl`` (id, title, text), ``queries.jsonl`` (id, question, answers, answerable,
gold_passage_ids, needs_retrieval, meta.split, meta.source) and ``SOURCE.md``. The output depends only
on the inputs and ``--seed``: running it twice gives byte-identical files. The product never runs this;
it reads the files it wrote.

Passages are SQuAD contexts cut into chunks of whole sentences of at most ``--max-words`` words, so
training examples stay short. A question whose answer span crosses a chunk boundary is skipped.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Abbreviations after which a full stop does not end a sentence.
ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "no.", "vs.", "c.", "ca.", "e.g.", "i.e.", "inc."}
SENTENCE_END = re.compile(r"""[.!?]["')\]]*\s+(?=["'(\[]?[A-Z0-9])""")


@dataclass(frozen=True)
class Chunk:
    id: str
    start: int  # character offsets into the paragraph's context
    end: int
    text: str


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def sentence_spans(context: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of ``context`` (whitespace between them belongs to neither)."""
    spans, start = [], 0
    for match in SENTENCE_END.finditer(context):
        words = context[start : match.start() + 1].split()
        last = words[-1].lower() if words else ""
        if last in ABBREVIATIONS or re.fullmatch(r"(?:[a-z]\.)+", last):  # "U.S.", "St."
            continue
        end = match.end() - len(match.group(0)) + len(match.group(0).rstrip())
        spans.append((start, end))
        start = match.end()
    if context[start:].strip():
        spans.append((start, len(context.rstrip())))
    return spans


def chunk_context(context: str, prefix: str, max_words: int) -> list[Chunk]:
    """Greedy chunks of whole sentences, each at most ``max_words`` words (a longer sentence stands alone)."""
    groups: list[list[tuple[int, int]]] = [[]]
    words = 0
    for span in sentence_spans(context):
        count = len(context[span[0] : span[1]].split())
        if groups[-1] and words + count > max_words:
            groups.append([])
            words = 0
        groups[-1].append(span)
        words += count
    chunks = []
    for number, group in enumerate(g for g in groups if g):
        start, end = group[0][0], group[-1][1]
        chunks.append(Chunk(f"{prefix}-{number}", start, end, context[start:end]))
    return chunks


def unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(item.strip() for item in items if item.strip()))


def squad_candidates(article: dict[str, Any], max_words: int) -> Iterator[tuple[str, list[Chunk], dict[str, Any]]]:
    """Yield ``(paragraph key, chunks, query row)`` for every usable question of one article."""
    title = article["title"]
    for para_number, paragraph in enumerate(article["paragraphs"]):
        key = f"{slug(title)}-{para_number}"
        chunks = chunk_context(paragraph["context"], key, max_words)
        own_ids = [chunk.id for chunk in chunks]
        for qa in paragraph["qas"]:
            row: dict[str, Any] = {"id": f"squad-{qa['id']}", "question": qa["question"].strip()}
            meta = {"source": "squad_v2", "squad_id": qa["id"], "title": title, "own_passage_ids": own_ids}
            if qa["is_impossible"]:
                row.update(answers=[], answerable=False, gold_passage_ids=[], needs_retrieval=True, meta=meta)
                yield key, chunks, row
                continue
            first = qa["answers"][0]
            span = (first["answer_start"], first["answer_start"] + len(first["text"]))
            gold = [c for c in chunks if c.start <= span[0] and span[1] <= c.end]
            if not gold:  # the answer crosses a chunk boundary
                continue
            answers = unique([first["text"]] + [a["text"] for a in qa["answers"]])
            row.update(answers=answers, answerable=True, gold_passage_ids=[gold[0].id], needs_retrieval=True, meta=meta)
            yield key, chunks, row


def pick_squad(
    articles: list[dict[str, Any]], rng: random.Random, test_articles: int, unanswerable_fraction: float, max_words: int
) -> tuple[list[dict[str, Any]], list[Chunk], dict[str, str]]:
    """Every usable question, split by article (test articles are never seen in training), all chunks, titles.

    Every answerable question whose answer lies inside one chunk is kept; unanswerable questions are drawn to
    make ``unanswerable_fraction`` of each split. Rows are shuffled (seeded) so that a ``limit`` takes a mix.
    """
    titles_sorted = sorted(article["title"] for article in articles)
    test_titles = set(rng.sample(titles_sorted, test_articles))
    chunks: list[Chunk] = []
    titles: dict[str, str] = {}
    seen: set[str] = set()
    by_split: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {"train": ([], []), "test": ([], [])}
    for article in articles:
        split = "test" if article["title"] in test_titles else "train"
        for key, paragraph_chunks, row in squad_candidates(article, max_words):
            if key not in seen:
                seen.add(key)
                chunks += paragraph_chunks
                titles.update({c.id: article["title"].replace("_", " ") for c in paragraph_chunks})
            row["meta"] = {"split": split, **row["meta"]}
            by_split[split][0 if row["answerable"] else 1].append(row)
    rows = []
    for split in ("train", "test"):
        answerable, unanswerable = by_split[split]
        wanted = round(len(answerable) * unanswerable_fraction / (1 - unanswerable_fraction))
        chosen = answerable + rng.sample(unanswerable, min(wanted, len(unanswerable)))
        rng.shuffle(chosen)
        rows += chosen
    return rows, chunks, titles


def pick_gsm8k(path: Path, rng: random.Random, train: int, test: int) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    numbers = sorted(rng.sample(range(len(lines)), train + test))
    rng.shuffle(numbers)
    rows = []
    for position, number in enumerate(numbers):
        item = lines[number]
        answer = item["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        split = "test" if position < test else "train"
        rows.append(
            {
                "id": f"gsm8k-{number}",
                "question": item["question"].strip(),
                "answers": [answer],
                "answerable": True,
                "gold_passage_ids": [],
                "needs_retrieval": False,
                "meta": {"split": split, "source": "gsm8k", "line": number + 1},
            }
        )
    return rows


#: Questions any instruction-tuned model answers from what it knows: the no-retrieval class is not only
#: arithmetic. Written for this project (CC0); answers are textbook facts.
GENERAL_KNOWLEDGE: list[tuple[str, str]] = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("Which planet is closest to the Sun?", "Mercury"),
    ("Which planet is known as the Red Planet?", "Mars"),
    ("What is the chemical symbol for water?", "H2O"),
    ("What is the chemical symbol for gold?", "Au"),
    ("What gas do plants take in from the air to make food?", "Carbon dioxide"),
    ("How many days are there in a week?", "Seven"),
    ("How many continents are there?", "Seven"),
    ("How many legs does a spider have?", "Eight"),
    ("What is the freezing point of water in degrees Celsius?", "0 degrees Celsius"),
    ("What is the boiling point of water at sea level in degrees Celsius?", "100 degrees Celsius"),
    ("Who wrote Romeo and Juliet?", "William Shakespeare"),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci"),
    ("What is the largest ocean on Earth?", "The Pacific Ocean"),
    ("What is the opposite of hot?", "Cold"),
    ("What colour do you get by mixing blue and yellow?", "Green"),
    ("What is the plural of mouse?", "Mice"),
    ("What is the past tense of go?", "Went"),
    ("Which animal is known as the king of the jungle?", "The lion"),
    ("What do bees make?", "Honey"),
    ("What is the tallest animal in the world?", "The giraffe"),
    ("Which organ pumps blood through the human body?", "The heart"),
    ("How many hours are there in a day?", "24"),
    ("What is the largest mammal?", "The blue whale"),
    ("What language is mainly spoken in Brazil?", "Portuguese"),
    ("What is the main language spoken in Mexico?", "Spanish"),
    ("Which star is at the centre of our solar system?", "The Sun"),
    ("What is the currency of the United States?", "The US dollar"),
    ("Write a greeting to a friend.", "Hello! It is great to hear from you. How have you been?"),
    ("Say thank you in French.", "Merci."),
    ("Give me a synonym for happy.", "Joyful"),
    ("Translate 'good morning' into Spanish.", "Buenos dias."),
    ("Name a primary colour.", "Red"),
    ("What shape has three sides?", "A triangle"),
]


def pick_general(rng: random.Random, test: int) -> list[dict[str, Any]]:
    """The general-knowledge no-retrieval questions, ``test`` of them held out."""
    order = list(range(len(GENERAL_KNOWLEDGE)))
    rng.shuffle(order)
    rows = []
    for position, number in enumerate(order):
        question, answer = GENERAL_KNOWLEDGE[number]
        rows.append(
            {
                "id": f"general-{number}",
                "question": question,
                "answers": [answer],
                "answerable": True,
                "gold_passage_ids": [],
                "needs_retrieval": False,
                "meta": {"split": "test" if position < test else "train", "source": "general"},
            }
        )
    return rows


SOURCE_MD = """# Demo data: source and licences

Made by `scripts/make_demo_data.py` (seed {seed}); do not edit by hand.

- `corpus.jsonl`: {passages} passages, chunks of whole sentences (at most {max_words} words) of every
  paragraph of {article_count} SQuAD v2.0 articles.
- `queries.jsonl`: {squad_train} + {squad_test} SQuAD v2.0 questions (train + test; every answerable question
  whose answer lies inside one chunk, plus unanswerable ones for about {unanswerable:.0%}), split **by
  article**: test questions come from {test_articles} articles no train question uses ({test_titles}).
  No retrieval needed: {gsm_train} + {gsm_test} GSM8K questions (the answer is the number after `####`) and
  {general_train} + {general_test} general-knowledge questions written for this project (CC0).
  Rows are shuffled (seeded) within each split, so `limit=N` takes a mix.

## SQuAD v2.0

Rajpurkar, Jia and Liang (2018), "Know What You Don't Know: Unanswerable Questions for SQuAD", ACL.
Licence: CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/). Taken from the CS224n half
of the official dev set (chrischute/squad, `data/dev-v2.0.json`). Changes: contexts split into
sentence chunks; questions sampled; answers kept as given. The derived `corpus.jsonl` and the SQuAD
rows of `queries.jsonl` are shared under the same licence.

## GSM8K

Cobbe et al. (2021), "Training Verifiers to Solve Math Word Problems", OpenAI
(openai/grade-school-math, `grade_school_math/data/test.jsonl`). Licence: MIT. Changes: questions
sampled; the answer is the final number after `####` (thousands separators removed).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squad", type=Path, default=Path("/work/shared/data/squad_v2/dev-v2.0.cs224n_half.json"))
    parser.add_argument("--gsm8k", type=Path, default=Path("/work/shared/data/gsm8k/test.jsonl"))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data_gen" / "demo")
    parser.add_argument("--articles", type=int, default=16, help="SQuAD articles to draw questions and passages from")
    parser.add_argument("--test-articles", type=int, default=5, help="articles whose questions are all held out")
    parser.add_argument("--unanswerable", type=float, default=0.2, help="fraction of unanswerable SQuAD questions")
    parser.add_argument("--gsm8k-train", type=int, default=50)
    parser.add_argument("--gsm8k-test", type=int, default=10)
    parser.add_argument("--general-test", type=int, default=10)
    parser.add_argument("--max-words", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    articles = json.loads(args.squad.read_text(encoding="utf-8"))["data"]
    articles = sorted(rng.sample(articles, args.articles), key=lambda a: a["title"])
    squad, chunks, titles = pick_squad(articles, rng, args.test_articles, args.unanswerable, args.max_words)
    gsm8k = pick_gsm8k(args.gsm8k, rng, args.gsm8k_train, args.gsm8k_test)
    general = pick_general(rng, args.general_test)

    args.out.mkdir(parents=True, exist_ok=True)
    corpus = [{"id": c.id, "title": titles[c.id], "text": c.text} for c in chunks]
    no_retrieval = sorted(gsm8k + general, key=lambda row: row["id"])
    rng.shuffle(no_retrieval)
    mixed = {split: [r for r in squad if r["meta"]["split"] == split] for split in ("train", "test")}
    for row in no_retrieval:  # spread the no-retrieval rows evenly through their split
        rows = mixed[row["meta"]["split"]]
        rows.insert(rng.randrange(len(rows) + 1), row)
    queries = mixed["train"] + mixed["test"]
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (args.out / name).write_text(text, encoding="utf-8")
    count = {(r["meta"]["source"], r["meta"]["split"]): 0 for r in queries}
    for row in queries:
        count[row["meta"]["source"], row["meta"]["split"]] += 1
    test_titles = sorted({r["meta"]["title"].replace("_", " ") for r in squad if r["meta"]["split"] == "test"})
    source = SOURCE_MD.format(
        seed=args.seed,
        passages=len(corpus),
        max_words=args.max_words,
        article_count=len(articles),
        unanswerable=args.unanswerable,
        test_articles=len(test_titles),
        test_titles=", ".join(test_titles),
        squad_train=count["squad_v2", "train"],
        squad_test=count["squad_v2", "test"],
        gsm_train=count["gsm8k", "train"],
        gsm_test=count["gsm8k", "test"],
        general_train=count["general", "train"],
        general_test=count["general", "test"],
    )
    (args.out / "SOURCE.md").write_text(source, encoding="utf-8")
    words = sum(len(c.text.split()) for c in chunks) / len(chunks)
    print(f"wrote {len(corpus)} passages (mean {words:.1f} words) and {len(queries)} queries {count} to {args.out}")


if __name__ == "__main__":
    main()
