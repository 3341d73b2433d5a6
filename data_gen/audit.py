"""Label audit of a ``selfrag generate`` run: a seeded stratified sample of its critic rows and a reviewer's verdicts.

    selfrag audit runs/demo-data                 # the page on 127.0.0.1 (a free port)
    selfrag audit runs/demo-data --report        # the agreement table, written and printed

Each critic row of the run (``critic.jsonl`` and ``critic-heldout.jsonl``) is one teacher label of one reflection
type. The sample draws up to ``per_stratum`` rows from each (type, teacher label) stratum, seeded, then shuffles
them so a reviewer does not see the teacher's label in blocks. The reviewer's verdicts live in
``DATA_DIR/audit/verdicts.jsonl`` (one line per reviewed row, the whole file replaced atomically on each verdict);
the run's own files are never written. ``DATA_DIR/audit/audit.json`` keeps the sample's settings so reopening the
audit shows the same rows and continues where it stopped.
"""

from __future__ import annotations

import datetime
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfrag import reflection as rf
from selfrag.errors import SelfragError
from selfrag.fsutil import write_json
from selfrag.jsonl import read_jsonl, write_jsonl_atomic

AUDIT_DIR = "audit"
VERDICTS_FILE = "verdicts.jsonl"
SETTINGS_FILE = "audit.json"
CRITIC_FILES = ("critic.jsonl", "critic-heldout.jsonl")
TYPES = ("retrieve", "relevance", "support", "utility")
DEFAULT_PER_STRATUM = 10
DEFAULT_SEED = 0


class AuditError(SelfragError, ValueError):
    """The data folder, the audit folder or a verdict does not fit the audit; the message says the fix."""


@dataclass(frozen=True)
class AuditItem:
    """One teacher label to review: the decision's inputs, the teacher's label and the labels a reviewer may pick."""

    id: str
    type: str
    teacher: str
    question: str
    passage: Mapping[str, Any] | None
    output: str | None
    preceding: str | None
    choices: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "teacher": self.teacher, "question": self.question,
                "passage": None if self.passage is None else dict(self.passage), "output": self.output,
                "preceding": self.preceding, "choices": list(self.choices)}


def choices(kind: str) -> tuple[str, ...]:
    """The labels of one reflection type, in the vocabulary's order."""
    return rf.tokens_of(rf.Group(kind))


def load_items(data_dir: Path) -> dict[str, AuditItem]:
    """Every critic row of a generate run, by id; a folder that is not a run is one line."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise AuditError(f"data folder {str(data_dir)!r} not found; pass the output folder of `selfrag generate`")
    present = [name for name in CRITIC_FILES if (data_dir / name).is_file()]
    if not present or not (data_dir / "stats.json").is_file():
        raise AuditError(f"{str(data_dir)!r} is not a `selfrag generate` run (no critic.jsonl and stats.json in "
                         "it); pass the folder given as output= to selfrag generate")
    items: dict[str, AuditItem] = {}
    for name in present:
        for line, row in read_jsonl(data_dir / name, "critic"):
            item = _item(row, f"{data_dir / name}:{line}")
            items[item.id] = item
    return items


def _item(row: Mapping[str, Any], where: str) -> AuditItem:
    kind, target, identifier = row.get("type"), row.get("target"), row.get("id")
    if kind not in TYPES:
        raise AuditError(f"{where}: field 'type' must be one of {', '.join(TYPES)}, got {kind!r}; regenerate the run "
                         "with this version of selfrag")
    if not isinstance(identifier, str) or target not in choices(kind):
        raise AuditError(f"{where}: a critic row needs a string 'id' and a {kind} label in 'target', got id "
                         f"{identifier!r} and target {target!r}; regenerate the run with this version of selfrag")
    passage = row.get("passage")
    return AuditItem(identifier, kind, target, str(row.get("instruction") or ""),
                     passage if isinstance(passage, dict) else None, row.get("output"), row.get("preceding"),
                     choices(kind))


def stratified_sample(items: Iterable[AuditItem], per_stratum: int, seed: int) -> list[AuditItem]:
    """Up to ``per_stratum`` items of each (type, teacher label), drawn and then shuffled with ``seed``."""
    strata: dict[tuple[str, str], list[AuditItem]] = defaultdict(list)
    for item in sorted(items, key=lambda item: item.id):
        strata[(item.type, item.teacher)].append(item)
    rng = random.Random(seed)
    sample: list[AuditItem] = []
    for key in sorted(strata):
        members = strata[key]
        sample += rng.sample(members, min(per_stratum, len(members)))
    rng.shuffle(sample)
    return sample


@dataclass(frozen=True)
class AuditSettings:
    per_stratum: int
    seed: int


def settings(data_dir: Path, per_stratum: int | None, seed: int | None) -> AuditSettings:
    """The sample's settings: those saved by an earlier session, else the given ones (defaults where unset)."""
    path = Path(data_dir) / AUDIT_DIR / SETTINGS_FILE
    given = {"per_stratum": per_stratum, "seed": seed}
    for name, value in given.items():
        if value is not None and (not isinstance(value, int) or value < (1 if name == "per_stratum" else 0)):
            raise AuditError(f"{name} must be a{' positive' if name == 'per_stratum' else ' non-negative'} integer, "
                             f"got {value!r}")
    if path.is_file():
        saved = _read_settings(path)
        for name, value in given.items():
            if value is not None and value != saved.get(name):
                raise AuditError(f"{path} holds an audit started with {name}={saved.get(name)}, got {name}={value}; "
                                 f"leave {name} out to continue it, or move {path.parent} away to start a new audit")
        return AuditSettings(int(saved["per_stratum"]), int(saved["seed"]))
    return AuditSettings(DEFAULT_PER_STRATUM if per_stratum is None else per_stratum,
                         DEFAULT_SEED if seed is None else seed)


