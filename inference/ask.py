"""Answer questions from the command line and show the decisions behind each.

selfrag ask model=runs/quickstart/model retriever.corpus=data_gen/demo/corpus.jsonl "Who ruled Normandy?"
selfrag ask --json model=DIR retriever.index=runs/index "question" inference.mode=always inference.top_k=5
selfrag ask model=DIR retriever.index=runs/index --questions questions.txt inference.engine=vllm   # one load, many
cat questions.jsonl | selfrag ask model=DIR retriever.corpus=FILE --questions -           # JSONL: {"question": ...}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TextIO

from selfrag import reflection as rf
from selfrag.config import help_field
from selfrag.errors import InputError
from selfrag.inference.answer import Answer
from selfrag.inference.config import InferenceConfig, inference_keys
from selfrag.inference.engines import Engine, build_engine
from selfrag.inference.events import relevance_of
from selfrag.inference.retrievers.spec import RETRIEVER_KEYS, RetrieverConfig, open_retriever
from selfrag.inference.runtime import SelfRAG
from selfrag.inference.trace import BeamStep, Generate, Rank, RankedCandidate, Relevance, TraceEntry, Vote, json_value
from selfrag.retrieval import Retriever


@dataclass
class AskConfig:
    """``selfrag ask``: the model, the retriever and the runtime's settings (the inference section, as in every
    command)."""

    #: the retriever's and the runtime's settings as top-level keys (ask took the runtime's there once): refused
    REMOVED_KEYS: ClassVar[dict[str, str]] = {**RETRIEVER_KEYS, **inference_keys()}

    model: str = help_field("a model directory trained by selfrag (or a released one)")
    retriever: RetrieverConfig = help_field(
        "where passages come from, as in every command: retriever.index=DIR (from selfrag index), "
        "retriever.url=postgresql://...?table=NAME (pgvector) or retriever.corpus=FILE|FOLDER (BM25 built now)",
        default_factory=RetrieverConfig,
    )
    inference: InferenceConfig = help_field(
        "the runtime's settings, as in serve, eval, calibrate and the quickstart (inference.mode=always "
        "inference.top_k=5 inference.engine=vllm inference.engine_options.device=cuda; configs/inference/default.yaml)",
        default_factory=InferenceConfig,
    )

    def validate(self) -> list[str]:
        return [] if self.retriever.is_set() else [NO_RETRIEVER]


NO_RETRIEVER = ("retriever: no passages; set retriever.index=DIR (built by selfrag index), "
                "retriever.url=postgresql://...?table=NAME or retriever.corpus=FILE (BM25 built now)")


def load_retriever(retriever: RetrieverConfig) -> Retriever:
    """The retriever ``retriever`` names (an index built by ``selfrag index``, a pgvector table, or BM25 built now
    over a corpus), by :func:`~selfrag.inference.retrievers.spec.open_retriever`; refused when it names none."""
    opened = open_retriever(retriever)
    if opened is None:
        raise InputError(NO_RETRIEVER)
    return opened


def ask_many(config: AskConfig, questions: Sequence[str], engine: Engine | None = None) -> list[Answer]:
    """Load the retriever (its errors surface before the model loads), then the engine once, and answer all."""
    retriever = load_retriever(config.retriever)
    engine = engine if engine is not None else build_engine(config.inference, config.model)
    return SelfRAG(engine, retriever, config.inference).answer_many(list(questions))


def ask(model: str, corpus: str | Path, question: str, config: InferenceConfig) -> Answer:
    """One question over a BM25 index of ``corpus`` (kept for callers of the first version)."""
    retriever = load_retriever(RetrieverConfig(corpus=str(corpus)))
    return SelfRAG(build_engine(config, model), retriever, config).answer_many([question])[0]


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
    relevance = relevance_of(answer)
    for passage in answer.citations:
        rejected = "   (the model judged it [Irrelevant])" if relevance.get(passage.id) == rf.IRRELEVANT else ""
        lines.append(f"  [{numbers[passage.id]}] {passage.id} ({passage.title}){rejected}")
    lines.append("decisions:")
    lines += ["  " + line for line in format_trace(answer.trace)]
    return "\n".join(lines)


def format_trace(trace: Iterable[TraceEntry]) -> list[str]:
    """One or a few lines per trace entry, for people."""
    lines: list[str] = []
    for entry in trace:
        if isinstance(entry, Rank | Vote):
            lines.append(f"{entry.step}: {entry.reason}")
            for candidate in entry.candidates:
                mark = "*" if candidate.passage_id == entry.chosen else " "
                lines.append(f"  {mark} {candidate.passage_id}: {_scores(candidate)}")
                lines += [f"      {line}" for line in _explained(candidate)]
        elif isinstance(entry, Relevance):
            lines.append(f"relevance: at >= {entry.relevance_threshold:.3g}")
            for passage, verdict in entry.chosen.items():
                score = entry.relevance.get(passage)
                shown = "no score" if score is None else f"{score:.3f}"
                was = entry.generated.get(passage)
                note = f"  (the model wrote {was or 'no verdict'})" if passage in entry.overridden else ""
                lines.append(f"    {passage}: {verdict} {shown}{note}")
        elif isinstance(entry, BeamStep):
            kept = ", ".join(f"{beam.score:.2f} ({beam.segments} sentences)" for beam in entry.chosen)
            lines.append(f"beam: kept {kept} — {entry.reason}")
        else:
            chosen = json_value(entry.chosen)
            lines.append(f"{entry.step}: {chosen} — {entry.reason}")
            if isinstance(entry, Generate) and entry.abstain:
                lines.append(f"    wrote {entry.generated!r}: {entry.abstain}")
    return lines


def _explained(candidate: RankedCandidate) -> list[str]:
    """What a branch wrote and why it lost, where it is malformed, was retried or lost the ranking."""
    lines = []
    if candidate.retried is not None:
        lines.append(f"first wrote {candidate.retried!r} (no answer text); decoded again, text first")
    if not candidate.well_formed or candidate.retried is not None:
        lines.append(f"wrote {candidate.generated!r}")
    if candidate.rejected:
        lines.append(f"not chosen: {candidate.rejected}")
    return lines


def _scores(candidate: RankedCandidate) -> str:
    score = candidate.score
    components = {} if score is None else {"relevance": score.relevance, "support": score.support,
                                            "utility": score.utility}
    parts = [
        f"{name} {value:.2f}" if isinstance(value := components.get(name), float) else f"{name} missing"
        for name in ("relevance", "support", "utility")
    ]
    parts.append(f"score {score.total:.2f}" if score is not None and isinstance(score.total, float) else "score -")
    tokens = [] if score is None else [
        token for token in (score.relevance_token, score.support_token, score.utility_token) if token
    ]
    problems = "; ".join(candidate.problems)
    shape = "" if candidate.well_formed else f"  (malformed: {problems or 'unreadable'})"
    shape += "  (pruned)" if candidate.pruned else ""
    return ", ".join(parts) + "  " + " ".join(tokens) + shape
