"""Evaluation outputs: a markdown table, PNG plots (matplotlib, Agg backend) and a few answers with decisions."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .config import MODE_TITLES

logger = logging.getLogger(__name__)

#: (key in the mode summary, row title, percent?) — the table a newcomer reads first.
ROWS: tuple[tuple[str, str, bool], ...] = (
    ("match", "answer contains gold (answerable)", True),
    ("accuracy", "accuracy (answerable)", True),
    ("f1", "token F1 (answerable, SQuAD)", True),
    ("unsupported_claim_rate", "unsupported claims (lower is better)", True),
    ("abstain_rate_unanswerable", "abstains on unanswerable", True),
    ("unflagged_rate_unanswerable", "answers unanswerable unflagged (lower is better)", True),
    ("false_abstain_rate", "false abstains on answerable (lower is better)", True),
    ("hedged_rate", "hedged answers (judged as answers)", True),
    ("retrieval_rate", "retrieved", True),
    ("retrieve_decision_accuracy", "retrieve decision = gold", True),
    ("re_retrieval_rate", "re-retrieved", True),
    ("engine_calls_per_query", "engine calls / query", False),
    ("prompt_tokens_per_query", "prompt tokens / query", False),
    ("prompt_tokens_computed_per_query", "prompt tokens computed / query (kept KV reused)", False),
    ("generated_tokens_per_query", "generated tokens / query", False),
    ("latency_p50", "latency p50 (s)", False),
    ("latency_p95", "latency p95 (s)", False),
)


#: rates shown with a 95% Wilson interval on the next row, and the summary count each is a share of
INTERVALS = {"match": "answerable", "unsupported_claim_rate": "claims_judged"}


def interval(summary: Mapping[str, Any], key: str) -> str:
    """``k/n [low, high]`` for a rate of :data:`INTERVALS` (Wilson, 95%); ``n/a`` without items."""
    from selfrag.agreement import wilson_interval

    rate, count = summary.get(key), summary.get(INTERVALS[key]) or 0
    if rate is None or not count:
        return "n/a"
    successes = round(rate * count)
    low, high = wilson_interval(successes, count) or (0.0, 1.0)
    return f"{successes}/{count} [{100 * low:.1f}, {100 * high:.1f}]"


def fmt(value: Any, percent: bool) -> str:
    if value is None:
        return "n/a"
    if percent:
        return f"{100 * value:.1f}%"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def markdown_table(summaries: Mapping[str, Mapping[str, Any]], judge: str | None = None) -> str:
    """The modes side by side; ``judge`` (the judge kind) is named in the unsupported-claims row."""
    modes = list(summaries)
    any_summary = next(iter(summaries.values()), {})
    header = (
        f"| metric ({any_summary.get('examples', 0)} questions: {any_summary.get('answerable', 0)} answerable, "
        f"{any_summary.get('unanswerable', 0)} unanswerable) | " + " | ".join(MODE_TITLES[m] for m in modes) + " |"
    )
    lines = [header, "| --- |" + " ---: |" * len(modes)]
    for key, title, percent in ROWS:
        if key == "unsupported_claim_rate" and judge:
            title = f"unsupported claims (judge: {judge}; lower is better)"
        lines.append(f"| {title} | " + " | ".join(fmt(summaries[m].get(key), percent) for m in modes) + " |")
        if key in INTERVALS:
            lines.append(f"| {title.split(' (')[0]}: 95% Wilson interval | "
                         + " | ".join(interval(summaries[m], key) for m in modes) + " |")
        if key == "latency_p95" and BASELINE in summaries:
            lines.append(f"| latency / {MODE_TITLES[BASELINE]} (p50, p95) | "
                         + " | ".join(latency_ratio(summaries[m], summaries[BASELINE]) for m in modes) + " |")
    return "\n".join(lines) + "\n"


def trained_note(trained: int, examples: int) -> str:
    """The line above the table where ``allow_trained_questions=true`` let in questions the model was trained on."""
    return (f"**{trained} of {examples} questions are among those the model was trained on "
            "(allow_trained_questions=true): these figures flatter the model.**\n")


#: the mode every mode's latency is compared with: what a user picks instead of Self-RAG
BASELINE = "plain_rag"


def latency_ratio(summary: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
    """``1.12x, 1.40x``: the mode's p50 and p95 latency over the baseline's, measured in the same run."""
    ratios = []
    for key in ("latency_p50", "latency_p95"):
        mine, theirs = summary.get(key), baseline.get(key)
        ratios.append("n/a" if mine is None or not theirs else f"{mine / theirs:.2f}x")
    return ", ".join(ratios)


def reflection_table(agreement: Mapping[str, Mapping[str, Any]]) -> str:
    if not agreement:
        return ""
    lines = ["| reflection type | items | agreement | AUROC of its score |", "| --- | ---: | ---: | ---: |"]
    for kind, result in agreement.items():
        auroc = "n/a" if result["auroc"] is None else f"{result['auroc']:.3f}"
        lines.append(f"| {kind} | {result['items']} | {fmt(result['accuracy'], True)} | {auroc} |")
        if "at_threshold" in result:
            at = result["at_threshold"]
            lines.append(f"| {kind}: runtime verdict (score >= {at['threshold']:.3g}) | {result['items']} | "
                         f"{fmt(at['accuracy'], True)} | |")
    for kind, result in agreement.items():
        tables = [(f"{kind}: gold (rows) x predicted (columns)", result["confusion"])]
        if "at_threshold" in result:
            tables.append((f"{kind}: gold (rows) x the runtime's verdict at score >= "
                           f"{result['at_threshold']['threshold']:.3g} (columns)", result["at_threshold"]["confusion"]))
        for title, confusion in tables:
            lines += ["", title, "",
                      "| gold \\ predicted | " + " | ".join(confusion["columns"]) + " |",
                      "| --- |" + " ---: |" * len(confusion["columns"])]
            lines += [f"| {label} | " + " | ".join(str(c) for c in row) + " |"
                      for label, row in zip(confusion["labels"], confusion["matrix"], strict=True)]
    return "\n".join(lines) + "\n"


def write_plots(summaries: Mapping[str, Mapping[str, Any]], directory: Path) -> list[Path]:
    """quality.png (match, F1, unsupported, abstain, false abstain per mode) and cost.png (latency, calls, tokens)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed; no plots (pip install matplotlib)")
        return []
    modes = list(summaries)
    titles = [MODE_TITLES[m] for m in modes]
    paths = []
    quality = [("match", "answer contains gold"), ("f1", "token F1"), ("unsupported_claim_rate", "unsupported claims"),
               ("abstain_rate_unanswerable", "abstains: unanswerable"), ("false_abstain_rate", "false abstains")]
    figure, axis = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(modes)
    for index, mode in enumerate(modes):
        raw = [summaries[mode].get(key) for key, _ in quality]
        values = [0.0 if value is None else 100 * value for value in raw]
        bars = axis.bar([k + index * width for k in range(len(quality))], values, width, label=titles[index])
        # a metric the mode has no figure for (no claims judged, no unanswerable question) reads n/a, not 0
        axis.bar_label(bars, labels=["n/a" if value is None else f"{100 * value:.0f}" for value in raw], fontsize=7)
    axis.set_xticks([k + width * (len(modes) - 1) / 2 for k in range(len(quality))], [t for _, t in quality])
    axis.set_ylabel("% of questions (claims for 'unsupported'; mean F1 x 100)")
    axis.set_ylim(0, 110)
    axis.set_title("Quality by mode (higher is better for the first and third group)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    paths.append(directory / "quality.png")
    figure.savefig(paths[-1], dpi=110)
    plt.close(figure)

    cost = [("latency_p50", "latency p50 (s)"), ("latency_p95", "latency p95 (s)"),
            ("engine_calls_per_query", "engine calls / query"), ("generated_tokens_per_query", "generated tokens / q")]
    figure, axes = plt.subplots(1, len(cost), figsize=(12, 3.6))
    for axis, (key, title) in zip(axes, cost, strict=True):
        raw = [summaries[m].get(key) for m in modes]
        bars = axis.bar(range(len(modes)), [0.0 if v is None else v for v in raw],
                        color=[f"C{i}" for i in range(len(modes))])
        axis.bar_label(bars, labels=["n/a" if v is None else f"{v:.1f}" for v in raw], fontsize=7)
        axis.set_xticks(range(len(modes)), [t.replace(" Self-RAG", "\nSelf-RAG") for t in titles], fontsize=7)
        axis.set_title(title, fontsize=9)
    figure.suptitle("Cost by mode (lower is cheaper)")
    figure.tight_layout()
    paths.append(directory / "cost.png")
    figure.savefig(paths[-1], dpi=110)
    plt.close(figure)
    return paths


def show_answers(records_by_mode: Mapping[str, Sequence[Mapping[str, Any]]], count: int) -> str:
    """A few questions with every mode's answer and single-pass Self-RAG's decisions."""
    if count < 1 or not records_by_mode:
        return ""
    first = next(iter(records_by_mode.values()))
    picked = _pick(first, count)
    lines = []
    for index in picked:
        record = first[index]
        gold = ", ".join(record["gold_answers"]) or "(unanswerable: the sources do not say)"
        lines += [f"Q: {record['question']}", f"   gold: {gold}"]
        for mode, records in records_by_mode.items():
            answer = records[index]
            flag = " [abstained]" if answer["abstained"] else ""
            lines.append(f"   {MODE_TITLES[mode]:<26} {answer['answer'][:160]!r}{flag}")
        decisions = records_by_mode.get("single_pass", [None] * (index + 1))[index]
        if decisions:
            lines += [f"      {line}" for line in _decisions(decisions)]
        lines.append("")
    return "\n".join(lines)


def _pick(records: Sequence[Mapping[str, Any]], count: int) -> list[int]:
    """Alternate answerable and unanswerable questions so both behaviours show."""
    answerable = [i for i, r in enumerate(records) if r["answerable"]]
    unanswerable = [i for i, r in enumerate(records) if not r["answerable"]]
    picked: list[int] = []
    while len(picked) < count and (answerable or unanswerable):
        for queue in (answerable, unanswerable):
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def _decisions(record: Mapping[str, Any]) -> list[str]:
    lines = []
    for step in record.get("trace", []):
        reason = step.get("reason", "")
        lines.append(f"{step.get('step')}: {step.get('chosen')} — {reason}"[:200])
    return lines
