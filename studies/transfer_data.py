"""Write the transfer study's dev and test questions (``studies/transfer/``) from public files (``../shared/data``).

    python studies/transfer_data.py ../shared/data studies/transfer
    python studies/transfer_data.py ../shared/data studies/transfer --popqa-longtail popqa_longtail_w_gs_example.jsonl

Each file is ``selfrag eval``'s QA form, ``{"id", "question", "answers", "ctxs", "answerable", "meta"}``, with exactly
the three passages every mode reads (``inference.top_k=3``): the source's own retrieved passages where it ranks them
(PopQA, TriviaQA and RetrievalQA's news questions, as RetrievalQA ships them), else the top three of BM25 over the
question's own pool (HotpotQA: its ten context paragraphs; NQ-open: the oracle passages of 400 questions, its own
among them). A question is ``answerable`` when a gold string occurs in one of its three passages (those are its
``gold_passage_ids``: relevant means "holds the answer", which ``selfrag calibrate`` reads): then abstaining is a false
abstain; otherwise abstaining is right. None of these questions is in a shipped training slice (``data_gen/slices``:
the first 40 HotpotQA, the first 60 NQ-open and the first 60 RetrievalQA items):

* test (read once per change, never to choose): ``popqa`` (RetrievalQA's 50 PopQA questions), ``triviaqa`` (its 50
  TriviaQA ones), ``hotpotqa`` (HotpotQA dev-distractor items 41-100 without yes/no answers);
* dev (every choice is read here): ``nq-open`` (oracle items 61-160), ``retrievalqa`` (its news questions 61-100),
  and with ``--popqa-longtail`` ``popqa-dev``: the questions of a Self-RAG-format PopQA long-tail file
  (``popqa_longtail_w_gs.jsonl``'s first 100 lines, as minqi1/S2RAG ships them in
  ``data_eval/popqa_longtail_w_gs_example.jsonl``) that the ``popqa`` test set does not hold, each with the file's
  own top three Contriever passages. RetrievalQA's PopQA part is drawn from the same file's head and carries the same
  three passages, so ``popqa-dev`` is the test set's distribution (same-surname namesake passages) on other people.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TOP_K = 3
SPLITS = {"popqa": "test", "triviaqa": "test", "hotpotqa": "test", "nq-open": "dev", "retrievalqa": "dev",
          "popqa-dev": "dev"}


def literal(value: Any) -> Any:
    return ast.literal_eval(value) if isinstance(value, str) and value[:1] in "[{" else value


def normalized(text: str) -> str:
    import re
    import string

    text = "".join(" " if c in string.punctuation else c for c in text.lower())
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def holds(passages: Sequence[dict[str, str]], answers: Sequence[str]) -> bool:
    texts = [f" {normalized(p['title'] + ' ' + p['text'])} " for p in passages]
    return any(normalized(a) and f" {normalized(a)} " in text for a in answers for text in texts)


def row(source: str, number: int, question: str, answers: Sequence[str], ctxs: list[dict[str, str]]) -> dict[str, Any]:
    ctxs = [{"id": f"{source}-{number}/{i}", "title": c["title"], "text": c["text"]}
            for i, c in enumerate(ctxs[:TOP_K])]
    gold = [c["id"] for c in ctxs if holds([c], answers)]  # relevant: the passage holds the answer
    return {"id": f"{source}-{number}", "question": question, "answers": list(answers), "ctxs": ctxs,
            "answerable": bool(gold), "gold_passage_ids": gold, "meta": {"source": source, "split": SPLITS[source]}}


def bm25_top(question: str, pool: list[dict[str, str]], k: int = TOP_K) -> list[dict[str, str]]:
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([f"{p['title']} {p['text']}" for p in pool], show_progress=False),
                    show_progress=False)
    found, _ = retriever.retrieve(bm25s.tokenize([question], show_progress=False), k=min(k, len(pool)),
                                  show_progress=False)
    return [pool[int(i)] for i in found[0]]


def retrievalqa(data: Path, source: str, skip: int = 0, take: int | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (data / "retrievalqa" / "retrievalqa_gpt4.jsonl").open(encoding="utf-8")]
    sources = {"popqa": ("popqa",), "triviaqa": ("triviaqa",), "retrievalqa": ("realtimeqa", "freshqa")}[source]
    picked = [r for r in rows if r["data_source"] in ("realtimeqa", "freshqa")][skip:] if source == "retrievalqa" \
        else [r for r in rows if r["data_source"] in sources]
    out = []
    for number, item in enumerate(picked[:take], start=skip):
        context = [c if isinstance(c, dict) else {"title": "", "text": c} for c in literal(item["context"]) or []]
        context = [{"title": str(c.get("title") or ""), "text": str(c["text"]).strip()} for c in context
                   if isinstance(c.get("text"), str) and c["text"].strip()]
        out.append(row(source, number, item["question"], [str(a) for a in literal(item["ground_truth"])], context))
    return out


def hotpotqa(data: Path, skip: int = 40) -> list[dict[str, Any]]:
    items = json.loads((data / "hotpotqa" / "hotpot_dev_distractor_subset.json").read_text(encoding="utf-8"))
    out = []
    for number, item in enumerate(items[skip:], start=skip):
        if item["answer"].strip().lower() in ("yes", "no"):
            continue  # a yes/no answer "occurs" in almost any text: the gold metric cannot judge it
        context = literal(item["context"])
        pool = [{"title": title, "text": "".join(sentences)} for title, sentences in
                zip(context["title"], context["sentences"], strict=True)]
        out.append(row("hotpotqa", number, item["question"], [item["answer"]], bm25_top(item["question"], pool)))
    return out


def nq_open(data: Path, skip: int = 60, take: int = 100, pool_size: int = 400) -> list[dict[str, Any]]:
    with gzip.open(data / "nq_open_oracle" / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as handle:
        items = [json.loads(line) for line in handle][skip : skip + pool_size]
    pool = [{"title": c["title"], "text": c["text"]} for item in items for c in literal(item["ctxs"])]
    return [row("nq-open", number, item["question"], [str(a) for a in literal(item["answers"])],
                bm25_top(item["question"], pool))
            for number, item in enumerate(items[:take], start=skip)]


def popqa_longtail(path: Path, test: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The questions of a Self-RAG-format PopQA file (``question``, ``answers``, ``ctxs`` ranked by Contriever) that
    the test set does not hold, numbered by their line in the file."""
    held = {item["question"].strip().lower() for item in test}
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        item = json.loads(line)
        if item["question"].strip().lower() in held:
            continue
        ctxs = [{"title": str(c.get("title") or ""), "text": str(c["text"]).strip()} for c in item["ctxs"]]
        out.append(row("popqa-dev", number, item["question"], [str(a) for a in item["answers"]], ctxs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the shared data folder (../shared/data)")
    parser.add_argument("output", type=Path, help="where <source>.jsonl go (studies/transfer)")
    parser.add_argument("--popqa-longtail", type=Path,
                        help="a Self-RAG-format PopQA file: also write popqa-dev from its questions the test lacks")
    args = parser.parse_args()
    sets = {"popqa": retrievalqa(args.data, "popqa"), "triviaqa": retrievalqa(args.data, "triviaqa"),
            "hotpotqa": hotpotqa(args.data), "nq-open": nq_open(args.data),
            "retrievalqa": retrievalqa(args.data, "retrievalqa", skip=60)}
    if args.popqa_longtail:
        sets["popqa-dev"] = popqa_longtail(args.popqa_longtail, sets["popqa"])
    args.output.mkdir(parents=True, exist_ok=True)
    for name, rows in sets.items():
        path = args.output / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        answerable = sum(r["answerable"] for r in rows)
        print(f"{path}: {len(rows)} questions ({SPLITS[name]}), {answerable} answerable from their {TOP_K} passages")


if __name__ == "__main__":
    main()
