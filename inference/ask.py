"""Answer one question from the command line and show the decisions behind it.

selfrag ask --model runs/quickstart/model --corpus data_gen/demo/corpus.jsonl "Who ruled Normandy?"
selfrag ask --json --model DIR --corpus FILE "question" mode=always top_k=5
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from selfrag.inference.answer import Answer
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines.hf import HFEngine
from selfrag.inference.retrievers import build_bm25
from selfrag.inference.runtime import SelfRAG
from selfrag.models import resolve_model


def ask(model: str, corpus: str | Path, question: str, config: InferenceConfig) -> Answer:
    """Load the model and a BM25 index over ``corpus`` (corpus errors surface before the model loads)."""
    retriever = build_bm25(corpus)
    engine = HFEngine(resolve_model(model))
    return SelfRAG(engine, retriever, config).answer(question)


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
        elif name == "beam":
            kept = ", ".join(f"{beam['score']:.2f} ({beam['segments']} sentences)" for beam in step["chosen"])
            lines.append(f"beam: kept {kept} — {step['reason']}")
        else:
            lines.append(f"{name}: {step.get('chosen')} — {step.get('reason')}")
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
    shape = "" if candidate.get("well_formed", True) else "  (malformed)"
    shape += "  (pruned)" if candidate.get("pruned") else ""
    return ", ".join(parts) + "  " + " ".join(tokens) + shape
