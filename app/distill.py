"""Self-distilled answers: the base model's own answer on the gold passage, kept wherever it holds the gold.

    python -m selfrag.app.distill data_gen/demo/queries.jsonl data_gen/demo/corpus.jsonl OUT.jsonl \\
        --model smollm2-135m-instruct --split train --limit 700 --extra data_gen/demo/general-knowledge.jsonl

Gold answers from span-extraction data (SQuAD) are bare spans; trained on them a small model answers like a span
extractor ("1944" to a question about what a person does) and loses the base model's answering. Here each
answerable question is asked the way plain RAG asks it (``selfrag eval``'s plain prompt) over its gold passage
alone, and a no-retrieval question the way the no-retrieval mode asks it. The answer becomes the question's
``output`` (the gold labeler trains it as the answer, :mod:`selfrag.data_gen.gold`):

* ``base``: the base model's answer, cut to its first sentences up to the one holding a gold answer, where it
  holds one (the paper's ``match``) and does not abstain;
* ``sentence``: otherwise the gold passage's sentence that holds the first gold answer (a whole sentence around the
  span, supported by construction);
* ``span``: otherwise (the span crosses sentences, or no passage) ``"{answer}."``.

``--form`` picks the answer form (every form falls back to ``sentence`` and then ``span`` where it has no answer):

* ``base`` (the default above): the base model answers as plain RAG asks, without the gold answer;
* ``reply``: the base model is given the question, the gold answer and the gold passage and writes one sentence that
  states the answer (:func:`reply_prompt`), kept only where that sentence holds a gold answer (normalised match),
  does not abstain and is supported by the gold passage (the overlap judge); each call is cached in the teacher call
  cache (SQLite, keyed by model, prompt and parameters: ``SELFRAG_TEACHER_CACHE``), so a rerun repeats no decode;
* ``template``: no model: a reply built from the question and the gold span (:func:`template_reply`), which holds
  the answer by construction;
* ``sentence``: no model: the gold passage's sentence around the span (the copied-sentence form; ``--sentences``).

The answers file is JSONL ``{"id", "output", "how"}`` (the data recipe's ``answers``); ``how`` says which form each
row got, and the counts are printed. Greedy decoding, so the same model and inputs give the same file. An OUT (or
OUT.base.jsonl) that this command did not write is refused before any work; its own earlier output is written again.

    python -m selfrag.app.distill data_gen/demo/queries.jsonl data_gen/demo/corpus.jsonl runs/answers-reply.jsonl \
        --form reply --split train --limit 600
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from selfrag.corpus import Query, load_corpus, load_queries
from selfrag.data_gen.answer_forms import template_reply
from selfrag.data_gen.gold import split_sentences
from selfrag.errors import SelfragError
from selfrag.fsutil import claim_output_file, mark_output_file
from selfrag.jsonl import write_jsonl_atomic
from selfrag.splits import in_split
from selfrag.trajectory import Passage

#: the base model's answer decode budget (the quickstart's runtime decodes at most 48 new tokens)
MAX_TOKENS = 48
FORMS = ("base", "reply", "template", "sentence")
#: how a user runs this module (an output file it did not write is refused, naming it)
COMMAND = "python -m selfrag.app.distill"
#: a reply is kept when at least this share of its content words occur in the gold passage (OverlapJudge)
SUPPORTED = 0.5
#: what ``reply`` asks the base model (the question, the gold answer and the passage filled in)
REPLY_PROMPT = (
    "Passage: {passage}\n\nQuestion: {question}\nCorrect answer: {answer}\n\n"
    "Reply to the question in one complete sentence that states the correct answer."
)


def fallback(query: Query, gold: Passage | None) -> tuple[str, str]:
    """A whole sentence around the gold span: the gold passage's sentence holding it, else the span itself."""
    from selfrag.evaluation.metrics import match

    answer = query.answers[0]
    if gold is not None:
        for sentence in split_sentences(gold.text):
            if match(sentence, [answer]):
                return sentence, "sentence"
    return (answer if answer.rstrip().endswith((".", "!", "?")) else f"{answer}."), "span"


def keep_base(text: str, golds: Sequence[str], abstain_text: str) -> str | None:
    """The base answer's first sentences up to the one holding a gold answer; None if none holds one."""
    from selfrag.evaluation.metrics import match
    from selfrag.evaluation.modes import is_abstention

    if not text or is_abstention(text, abstain_text):
        return None
    sentences = split_sentences(text) or [text]
    for end in range(1, len(sentences) + 1):
        if match(" ".join(sentences[end - 1 : end]), golds):
            return " ".join(sentences[:end])
    return None


