"""Join the outputs of ``shard=i/N`` runs into one directory, deterministically.

    selfrag generate-merge shards=[runs/data-0,runs/data-1,runs/data-2] output=runs/data

Each shard ran ``selfrag generate ... shard=i/N output=runs/data-i`` (on any machine). The merge checks
that the shards used the same settings and that together they are exactly ``0/N .. N-1/N``, then writes
the same files a single unsharded run would have written (byte for byte: they are rendered from the
journal, sorted by id), plus the union of the teacher-call caches kept inside the shard directories (the
default cache, one per teacher outside any run, is already shared by the shards of one machine). Gold runs merge
their records (sorted by id) and held-out records, and render the critic files from them. The output must be a
new or empty directory.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from selfrag.config import help_field
from selfrag.data_gen.config import GenerateConfig, parse_shard
from selfrag.data_gen.outputs import JOURNAL_FILE, read_journal, write_outputs
from selfrag.errors import ConfigError, InputError
from selfrag.fsutil import write_json
from selfrag.jsonl import read_jsonl, write_jsonl_atomic
from selfrag.runs import setting_renames, spelled_now

CONFIG_FILE = "config.yaml"
CACHE_FILE = "teacher-cache.sqlite"
RUN_FILE = "run.json"
# Settings that may differ between shards of one data set.
PER_SHARD = ("shard", "output", "limit", "restart", "teacher")
TEACHER_CONTENT = ("teacher.engine", "teacher.model", "teacher.temperature", "teacher.engine_options.seed")


@dataclass
class MergeConfig:
    """Settings of ``selfrag generate-merge``."""

    shards: list[Path] = help_field("Output directories of the shard runs (all N of them).")
    output: Path = help_field("Where to write the merged data set: a new or empty directory (else refused).")

    def validate(self) -> list[str]:
        if len(self.shards) < 1:
            return ["shards must list at least one shard directory; e.g. shards=[runs/data-0,runs/data-1]"]
        return []


def merge(config: MergeConfig) -> dict[str, Any]:
    configs = [_shard_config(Path(shard)) for shard in config.shards]
    _check_compatible(configs, config.shards)
    output = Path(config.output)
    if output.is_dir() and any(output.iterdir()):
        raise InputError(
            f"output {str(output)!r} is not empty; the merge writes a whole data set and would overwrite what is "
            "there: choose a new or empty directory"
        )
    output.mkdir(parents=True, exist_ok=True)
    first = dict(configs[0])
    merged_config = {**first, "shard": "0/1", "output": str(output), "limit": None}
    if first.get("labeler") == "llm":
        stats = _merge_llm(config.shards, output, first)
    else:
        stats = _merge_gold(config.shards, output)
    (output / CONFIG_FILE).write_text(yaml.safe_dump(merged_config, sort_keys=False), encoding="utf-8")
    return stats


def _shard_config(shard: Path) -> dict[str, Any]:
    path = shard / CONFIG_FILE
    if not path.is_file():
        raise InputError(f"{str(shard)!r} has no {CONFIG_FILE}: not a `selfrag generate` output; check shards=[...]")
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def _check_compatible(configs: list[dict[str, Any]], shards: list[Path]) -> None:
    problems = []
    first, renamed = configs[0], setting_renames(GenerateConfig)
    for shard, other in zip(shards[1:], configs[1:], strict=True):
        for key in sorted(set(first) | set(other)):
            if key not in PER_SHARD and first.get(key) != other.get(key):
                problems.append(f"{shard}: {key}={other.get(key)!r} differs from {first.get(key)!r} in {shards[0]}")
        # as spelled now: a shard an older version wrote (teacher.seed) merges with one a newer one wrote
        before, now = spelled_now(first, renamed), spelled_now(other, renamed)
        for key in TEACHER_CONTENT:
            if before.get(key) != now.get(key):
                problems.append(f"{shard}: {key}={now.get(key)!r} differs from {before.get(key)!r} in {shards[0]}")
    parsed = [parse_shard(str(c.get("shard", "0/1"))) for c in configs]
    counts = {count for _, count in parsed}
    if len(counts) != 1:
        problems.append(f"shards were cut with different N: {sorted(counts)}; merge shards of one shard=i/N split")
    else:
        (count,) = counts
        indices = sorted(index for index, _ in parsed)
        missing = sorted(set(range(count)) - set(indices))
        if missing or len(indices) != len(set(indices)):
            problems.append(
                f"shards must be exactly 0/{count} .. {count - 1}/{count} once each; got {indices} "
                f"(missing {missing}); run the missing shards or drop the duplicates"
            )
    if problems:
        raise ConfigError(problems)


def _merge_llm(shards: list[Path], output: Path, config: dict[str, Any]) -> dict[str, Any]:
    entries: dict[str, dict[str, Any]] = {}
    for shard in shards:
        for query_id, entry in read_journal(shard / JOURNAL_FILE).items():
            if query_id in entries:
                raise InputError(f"question {query_id!r} is in two shards ({shard}); were they cut with one N?")
            entries[query_id] = entry
    ordered = [entries[key] for key in sorted(entries)]
    write_jsonl_atomic(output / JOURNAL_FILE, ordered)
    teacher = config.get("teacher") or {}
    prices = (float(teacher.get("price_input_per_million", 0)), float(teacher.get("price_output_per_million", 0)))
    stats = write_outputs(output, ordered, float(config.get("heldout", 0)), int(config.get("seed", 0)), prices,
                          str(config.get("split", "train")))
    _merge_caches(_shard_caches(shards), output / CACHE_FILE)
    return stats


def _shard_caches(shards: list[Path]) -> list[Path]:
    """The teacher caches that live inside the shard directories (older runs, or ``teacher.cache`` set there).

    A cache outside them (the default one per teacher, shared by the shards of one machine) stays where it is.
    """
    found = []
    for shard in shards:
        run_file = shard / RUN_FILE
        recorded = json.loads(run_file.read_text(encoding="utf-8")).get("teacher_cache") if run_file.is_file() else None
        for path in (shard / CACHE_FILE, Path(recorded) if recorded else None):
            if path is not None and path.is_file() and shard.resolve() in path.resolve().parents:
                found.append(path)
    return list(dict.fromkeys(found))


def _merge_caches(paths: list[Path], target: Path) -> None:
    from selfrag.data_gen.cache import CallCache

    if not paths:
        return
    CallCache(target).close()  # creates the table
    db = sqlite3.connect(target)
    try:
        for number, path in enumerate(p for p in paths if p.is_file()):
            db.execute(f"ATTACH DATABASE ? AS shard{number}", (str(path),))
            db.execute(f"INSERT OR IGNORE INTO calls SELECT * FROM shard{number}.calls")
            db.commit()
            db.execute(f"DETACH DATABASE shard{number}")
    finally:
        db.close()


def _merge_gold(shards: list[Path], output: Path) -> dict[str, Any]:
    from selfrag.data_gen.gold_outputs import HELDOUT_FILE, write_critic
    from selfrag.data_gen.gold_run import RECORDS_FILE, STATS_FILE, record_stats

    seen: set[str] = set()
    for name in (RECORDS_FILE, HELDOUT_FILE):
        rows: dict[str, dict[str, Any]] = {}
        for shard in shards:
            if name == HELDOUT_FILE and not (shard / name).exists():
                continue  # a shard written before the gold path had held-out questions
            for _, row in read_jsonl(shard / name, "records"):
                if row["id"] in seen:
                    raise InputError(f"record {row['id']!r} is in two shards ({shard}); were they cut with one N?")
                seen.add(row["id"])
                rows[row["id"]] = row
        write_jsonl_atomic(output / name, (rows[key] for key in sorted(rows)))
    stats = record_stats(output / RECORDS_FILE)
    stats["heldout_records"] = record_stats(output / HELDOUT_FILE)["records"]
    stats.update(write_critic(output))
    write_json(output / STATS_FILE, stats)
    return stats
