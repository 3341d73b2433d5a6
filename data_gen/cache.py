"""The teacher-call cache: every reply stored in SQLite (WAL), keyed by (model, messages, parameters).

A killed run (SIGKILL included) loses at most the calls in flight: each reply is committed as soon as it
arrives, so rerunning the same command answers every earlier call from here and pays for none twice.
The key never includes the API key or the server address: the same model at another URL is the same call.
Only usable replies are kept (:class:`~selfrag.data_gen.teachers.CachedTeacher`): a malformed reply or a label outside
the vocabulary is asked again by the next run, so a fixed teacher is not answered with its old failures.

One cache per teacher, outside any one run (:func:`default_cache_path`): a new output directory, a restart or a
second data set with the same prompts pays no call twice. Several processes may share one file (SQLite WAL).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from selfrag.runs import text_key

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    text TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL
)
"""


def call_key(model: str, messages: Any, params: Mapping[str, Any]) -> str:
    """A stable hash of one call: the same model, messages and parameters give the same key everywhere."""
    payload = json.dumps({"model": model, "messages": messages, "params": dict(params)}, sort_keys=True)
    return text_key(payload)


#: Environment variable naming the folder of the per-teacher caches (default: ``<selfrag cache dir>/teacher``).
CACHE_ENV = "SELFRAG_TEACHER_CACHE"


def default_cache_path(engine: str, model: str) -> Path:
    """``$SELFRAG_TEACHER_CACHE/<engine>--<model>--<hash>.sqlite`` (else under the user's selfrag cache dir)."""
    from selfrag.models import cache_dir

    root = Path(os.environ.get(CACHE_ENV) or cache_dir() / "teacher")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_.")[:80] or "model"
    digest = text_key(f"{engine}\0{model}", 8)
    return root / f"{engine}--{slug}--{digest}.sqlite"


@dataclass(frozen=True)
class CachedReply:
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Ledger:
    """The teacher calls a run paid for (every reply the teacher sent, usable or not) and their tokens."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.calls += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def cost(self, prices: tuple[float, float]) -> float:
        """In the currency of ``teacher.price_*_per_million`` (input, output)."""
        return round((self.prompt_tokens * prices[0] + self.completion_tokens * prices[1]) / 1e6, 6)


class CallStore(Protocol):
    """Where :class:`~selfrag.data_gen.teachers.CachedTeacher` looks replies up and books the calls it paid: this
    SQLite cache in the process, or (``executor=ray``) the one cache of the run reached through a Ray actor
    (:class:`SharedCache`), whose ledger outlives a killed worker."""

    async def lookup(self, key: str) -> CachedReply | None: ...

    async def store(self, key: str, model: str, reply: CachedReply) -> None: ...

    async def paid(self, prompt_tokens: int, completion_tokens: int) -> None: ...


class CallCache:
    """A SQLite table of replies; safe to share between the event loop and worker threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a killed process (only a power cut can lose the last commits).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(SCHEMA)
        self.ledger = Ledger()  # the calls paid while this cache was open (this run's)

    def get(self, key: str) -> CachedReply | None:
        with self._lock:
            row = self._db.execute(
                "SELECT text, prompt_tokens, completion_tokens FROM calls WHERE key = ?", (key,)
            ).fetchone()
        return None if row is None else CachedReply(row[0], int(row[1]), int(row[2]))

    def put(self, key: str, model: str, reply: CachedReply) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO calls (key, model, text, prompt_tokens, completion_tokens) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, model, reply.text, reply.prompt_tokens, reply.completion_tokens),
            )

    async def lookup(self, key: str) -> CachedReply | None:
        return self.get(key)

    async def store(self, key: str, model: str, reply: CachedReply) -> None:
        self.put(key, model, reply)

    async def paid(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self.ledger.add(prompt_tokens, completion_tokens)

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CacheKeeper:
    """The run's one teacher-call cache, as a Ray actor on the driver's node: it alone opens the SQLite file
    (``teacher.cache``, or the per-teacher default), so every labelling worker on every node reads and writes the same
    replies without a shared filesystem (SQLite's WAL does not work over NFS), and the file stays with the driver for
    the next run. Lookups and stores are idempotent: a restarted keeper retries them."""

    def __init__(self, path: str) -> None:
        self.cache = CallCache(path)

    def get(self, key: str) -> tuple[str, int, int] | None:
        hit = self.cache.get(key)
        return None if hit is None else (hit.text, hit.prompt_tokens, hit.completion_tokens)

    def put(self, key: str, model: str, text: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.cache.put(key, model, CachedReply(text, prompt_tokens, completion_tokens))

    def paid(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.cache.ledger.add(prompt_tokens, completion_tokens)

    def ledger(self) -> tuple[int, int, int]:
        """(calls, prompt tokens, completion tokens) paid through this keeper: every worker's, a killed one's too."""
        ledger = self.cache.ledger
        return ledger.calls, ledger.prompt_tokens, ledger.completion_tokens

    def where(self) -> tuple[str, int]:
        """(node id, pid) of the keeper: for tests and logs."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def close(self) -> None:
        self.cache.close()


class SharedCache:
    """A labelling worker's :class:`~selfrag.data_gen.cache.CallStore`: every lookup and store goes to the keeper."""

    def __init__(self, keeper: Any) -> None:
        self.keeper = keeper

    async def lookup(self, key: str) -> Any:
        hit = await self.keeper.get.remote(key)
        return None if hit is None else CachedReply(hit[0], int(hit[1]), int(hit[2]))

    async def store(self, key: str, model: str, reply: Any) -> None:
        # awaited: a reply is in the cache before its question can reach the journal
        await self.keeper.put.remote(key, model, reply.text, reply.prompt_tokens, reply.completion_tokens)

    async def paid(self, prompt_tokens: int, completion_tokens: int) -> None:
        await self.keeper.paid.remote(prompt_tokens, completion_tokens)


def start_keeper(cache_path: Path) -> Any:
    """The :class:`CacheKeeper` of this run, pinned to the driver's node (no CPU reserved: it waits on SQLite)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    keeper = ray.remote(CacheKeeper).options(  # type: ignore[attr-defined]
        num_cpus=0,
        max_concurrency=8,  # threads: CallCache serialises on its own lock
        max_restarts=-1,
        max_task_retries=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
    )
    return keeper.remote(str(cache_path))