def _read_settings(path: Path) -> dict[str, Any]:
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise AuditError(f"{path} is not valid JSON ({error}); move {path.parent} away to start a new audit") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("per_stratum"), int) or \
            not isinstance(saved.get("seed"), int) or not isinstance(saved.get("sample", []), list):
        raise AuditError(f"{path} must hold per_stratum and seed (integers) and sample (a list of record ids); "
                         f"move {path.parent} away to start a new audit")
    return saved


class Audit:
    """The sample of one run and its verdicts; ``record`` saves a verdict at once (atomic rewrite)."""

    def __init__(self, data_dir: Path, per_stratum: int | None = None, seed: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.items = load_items(self.data_dir)
        self.settings = settings(self.data_dir, per_stratum, seed)
        self.folder = self.data_dir / AUDIT_DIR
        self.sample = self._saved_sample() or stratified_sample(self.items.values(), self.settings.per_stratum,
                                                                self.settings.seed)
        if not self.sample:
            raise AuditError(f"{self.data_dir} has no critic rows to audit (critic.jsonl is empty); generate a run "
                             "with labelled questions first")
        self._sampled = {item.id for item in self.sample}
        self.verdicts = read_verdicts(self.folder / VERDICTS_FILE, self.items)

    def record(self, item_id: str, human: str) -> dict[str, Any]:
        """Save the reviewer's label for one sampled item (a second verdict replaces the first)."""
        item = self.items.get(item_id)
        if item is None:
            raise AuditError(f"record {item_id!r} is not in {self.data_dir}'s critic files; reload the page")
        if item_id not in self._sampled:
            raise AuditError(f"record {item_id!r} is not in this audit's sample; review the records the page shows")
        if human not in item.choices:
            raise AuditError(f"label {human!r} is not a {item.type} label; pick one of {', '.join(item.choices)}")
        verdict = {"id": item.id, "type": item.type, "teacher": item.teacher, "human": human,
                   "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        if not (self.folder / SETTINGS_FILE).is_file():  # the sample is fixed by the first verdict
            write_json(self.folder / SETTINGS_FILE, {"per_stratum": self.settings.per_stratum,
                                                     "seed": self.settings.seed,
                                                     "sample": [item.id for item in self.sample]})
        self.verdicts[item.id] = verdict
        write_jsonl_atomic(self.folder / VERDICTS_FILE, self.verdicts.values())
        return verdict

    def _saved_sample(self) -> list[AuditItem]:
        """The sample an earlier session fixed (a run that grew since keeps its audit's rows)."""
        path = self.folder / SETTINGS_FILE
        if not path.is_file():
            return []
        saved = _read_settings(path).get("sample") or []
        missing = [identifier for identifier in saved if identifier not in self.items]
        if missing:
            raise AuditError(f"{path}: the audit's sample holds record {missing[0]!r}, which is no longer in the run's "
                             f"critic files (was the run regenerated?); move {self.folder} away to start a new audit")
        return [self.items[identifier] for identifier in saved]

    def state(self) -> dict[str, Any]:
        """What the page shows: the sample in order, each with the reviewer's label so far (None: not reviewed)."""
        return {
            "data_dir": str(self.data_dir),
            "settings": {"per_stratum": self.settings.per_stratum, "seed": self.settings.seed},
            "items": [{**item.to_json(), "human": (self.verdicts.get(item.id) or {}).get("human")}
                      for item in self.sample],
        }


def read_verdicts(path: Path, items: Mapping[str, AuditItem]) -> dict[str, dict[str, Any]]:
    """Saved verdicts by id; a verdict whose record is gone or relabelled is one line (the data changed)."""
    if not path.is_file():
        return {}
    verdicts: dict[str, dict[str, Any]] = {}
    for line, row in read_jsonl(path, "verdicts"):
        identifier, human = row.get("id"), row.get("human")
        item = items.get(identifier) if isinstance(identifier, str) else None
        if item is None:
            raise AuditError(f"{path}:{line}: a verdict for record {identifier!r}, which is no longer in the run's "
                             f"critic files (was the run regenerated?); move {path.parent} away to start a new audit")
        if row.get("teacher") != item.teacher:
            raise AuditError(f"{path}:{line}: record {identifier!r} was reviewed against teacher label "
                             f"{row.get('teacher')!r}, the run now says {item.teacher!r} (was the run regenerated?); "
                             f"move {path.parent} away to start a new audit")
        if human not in item.choices:
            raise AuditError(f"{path}:{line}: field 'human' must be one of {', '.join(item.choices)}, got {human!r}; "
                             "fix or delete that line")
        verdicts[item.id] = dict(row)
    return verdicts