def distill(queries: Sequence[Query], passages: dict[str, Passage], model: str, batch_size: int = 8,
            abstain_text: str = "The sources do not say.") -> list[dict[str, Any]]:
    """One answers row per answerable query (retrieval: over its first gold passage; no retrieval: the question)."""
    from tqdm import tqdm

    from selfrag.evaluation.counting import CountingEngine
    from selfrag.evaluation.data import Example
    from selfrag.evaluation.modes import ExampleRetriever, plain_runner
    from selfrag.inference.engines.hf import HFEngine
    from selfrag.models import resolve_model

    wanted = [q for q in queries if q.answerable and q.answers and q.output is None]
    golds = {q.id: passages.get(q.gold_passage_ids[0]) if q.gold_passage_ids else None for q in wanted}
    examples = []
    for q in wanted:
        gold = golds[q.id]
        ctxs: tuple[Passage, ...] = (gold,) if q.needs_retrieval is not False and gold is not None else ()
        examples.append(Example(id=q.id, question=q.question, answers=tuple(q.answers), ctxs=ctxs))
    engine = CountingEngine(HFEngine.plain(resolve_model(model)))  # EngineOptions' defaults
    retriever = ExampleRetriever(examples, None)
    runners = {rag: plain_runner(engine, retriever, 1, MAX_TOKENS, abstain_text, rag) for rag in (True, False)}
    rows: list[dict[str, Any]] = []
    with tqdm(total=len(examples), desc="distill", unit="question") as bar:
        for rag in (True, False):
            group = [(q, e) for q, e in zip(wanted, examples, strict=True) if bool(e.ctxs) == rag]
            for start in range(0, len(group), batch_size):
                batch = group[start : start + batch_size]
                for (query, _), record in zip(batch, runners[rag]([e for _, e in batch]), strict=True):
                    kept = keep_base(record["answer"], query.answers, abstain_text)
                    output, how = (kept, "base") if kept else fallback(query, golds[query.id])
                    rows.append({"id": query.id, "output": output, "how": how, "base_answer": record["answer"]})
                bar.update(len(batch))
    return rows


def reply_prompt(question: str, answer: str, passage: Passage | None) -> str:
    """The instruction ``--form reply`` gives the base model (see :data:`REPLY_PROMPT`)."""
    text = "(none)" if passage is None else passage.render()
    return REPLY_PROMPT.format(passage=text, question=question.strip(), answer=answer.strip())


def keep_reply(text: str, golds: Sequence[str], abstain_text: str, passage: Passage | None = None) -> str | None:
    """The reply's first sentence where it holds a gold answer (normalised match), does not abstain and, given the gold
    passage, is supported by it (the evaluation's overlap judge: at least half its content words are in the passage);
    else None."""
    from selfrag.evaluation.claims import OverlapJudge
    from selfrag.evaluation.metrics import match
    from selfrag.evaluation.modes import is_abstention

    first = (split_sentences(text.strip()) or [text.strip()])[0].strip()
    if not first or is_abstention(first, abstain_text) or not match(first, golds):
        return None
    if passage is not None and OverlapJudge.overlap(first, passage) < SUPPORTED:
        return None
    return first


def replies(queries: Sequence[Query], passages: dict[str, Passage], engine: Any, cache: Any,
            abstain_text: str = "The sources do not say.", batch_size: int = 8) -> list[dict[str, Any]]:
    """``--form reply``: one row per answerable query; the engine's reply where :func:`keep_reply` keeps it, else
    :func:`fallback`. ``cache`` (a :class:`~selfrag.data_gen.cache.CallCache`) holds every decode by model, prompt
    and parameters; a cached prompt is not decoded again."""
    from tqdm import tqdm

    from selfrag.data_gen.cache import CachedReply, call_key
    from selfrag.inference.engines.base import GenerationRequest
    from selfrag.prompting import encode_prompt

    wanted = [q for q in queries if q.answerable and q.answers and q.output is None]
    golds = {q.id: passages.get(q.gold_passage_ids[0]) if q.gold_passage_ids else None for q in wanted}
    prompts = {q.id: reply_prompt(q.question, q.answers[0], golds[q.id]) for q in wanted}
    params = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    keys = {q.id: call_key(engine.name, prompts[q.id], params) for q in wanted}
    texts = {q.id: hit.text for q in wanted if (hit := cache.get(keys[q.id])) is not None}
    todo = [q for q in wanted if q.id not in texts]
    with tqdm(total=len(todo), desc="reply", unit="question") as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            requests = [GenerationRequest(tuple(encode_prompt(engine.tokenizer, prompts[q.id], "auto")), MAX_TOKENS)
                        for q in batch]
            for query, generation in zip(batch, engine.generate(requests), strict=True):
                text = engine.tokenizer.decode(list(generation.token_ids), skip_special_tokens=True).strip()
                cache.put(keys[query.id], engine.name,
                          CachedReply(text, generation.prompt_tokens, len(generation.token_ids)))
                texts[query.id] = text
            bar.update(len(batch))
    rows = []
    for query in wanted:
        kept = keep_reply(texts[query.id], query.answers, abstain_text, golds[query.id])
        output, how = (kept, "reply") if kept else fallback(query, golds[query.id])
        rows.append({"id": query.id, "output": output, "how": how, "base_answer": texts[query.id]})
    return rows


