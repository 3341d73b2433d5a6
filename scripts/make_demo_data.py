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
    articles: list[dict[str, Any]], rng: random.Random, train: int, test: int, max_words: int
) -> tuple[list[dict[str, Any]], list[Chunk], dict[str, str]]:
    """Questions (train from some paragraphs, test from others), all chunks of their articles, and titles."""
    per_paragraph: dict[str, list[dict[str, Any]]] = {}
    chunks: list[Chunk] = []
    titles: dict[str, str] = {}
    for article in articles:
        for key, paragraph_chunks, row in squad_candidates(article, max_words):
            if key not in per_paragraph:
                per_paragraph[key] = []
                chunks += paragraph_chunks
                titles.update({c.id: article["title"].replace("_", " ") for c in paragraph_chunks})
            per_paragraph[key].append(row)
    keys = sorted(per_paragraph)
    rng.shuffle(keys)
    # At most one answerable and one unanswerable question per paragraph: more paragraphs, more variety.
    rows = []
    for split, count, pool in (("test", test, keys[: len(keys) // 6]), ("train", train, keys[len(keys) // 6 :])):
        answerable, unanswerable = [], []
        for key in pool:
            candidates = per_paragraph[key]
            rng.shuffle(candidates)
            answerable += [r for r in candidates if r["answerable"]][:1]
            unanswerable += [r for r in candidates if not r["answerable"]][:1]
        wanted_unanswerable = count // 3
        chosen = answerable[: count - wanted_unanswerable] + unanswerable[:wanted_unanswerable]
        for row in chosen:
            row["meta"] = {"split": split, **row["meta"]}
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


SOURCE_MD = """# Demo data: source and licences

Made by `scripts/make_demo_data.py` (seed {seed}); do not edit by hand.

- `corpus.jsonl`: {passages} passages, chunks of whole sentences (at most {max_words} words) of every
  paragraph of the SQuAD v2.0 articles the questions come from: {articles}.
- `queries.jsonl`: {squad_train} + {squad_test} SQuAD v2.0 questions (train + test; about a third
  unanswerable) and {gsm_train} + {gsm_test} GSM8K questions (no retrieval needed; the answer is the
  number after `####`). Test questions come from paragraphs that no train question uses.

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
    parser.add_argument("--articles", type=int, default=9, help="SQuAD articles to draw questions and passages from")
    parser.add_argument("--squad-train", type=int, default=260)
    parser.add_argument("--squad-test", type=int, default=40)
    parser.add_argument("--gsm8k-train", type=int, default=50)
    parser.add_argument("--gsm8k-test", type=int, default=10)
    parser.add_argument("--max-words", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    articles = json.loads(args.squad.read_text(encoding="utf-8"))["data"]
    articles = sorted(rng.sample(articles, args.articles), key=lambda a: a["title"])
    squad, chunks, titles = pick_squad(articles, rng, args.squad_train, args.squad_test, args.max_words)
    gsm8k = pick_gsm8k(args.gsm8k, rng, args.gsm8k_train, args.gsm8k_test)

    args.out.mkdir(parents=True, exist_ok=True)
    corpus = [{"id": c.id, "title": titles[c.id], "text": c.text} for c in chunks]
    queries = sorted(squad + gsm8k, key=lambda row: (row["meta"]["split"] != "train", row["id"]))
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (args.out / name).write_text(text, encoding="utf-8")
    count = {(r["meta"]["source"], r["meta"]["split"]): 0 for r in queries}
    for row in queries:
        count[row["meta"]["source"], row["meta"]["split"]] += 1
    source = SOURCE_MD.format(
        seed=args.seed,
        passages=len(corpus),
        max_words=args.max_words,
        articles=", ".join(a["title"].replace("_", " ") for a in articles),
        squad_train=count["squad_v2", "train"],
        squad_test=count["squad_v2", "test"],
        gsm_train=count["gsm8k", "train"],
        gsm_test=count["gsm8k", "test"],
    )
    (args.out / "SOURCE.md").write_text(source, encoding="utf-8")
    words = sum(len(c.text.split()) for c in chunks) / len(chunks)
    print(f"wrote {len(corpus)} passages (mean {words:.1f} words) and {len(queries)} queries {count} to {args.out}")


if __name__ == "__main__":
    main()
