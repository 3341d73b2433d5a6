"""The judgement study's table: every finished arm's judgement, answers and curves -> judgement_study_table.md.

    python studies/judgement_study.py table

Reads ``runs/study/<arm>/`` (judgement reports, ``metrics.json``, ``answers/``) and ``runs/study-logs``; rows of arms
measured on another machine are read back from the last written table, so none is dropped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from judgement_arms import LOGS, RUNS, Arm

TABLE = Path(__file__).resolve().with_name("judgement_study_table.md")

def well_formed_cell(out: Path) -> str:
    """The share of the arm's single-pass outputs that parse as well-formed trajectories (the quickstart's format
    check, ``min_well_formed``), from its ``answers`` records."""
    from selfrag.app.quickstart import well_formed_share

    shares = well_formed_share(out / "answers" / "records" / "single_pass.jsonl")
    return "n/a" if shares["share"] is None else f"{shares['share']:.0%} of {shares['outputs']}"


def judgement_of(out: Path) -> Path | None:
    """The arm's judgement on the most items: ``judgement-<n>.json`` from ``score`` or training's own."""
    scored = sorted(out.glob("judgement-*.json"), key=lambda path: int(path.stem.split("-")[1]))
    if scored:
        return scored[-1]
    own = out / "judgement.json"
    return own if own.is_file() else None


def answer_cell(out: Path) -> str:
    """``answers`` figures: share of answerable questions whose answer holds a gold answer, false abstains on
    answerable ones, abstains on unanswerable ones (n questions)."""
    path = out / "answers" / "results.json"
    if not path.is_file():
        return "not run"
    single = json.loads(path.read_text())["modes"]["single_pass"]

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0%}"

    return (f"{pct(single.get('match'))} / {pct(single.get('false_abstain_rate'))} / "
            f"{pct(single.get('abstain_rate_unanswerable'))} (n={single.get('examples')}; well-formed "
            f"{well_formed_cell(out)})")


def fmt(entry: dict | None) -> str:
    if not entry or entry.get("auroc") is None:
        return "n/a"
    return f"{entry['auroc']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"


def acc(entry: dict | None) -> str:
    if not entry:
        return "n/a"
    return f"{entry['accuracy_pos']:.0%} / {entry['accuracy_neg']:.0%}"


def earlier_rows(present: set[str]) -> tuple[list[str], dict[str, dict[int, str]]]:
    """Rows of arms measured on another machine (their runs/study folders are not here), read back from the last
    written table: a table written on a fresh machine keeps every earlier arm instead of dropping it."""
    if not TABLE.is_file():
        return [], {}
    main: list[str] = []
    curve_cells: dict[str, dict[int, str]] = {}
    steps: list[int] = []
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| arm | step "):
            steps = [int(cell.split()[1]) for cell in cells[1:]]
        elif line.startswith("| ") and cells[0] not in ("arm", *present) and not cells[0].startswith("---"):
            if steps:  # the curves table comes second
                curve_cells[cells[0]] = {step: cell for step, cell in zip(steps, cells[1:], strict=False) if cell}
            else:
                main.append(line)
    return main, curve_cells


def table(arms: dict[str, Arm]) -> str:
    present = {out.name for out in RUNS.iterdir() if judgement_of(out)} if RUNS.is_dir() else set()
    kept, kept_curves = earlier_rows(present)
    rows = [
        "| arm | steps | train s (2 cores) | rel. AUROC easy [95% CI] | rel. AUROC hard [95% CI] | sup. AUROC [95% CI] "
        "| rel. acc gold/easy | rel. acc gold/hard | sup. acc right/wrong | n per class "
        "| answers: match / false abstain / abstain unanswerable |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *kept,
    ]
    notes = [f"- **{name}**: {arms[name].question}." for name in arms if name not in present and any(
        row.startswith(f"| {name} |") for row in kept)]
    for out in sorted(RUNS.iterdir()) if RUNS.is_dir() else []:
        judgement_path = judgement_of(out)
        if judgement_path is None:
            continue
        report = json.loads(judgement_path.read_text())
        config = (out / "config.yaml").read_text() if (out / "config.yaml").is_file() else ""
        logs = [path for path in (LOGS / f"{out.name}.txt", out / "log.txt") if path.is_file()]
        found = re.search(r"'train_runtime': '([0-9.]+)'", logs[0].read_text()) if logs else None
        runtime = float(found.group(1)) if found else None
        steps = next((line.split()[-1] for line in config.splitlines() if line.strip().startswith("max_steps:")), "?")
        rel, sup = report["relevance"], report["support"]
        n = rel.get("easy", {}).get("n_pos", "?")
        seconds = ("?" if runtime is None else str(round(runtime))) + timing_note(arms, out.name)
        rows.append(
            f"| {out.name} | {steps} | {seconds} | {fmt(rel.get('easy'))} | {fmt(rel.get('hard'))} | {fmt(sup)} | "
            f"{acc(rel.get('easy'))} | {acc(rel.get('hard'))} | {acc(sup)} | {n} | {answer_cell(out)} |"
        )
        description = arms[out.name].question if out.name in arms else ""
        if description:
            notes.append(f"- **{out.name}**: {description}.")
    return "\n".join(rows + [""] + notes + [""] + curves(kept_curves)) + "\n"


def curves(kept: dict[str, dict[int, str]] | None = None) -> list[str]:
    """Relevance easy / hard and support AUROC at each logged step (a third of the items per class)."""
    found: dict[str, dict[int, str]] = dict(kept or {})
    for out in sorted(RUNS.iterdir()) if RUNS.is_dir() else []:
        metrics_path = out / "metrics.json"
        if not metrics_path.is_file():
            continue
        history = json.loads(metrics_path.read_text()).get("reflection_accuracy_at_checkpoints") or []
        cells = {}
        for entry in history:
            j = entry.get("judgement")
            if j:
                cells[entry["step"]] = f"{j['rel_auroc_easy']:.2f} / {j['rel_auroc_hard']:.2f} / {j['sup_auroc']:.2f}"
        if cells:
            found[out.name] = cells
    steps = sorted({step for cells in found.values() for step in cells})
    rows = ["Curves (AUROC easy / hard / support at each logged step, a third of the items per class):", "",
            "| arm | " + " | ".join(f"step {step}" for step in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for name, cells in found.items():
        rows.append(f"| {name} | " + " | ".join(cells.get(step, "") for step in steps) + " |")
    return rows



def timing_note(arms: dict[str, Arm], name: str) -> str:
    """`` (how the machine was shared)`` beside an arm's training seconds, or nothing for an arm trained alone."""
    note = arms[name].timing_note if name in arms else None
    return f" ({note})" if note else ""
