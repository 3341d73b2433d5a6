"""Answer questions from the command line and show the decisions behind each.

selfrag ask --model runs/quickstart/model --corpus data_gen/demo/corpus.jsonl "Who ruled Normandy?"
selfrag ask --json --model DIR --index runs/index "question" mode=always top_k=5
selfrag ask --model DIR --index runs/index --questions questions.txt engine=vllm   # one load, many questions
cat questions.jsonl | selfrag ask --model DIR --corpus FILE --questions -              # JSONL: {"question": ...}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from selfrag.errors import InputError
from selfrag.inference.answer import Answer
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import Engine, build_engine
from selfrag.inference.retrievers import build_bm25
from selfrag.inference.retrievers.spec import RetrieverConfig, open_retriever
from selfrag.inference.runtime import SelfRAG
from selfrag.retrieval import Retriever


def load_retriever(
    corpus: str | Path | None = None,
    index: str | Path | None = None,
    retriever: RetrieverConfig | None = None,
    chunk_words: int | None = None,
    chunk_overlap: int | None = None,
) -> Retriever:
    """An index built by ``selfrag index`` (a directory, or a pgvector ``postgresql://...?table=`` URL), or BM25
    built now over ``corpus``: exactly one, by :func:`~selfrag.inference.retrievers.spec.open_retriever`; a corpus
    folder is cut into ``chunk_words``-word passages (None: 200) sharing ``chunk_overlap`` words (None: 40)."""
    chunking = {name: value for name, value in (("chunk_words", chunk_words), ("chunk_overlap", chunk_overlap))
                if value is not None}
    if chunking and index is not None:
        raise InputError(f"--chunk-words/--chunk-overlap apply to --corpus FOLDER; {str(index)!r} was cut into "
                         "passages when it was built: rebuild it with selfrag index ... chunk_words=N")
    if chunking and corpus is not None and retriever is None:
        return build_bm25(corpus, **chunking)  # type: ignore[arg-type]
    opened = open_retriever(retriever, corpus=corpus, index=index)
    if opened is None:
        raise InputError(
            "give exactly one of --corpus FILE (BM25 built now) or --index DIR|postgresql://...?table=NAME "
            "(built by selfrag index)"
        )
    return opened


def ask_many(
    model: str,
    questions: Sequence[str],
    config: InferenceConfig,
    corpus: str | Path | None = None,
    index: str | Path | None = None,
    engine: Engine | None = None,
    chunk_words: int | None = None,
    chunk_overlap: int | None = None,
) -> list[Answer]:
    """Load the retriever (its errors surface before the model loads), then the engine once, and answer all."""
    retriever = load_retriever(corpus, index, chunk_words=chunk_words, chunk_overlap=chunk_overlap)
    engine = engine if engine is not None else build_engine(config, model)
    return SelfRAG(engine, retriever, config).answer_many(list(questions))


def ask(model: str, corpus: str | Path, question: str, config: InferenceConfig) -> Answer:
    """One question over a BM25 index of ``corpus`` (kept for callers of the first version)."""
    return ask_many(model, [question], config, corpus=corpus)[0]


def read_questions(source: str, stdin: TextIO) -> list[str]:
    """Questions from a file (``-``: standard input): one per line, or JSONL lines with ``question``."""
    if source == "-":
        lines, where = stdin.read().splitlines(), "stdin"
    else:
        path = Path(source)
        if not path.is_file():
            raise InputError(f"questions file {source!r} does not exist; give a text file (one per line) or -")
        lines, where = path.read_text(encoding="utf-8").splitlines(), source
    questions = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                raise InputError(f"{where}:{number}: malformed JSON ({error.msg}); one question per line") from None
            if not isinstance(row, dict) or not isinstance(row.get("question"), str):
                raise InputError(f"{where}:{number}: a JSON line needs a string field 'question'")
            text = row["question"]
        questions.append(text)
    if not questions:
        raise InputError(f"{where} holds no questions")
    return questions


def format_answer(answer: Answer) -> str:
    """The answer with a [n] marker per cited sentence, its sources, flags with reasons, and the decisions."""
    numbers = {passage.id: index + 1 for index, passage in enumerate(answer.citations)}
    if answer.segments and not answer.abstained:
        text = " ".join(
            segment.text + (f" [{numbers[segment.passage.id]}]" if segment.passage is not None else "")
            for segment in answer.segments
        )
    else:
        text = answer.answer
    lines = [text]
    flags = [name for name in ("abstained", "low_confidence") if getattr(answer, name)]
    if flags:
        lines[0] += f"   [{', '.join(flags)}]"
    for reason in answer.reasons:
        lines.append(f"  why: {reason}")
    for passage in answer.citations:
        lines.append(f"  [{numbers[passage.id]}] {passage.id} ({passage.title})")
    lines.append("decisions:")
    lines += ["  " + line for line in format_trace(answer.to_json()["trace"])]
    return "\n".join(lines)


def format_trace(trace: Iterable[Mapping[str, Any]]) -> list[str]:
    """One or a few lines per trace step, for people."""
    lines: list[str] = []
    for step in trace:
        name = step.get("step")
        if name in ("rank", "vote"):
            lines.append(f"{name}: {step['reason']}")
            for candidate in step["candidates"]:
                mark = "*" if candidate.get("passage_id") == step.get("chosen") else " "
                lines.append(f"  {mark} {candidate.get('passage_id')}: {_scores(candidate)}")
                lines += [f"      {line}" for line in _explained(candidate)]
        elif name == "relevance":
            lines.append(f"relevance: at >= {step['relevance_threshold']:.3g}")
            for passage, verdict in step["chosen"].items():
                score = step["relevance"].get(passage)
                shown = "no score" if score is None else f"{score:.3f}"
                was = step["generated"].get(passage)
                note = f"  (the model wrote {was or 'no verdict'})" if passage in step["overridden"] else ""
                lines.append(f"    {passage}: {verdict} {shown}{note}")
        elif name == "beam":
            kept = ", ".join(f"{beam['score']:.2f} ({beam['segments']} sentences)" for beam in step["chosen"])
            lines.append(f"beam: kept {kept} — {step['reason']}")
        else:
            lines.append(f"{name}: {step.get('chosen')} — {step.get('reason')}")
            if name == "generate" and step.get("abstain"):
                lines.append(f"    wrote {step.get('generated', '')!r}: {step['abstain']}")
    return lines


def _explained(candidate: Mapping[str, Any]) -> list[str]:
    """What a branch wrote and why it lost, where it is malformed, was retried or lost the ranking."""
    lines = []
    if candidate.get("retried") is not None:
        lines.append(f"first wrote {candidate['retried']!r} (no answer text); decoded again, text first")
    if not candidate.get("well_formed", True) or candidate.get("retried") is not None:
        lines.append(f"wrote {candidate.get('generated', '')!r}")
    if candidate.get("rejected"):
        lines.append(f"not chosen: {candidate['rejected']}")
    return lines


def _scores(candidate: Mapping[str, Any]) -> str:
    components = candidate.get("components") or {}
    parts = [
        f"{name} {components[name]:.2f}" if isinstance(components.get(name), float) else f"{name} missing"
        for name in ("relevance", "support", "utility")
    ]
    total = candidate.get("score")
    parts.append(f"score {total:.2f}" if isinstance(total, float) else "score -")
    tokens = [t for t in (candidate.get("tokens") or {}).values() if t]
    problems = "; ".join(candidate.get("problems") or ())
    shape = "" if candidate.get("well_formed", True) else f"  (malformed: {problems or 'unreadable'})"
    shape += "  (pruned)" if candidate.get("pruned") else ""
    return ", ".join(parts) + "  " + " ".join(tokens) + shape