def templates(queries: Sequence[Query]) -> list[dict[str, Any]]:
    """``--form template``: every answerable query answers with :func:`template_reply` of its first gold answer."""
    return [{"id": q.id, "output": template_reply(q.question, q.answers[0]), "how": "template", "base_answer": None}
            for q in queries if q.answerable and q.answers and q.output is None]


def sentences(queries: Sequence[Query], passages: dict[str, Passage]) -> list[dict[str, Any]]:
    """Without a model: each answerable retrieval question answers with the gold passage's sentence around its span."""
    rows = []
    for query in queries:
        if query.answerable and query.answers and query.output is None and query.needs_retrieval is not False:
            gold = passages.get(query.gold_passage_ids[0]) if query.gold_passage_ids else None
            output, how = fallback(query, gold)
            rows.append({"id": query.id, "output": output, "how": how, "base_answer": None})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m selfrag.app.distill", description=__doc__.split("\n")[0])
    parser.add_argument("queries", type=Path)
    parser.add_argument("corpus", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--split", default="train", help="meta.split to take (all: every query)")
    parser.add_argument("--limit", type=int, default=None, help="the first N queries of the split (as generate)")
    parser.add_argument("--extra", type=Path, action="append", default=[], help="more query files, taken whole")
    parser.add_argument("--sentences", action="store_true",
                        help="no model: every retrieval answer is the gold passage's sentence around the span "
                             "(the same as --form sentence)")
    parser.add_argument("--form", choices=FORMS, default="base",
                        help="base: the model's plain-RAG answer; reply: the model's one-sentence reply given the "
                             "gold answer (cached); template: a reply built from the question and the span; "
                             "sentence: the gold passage's sentence")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except SelfragError as error:  # a user's mistake (a file of theirs in the way, a malformed line): one line
        print(f"{parser.prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    # both files are the user's to keep unless this command wrote them: refused before any model loads
    outputs = (args.output, args.output.with_suffix(".base.jsonl"))
    for output in outputs:
        claim_output_file(output, COMMAND, key="output", inputs=[args.queries, args.corpus, *args.extra])
    queries = [q for q in load_queries(args.queries) if in_split(q.meta.get("split"), args.split)]
    queries = queries[: args.limit] if args.limit is not None else queries
    for extra in args.extra:
        queries += load_queries(extra)
    passages = {p.id: p for p in load_corpus(args.corpus)}
    form = "sentence" if args.sentences else args.form
    if form == "sentence":
        rows = sentences(queries, passages)
    elif form == "template":
        rows = templates(queries)
    elif form == "reply":
        rows = replies(queries, passages, *_reply_engine(args.model))
    else:
        rows = distill(queries, passages, args.model)
    write_jsonl_atomic(outputs[0], ({k: row[k] for k in ("id", "output", "how")} for row in rows))
    write_jsonl_atomic(outputs[1], rows)
    for output in outputs:
        mark_output_file(output, COMMAND)
    print(f"{len(rows)} answers -> {args.output}: {dict(Counter(row['how'] for row in rows))}", file=sys.stderr)
    return 0


def _reply_engine(model: str) -> tuple[Any, Any]:
    """The base model behind the hf engine (no reflection tokens) and its teacher call cache."""
    from selfrag.data_gen.cache import CallCache, default_cache_path
    from selfrag.inference.engines.hf import HFEngine
    from selfrag.models import resolve_model

    engine = HFEngine.plain(resolve_model(model))  # EngineOptions' defaults
    return engine, CallCache(default_cache_path("hf", engine.name))


if __name__ == "__main__":
    raise SystemExit(main())
