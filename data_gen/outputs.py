"""The journal of finished questions, and the output files rendered from it (records, critic, drops, stats).

Every finished question is one fsynced line of ``journal.jsonl`` (its record, critic rows, drops and
teacher usage), written only when the whole question is done. The output files are then rendered from
the journal, sorted by id, so a killed and resumed run, an uninterrupted run and a merge of shards all
write the same bytes.

    records.jsonl / heldout.jsonl           generator trajectories (train / held-out questions)
    critic.jsonl / critic-heldout.jsonl     one row per labelled decision -> one reflection token
    drops.jsonl                             every dropped question or item, with its reason
    stats.json / stats.md                   labels per type and source, drops, teacher calls, tokens, cost
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from selfrag.fsutil import write_json
from selfrag.jsonl import JsonlAppender, read_jsonl, truncate_partial_line, write_jsonl_atomic
from selfrag.splits import in_fraction, kept_out

JOURNAL_FILE = "journal.jsonl"
OUTPUT_FILES = (
    "records.jsonl",
    "heldout.jsonl",
    "critic.jsonl",
    "critic-heldout.jsonl",
    "drops.jsonl",
    "stats.json",
    "stats.md",
)
SLOTS = ("retrieve", "relevance", "support")


def read_journal(path: Path) -> dict[str, dict[str, Any]]:
    """Finished questions by id (a partial last line, from a killed write, is dropped; the last entry wins)."""
    if not path.exists():
        return {}
    truncate_partial_line(path)
    return {str(row["query_id"]): row for _, row in read_jsonl(path, "journal")}


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.done = read_journal(path)
        self._appender = JsonlAppender(path)

    def add(self, entry: Mapping[str, Any]) -> None:
        self._appender.write([entry])
        self.done[str(entry["query_id"])] = dict(entry)

    def close(self) -> None:
        self._appender.close()


def write_outputs(
    output: Path, entries: Iterable[Mapping[str, Any]], heldout: float, seed: int, prices: tuple[float, float],
    split: str = "train",
) -> dict[str, Any]:
    """Render every output file from journal entries; returns the stats. ``split``: the run's setting, by which a
    question marked dev or test goes to the held-out files (:func:`selfrag.splits.kept_out`)."""
    entries = sorted(entries, key=lambda entry: str(entry["query_id"]))
    files: dict[str, list[dict[str, Any]]] = {name: [] for name in OUTPUT_FILES if name.endswith(".jsonl")}
    for entry in entries:
        marked = entry.get("split", ((entry.get("record") or {}).get("meta") or {}).get("split"))
        # per question: the same on every shard
        held = kept_out(marked, split) or in_fraction(str(entry["query_id"]), heldout, seed)
        if entry.get("record") is not None:
            files["heldout.jsonl" if held else "records.jsonl"].append(entry["record"])
        files["critic-heldout.jsonl" if held else "critic.jsonl"] += entry.get("critic") or []
        files["drops.jsonl"] += [
            {"query_id": entry["query_id"], "question_dropped": entry.get("record") is None, "reason": reason}
            for reason in entry.get("drops") or []
        ]
    for name, rows in files.items():
        rows.sort(key=lambda row: (str(row.get("id", row.get("query_id"))), str(row.get("reason", ""))))
        write_jsonl_atomic(output / name, rows)
    stats = compute_stats(entries, files, prices)
    write_json(output / "stats.json", stats)
    (output / "stats.md").write_text(stats_markdown(stats), encoding="utf-8")
    return stats


def compute_stats(
    entries: list[Mapping[str, Any]], files: Mapping[str, list[dict[str, Any]]], prices: tuple[float, float]
) -> dict[str, Any]:
    labels: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for name in ("records.jsonl", "heldout.jsonl"):
        for row in files[name]:
            source = row.get("source") or "-"
            for segment in row["segments"]:
                for slot in SLOTS:
                    if segment.get(slot):
                        labels[source][slot][segment[slot]["value"]] += 1
            if row.get("utility"):
                labels[source]["utility"][row["utility"]["value"]] += 1
    critic: dict[str, Counter[str]] = defaultdict(Counter)
    for name in ("critic.jsonl", "critic-heldout.jsonl"):
        for row in files[name]:
            critic[row["type"]][row["target"]] += 1
    drops = Counter(row["reason"] for row in files["drops.jsonl"])
    prompt_tokens = sum(int(entry.get("prompt_tokens") or 0) for entry in entries)
    completion_tokens = sum(int(entry.get("completion_tokens") or 0) for entry in entries)
    return {
        "questions": len(entries),
        "questions_labelled": sum(1 for entry in entries if entry.get("record") is not None),
        "questions_dropped": sum(1 for entry in entries if entry.get("record") is None),
        "records": {"train": len(files["records.jsonl"]), "heldout": len(files["heldout.jsonl"])},
        "critic_records": {"train": len(files["critic.jsonl"]), "heldout": len(files["critic-heldout.jsonl"])},
        "labels": {source: _sorted(by_slot) for source, by_slot in sorted(labels.items())},
        "critic_labels": _sorted(critic),
        "drops": dict(sorted(drops.items())),
        "teacher": {
            "calls": sum(int(entry.get("calls") or 0) for entry in entries),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cost": round((prompt_tokens * prices[0] + completion_tokens * prices[1]) / 1e6, 6),
        },
    }


def _sorted(counters: Mapping[str, Counter[str]]) -> dict[str, dict[str, int]]:
    return {key: dict(sorted(counter.items())) for key, counter in sorted(counters.items())}


def stats_markdown(stats: Mapping[str, Any]) -> str:
    teacher = stats["teacher"]
    lines = [
        "# Data generation stats",
        "",
        f"- questions: {stats['questions']} ({stats['questions_labelled']} labelled, "
        f"{stats['questions_dropped']} dropped)",
        f"- generator records: {stats['records']['train']} train, {stats['records']['heldout']} held out",
        f"- critic records: {stats['critic_records']['train']} train, {stats['critic_records']['heldout']} held out",
        f"- teacher: {teacher['calls']} calls, {teacher['prompt_tokens']} prompt + "
        f"{teacher['completion_tokens']} completion tokens, cost {teacher['cost']}",
        "",
        "## Labels per source and type",
        "",
        "| source | type | label | count |",
        "| --- | --- | --- | ---: |",
    ]
    for source, by_type in stats["labels"].items():
        for kind, counts in by_type.items():
            lines += [f"| {source} | {kind} | `{label}` | {count} |" for label, count in counts.items()]
    lines += ["", "## Critic records per type", "", "| type | label | count |", "| --- | --- | ---: |"]
    for kind, counts in stats["critic_labels"].items():
        lines += [f"| {kind} | `{label}` | {count} |" for label, count in counts.items()]
    lines += ["", "## Drops", "", "| reason | count |", "| --- | ---: |"]
    lines += [f"| {reason} | {count} |" for reason, count in stats["drops"].items()] or ["| none | 0 |"]
    return "\n".join(lines) + "\n"
