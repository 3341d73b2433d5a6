"""Teacher-versus-human agreement of an audit: per reflection type, a table (markdown, JSON) and a plot (PNG).

    selfrag audit runs/demo-data --report

Per type: items reviewed, observed agreement (accuracy of the teacher's labels against the reviewer's) with
Wilson's 95% interval, Cohen's kappa with a 95% percentile-bootstrap interval (2000 resamples, seed 0), and per
teacher label the share the reviewer confirmed (the label's precision; the sample is stratified by teacher
label, so this share is what each stratum estimates). Kappa and accuracy are of the reviewed sample, whose label
mix is the stratified one (equal counts per label where the run has enough), not the run's.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from selfrag.agreement import agreement, wilson_interval
from selfrag.fsutil import write_json, write_text

from .audit import AUDIT_DIR, TYPES, Audit

logger = logging.getLogger(__name__)

REPORT_FILES = ("report.md", "report.json", "report.png")


def agreement_report(verdicts: Iterable[Mapping[str, Any]], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Per type (in the vocabulary's order) and overall: counts, accuracy and kappa with intervals, per-label shares."""
    by_type: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for verdict in verdicts:
        by_type[str(verdict["type"])].append(verdict)
    rows = []
    for kind in [t for t in TYPES if t in by_type] + sorted(set(by_type) - set(TYPES)):
        group = by_type[kind]
        result = agreement([v["teacher"] for v in group], [v["human"] for v in group], resamples=resamples,
                           seed=seed)
        labels: dict[str, list[bool]] = defaultdict(list)
        for verdict in group:
            labels[str(verdict["teacher"])].append(verdict["teacher"] == verdict["human"])
        rows.append({
            "type": kind,
            "reviewed": result.count,
            "agreed": result.agreed,
            "accuracy": result.accuracy,
            "accuracy_interval": result.accuracy_interval,
            "kappa": result.kappa,
            "kappa_interval": result.kappa_interval,
            "labels": {label: {"reviewed": len(hits), "confirmed": sum(hits),
                               "share": sum(hits) / len(hits), "interval": wilson_interval(sum(hits), len(hits))}
                       for label, hits in sorted(labels.items())},
        })
    return {"types": rows, "level": 0.95, "kappa_interval": f"percentile bootstrap, {resamples} resamples, seed {seed}",
            "accuracy_interval": "Wilson score"}


def _number(value: float | None, interval: tuple[float, float] | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}" + ("" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]")


def report_markdown(report: Mapping[str, Any], total: int) -> str:
    reviewed = sum(row["reviewed"] for row in report["types"])
    lines = [
        "# Label audit: teacher versus human",
        "",
        f"{reviewed} of {total} sampled labels reviewed. Intervals: 95%; accuracy {report['accuracy_interval']}, "
        f"kappa {report['kappa_interval']}.",
        "",
        "| type | reviewed | agreement | Cohen's kappa | teacher label: confirmed / reviewed |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for row in report["types"]:
        shares = ", ".join(f"`{label}` {item['confirmed']}/{item['reviewed']}" for label, item in row["labels"].items())
        lines.append(f"| {row['type']} | {row['reviewed']} | {_number(row['accuracy'], row['accuracy_interval'])} | "
                     f"{_number(row['kappa'], row['kappa_interval'])} | {shares} |")
    if not report["types"]:
        lines.append("| (no verdicts yet) | 0 | n/a | n/a | |")
    return "\n".join(lines) + "\n"


def write_plot(report: Mapping[str, Any], path: Path) -> Path | None:
    """Agreement and kappa per type with their intervals (a type whose kappa is undefined reads n/a)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed; no plot (pip install matplotlib)")
        return None
    rows = report["types"]
    figure, axis = plt.subplots(figsize=(7, 3.6))
    positions = range(len(rows))
    for offset, key, title in ((-0.18, "accuracy", "agreement"), (0.18, "kappa", "Cohen's kappa")):
        values = [0.0 if row[key] is None else row[key] for row in rows]
        errors = [[0.0, 0.0] if row[f"{key}_interval"] is None or row[key] is None else
                  [row[key] - row[f"{key}_interval"][0], row[f"{key}_interval"][1] - row[key]] for row in rows]
        bars = axis.bar([p + offset for p in positions], values, 0.36, label=title,
                        yerr=[[e[0] for e in errors], [e[1] for e in errors]] if rows else None, capsize=3)
        for bar, row in zip(bars, rows, strict=True):  # the figure above its interval's whisker, not on it
            top = max(0.0, row[key] or 0.0, *(row[f"{key}_interval"] or ()))
            axis.text(bar.get_x() + bar.get_width() / 2, top + 0.02, "n/a" if row[key] is None else f"{row[key]:.2f}",
                      ha="center", va="bottom", fontsize=8)
    axis.set_xticks(list(positions), [f"{row['type']}\n(n={row['reviewed']})" for row in rows])
    axis.set_ylim(min([-0.1, *(row["kappa_interval"][0] for row in rows if row["kappa_interval"])]) - 0.05, 1.2)
    axis.axhline(0, color="grey", linewidth=0.6)
    axis.set_title("Teacher labels versus the reviewer's (95% intervals)")
    axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def write_report(audit: Audit) -> tuple[str, dict[str, Any]]:
    """report.md, report.json and report.png in DATA_DIR/audit; returns the markdown and the report."""
    report = agreement_report(audit.verdicts.values())
    text = report_markdown(report, len(audit.sample))
    folder = audit.data_dir / AUDIT_DIR
    write_text(folder / "report.md", text)
    write_json(folder / "report.json", report)
    write_plot(report, folder / "report.png")
    return text, report
