"""``selfrag generate executor=ray``: the teacher labelling on Ray Data, on a local or an existing Ray cluster.

    selfrag generate --config configs/data_gen/http-teacher.yaml teacher.model=M output=runs/data executor=ray \\
        ray.workers=4                       # a local Ray; ray.address=auto (or ray://host:10001) for a cluster

The questions left to do are dealt one at a time to a pool of ``ray.workers`` labelling actors, ``ray.batch_size`` in
flight on each (an async actor runs them at once), each actor with the project's own teacher (the same
:class:`~selfrag.data_gen.assembly.Assembler`, labeler, retries and connection breaker as the single-process run;
every call through the run's one cache, :class:`~selfrag.data_gen.cache.CacheKeeper`, an actor on the driver's node).
Each question is its own Ray task, so the driver (``ray.wait``, one at a time: :func:`label_each`) appends each
finished question to the same journal as it arrives, and deals that worker the next one: a driver killed mid-run has
every finished question journaled. The output files are rendered from the journal exactly as the single-process run
renders them, so for the same teacher answers the records are byte-identical; they are also written as shards with a
manifest (:func:`write_shards`).

``ray.stages=true`` runs the same labelling as one Ray Data stage per decision type instead
(:mod:`selfrag.data_gen.ray_stages`); the journal, shards and manifest here and the cache keeper
(:mod:`selfrag.data_gen.cache`) serve both.

Why actors with the project's teacher, not ``ray.data.llm``'s processors: a question is a chain of dependent calls
of variable length (the retrieve decision picks the next call; each later sentence gets a decision; relevance for
the top-k, support only for the relevant ones; a malformed reply gets a correction turn), while a ``ray.data.llm``
processor maps one row to one request. Unrolling the chain into a fixed stage sequence would need one processor per
depth and would lose the call cache (a rerun would pay every call again) and the byte-identical records.

Faults: Ray restarts a dead labelling actor and retries the questions it had in flight (``max_restarts`` and
``max_task_retries`` unlimited); a question is journaled by the driver only when its result arrives, once (a
duplicate from a retried task is ignored), so nothing is lost or written twice.
A rerun of a finished run skips every journaled question, and one whose journal is gone makes zero teacher calls
whichever worker gets which question: the keeper alone opens the SQLite cache, so the nodes share no filesystem.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from selfrag.config import from_dict, to_dict
from selfrag.corpus import Query
from selfrag.data_gen.cache import Ledger, SharedCache, start_keeper
from selfrag.extras import require
from selfrag.fsutil import write_json
from selfrag.runs import bytes_digest
from selfrag.trajectory import Passage

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
SHARDS_DIR = "shards"


class Labeller:
    """One Ray actor (async: Ray runs its ``label`` calls at once on the actor's event loop): a teacher (its cache:
    the keeper), a labeler and a retriever; labels one question a call, one journal entry each.

    The teacher lives as long as the actor (one event loop for every question): its connection pool, and its count of
    connection failures in a row, carry over from question to question, so an unreachable teacher stops the run.
    """

    def __init__(self, config: dict[str, Any], passages: list[dict[str, str]], cache: Any) -> None:
        from selfrag.data_gen.config import GenerateConfig

        self.config = from_dict(GenerateConfig, config)
        self.passages = [Passage(p["id"], p["title"], p["text"]) for p in passages]
        self.by_id = {passage.id: passage for passage in self.passages}
        self.cache = SharedCache(cache)
        self.assembler: Any = None
        self.hits_reported = 0

    def _build(self) -> Any:
        from selfrag.data_gen.assembly import Assembler
        from selfrag.data_gen.labelers import LLMLabeler
        from selfrag.data_gen.queries import fallback_retriever
        from selfrag.data_gen.teachers import CachedTeacher, build_teacher
        from selfrag.inference.retrievers.spec import open_retriever
        from selfrag.retrieval import PrecomputedRetriever

        config = self.config
        teacher = CachedTeacher(build_teacher(config.teacher), self.cache)
        labeler = LLMLabeler(
            teacher, config.label_retries, seed=config.teacher.engine_options.seed,
            temperature=config.teacher.temperature,
        )
        # The prebuilt index (a directory every worker opens, or one pgvector table) when there is one: no worker
        # builds its own; a question's own ctxs come first, added question by question (see label).
        fallback = fallback_retriever(open_retriever(config.retriever), self.passages)
        self.retriever = PrecomputedRetriever({}, fallback)
        return Assembler(teacher, labeler, self.retriever, config.top_k, seed=config.teacher.engine_options.seed)

    async def label(self, raw: str, seed: str, digest: str) -> dict[str, Any]:
        """One question: its journal entry, or why it failed (``fatal``: a permanent teacher error that stops the run);
        ``cache_hits``: this actor's calls answered from the cache since its last answer (summed, they are its all)."""
        from selfrag.data_gen.teachers import TeacherError

        if self.assembler is None:  # built inside the actor's event loop: the HTTP client belongs to it
            self.assembler = self._build()
        query = Query.from_json(json.loads(raw), "a ray batch")
        if query.ctxs:
            self.retriever.by_query[query.question] = tuple(query.ctxs)
        row: dict[str, Any] = {"query_id": query.id, "entry": "", "failed": "", "fatal": ""}
        try:
            outcome = await self.assembler.assemble(query, self.by_id[seed] if seed else None)
            row["entry"] = json.dumps({**outcome.to_json(), "input_digest": digest})
        except TeacherError as error:
            row["fatal" if not error.retryable else "failed"] = (
                error.reason if not error.retryable else f"teacher unavailable: {error.reason}; rerun to retry"
            )
        hits = self.assembler.teacher.cache_hits
        row["cache_hits"], self.hits_reported = hits - self.hits_reported, hits
        return row


def label_with_ray(
    config: Any,
    todo: Sequence[tuple[Query, str | None]],
    passages: Sequence[Passage],
    digests: dict[str, str],
    cache_path: Path,
    add: Callable[[dict[str, Any]], bool],
) -> tuple[dict[str, str], Ledger, int, dict[str, Any]]:
    """Label ``todo`` on Ray; ``add`` journals one entry (False: a duplicate). Returns (failed, the calls paid as the
    keeper booked them, hits, what else run.json says: with ``ray.stages`` the calls of each stage)."""
    ray = require("ray", "executor=ray (or executor=local)")
    from tqdm.auto import tqdm

    from selfrag.data_gen.teachers import TeacherError

    settings = config.ray
    ray.data.DataContext.get_current().enable_progress_bars = False  # one tqdm bar below, not Ray's per operator
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    started_here = not ray.is_initialized()
    if started_here:
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if settings.address is None:
            options["num_cpus"] = stage_cpus(settings) if settings.stages else settings.workers
        forwarded = forwarded_environment(config.teacher.engine_options.api_key_env)
        if forwarded:  # the workers of a cluster started elsewhere do not have the driver's environment
            options["runtime_env"] = {"env_vars": forwarded}
        ray.init(address=settings.address, **options)
    failed: dict[str, str] = {}
    paid = Ledger()
    hits = 0
    keeper = None
    workers: list[Any] = []
    try:
        rows = [
            {"query": json.dumps(query.to_json()), "seed": seed or "", "digest": digests[query.id]}
            for query, seed in todo
        ]
        if not rows:
            return failed, paid, 0, {}
        keeper = start_keeper(cache_path)

        def finish(row: dict[str, Any]) -> None:
            if row["fatal"]:  # a permanent teacher error (HTTP 401/404, unreachable): stop the run
                raise TeacherError(str(row["fatal"]), retryable=False)
            if row["failed"]:
                failed[str(row["query_id"])] = str(row["failed"])
            elif row["entry"] and not add(json.loads(str(row["entry"]))):
                logger.info("question %s came back twice (a retried batch); kept once", row["query_id"])

        with tqdm(total=len(rows), desc="generate (ray)", unit="question", dynamic_ncols=True) as bar:
            if settings.stages:
                from selfrag.data_gen.ray_stages import label_in_stages

                by_id = {passage.id: passage for passage in passages}
                staged = [  # a stage gets the seed passage itself: only the searching stages hold the corpus
                    {**row, "query_id": query.id, "seed": json.dumps(by_id[seed].to_json()) if seed else ""}
                    for row, (query, seed) in zip(rows, todo, strict=True)
                ]
                stages = label_in_stages(config, staged, passages, keeper, finish, bar)
                hits = sum(counts.get("from_cache", 0) for counts in stages.values())
                return failed, Ledger(*ray.get(keeper.ledger.remote())), hits, {"stages": stages}
            actor = ray.remote(Labeller).options(  # type: ignore[attr-defined]
                num_cpus=settings.cpus_per_worker,
                max_concurrency=settings.batch_size,  # questions in flight on one worker
                max_restarts=-1,  # a dead worker is restarted and its questions in flight are asked again
                max_task_retries=-1,
            )
            shared = ray.put([passage.to_json() for passage in passages])
            workers = [actor.remote(to_dict(config), shared, keeper) for _ in range(settings.workers)]

            def arrived(row: dict[str, Any]) -> None:
                nonlocal hits
                hits += int(row["cache_hits"])
                finish(row)
                bar.update(1)

            label_each(
                rows, len(workers), settings.batch_size,
                lambda worker, row: workers[worker].label.remote(row["query"], row["seed"], row["digest"]),
                next_result, arrived,
            )
            # booked by the keeper as each reply came: a killed worker's calls count though its question never returned
            paid = Ledger(*ray.get(keeper.ledger.remote()))
    finally:
        for worker in workers:  # a stopped run (a fatal teacher error) leaves no question running
            ray.kill(worker)
        if keeper is not None:
            ray.get(keeper.close.remote())
            ray.kill(keeper)
        if started_here:
            ray.shutdown()
    return failed, paid, hits, {}


def label_each(
    rows: Iterable[dict[str, Any]],
    workers: int,
    per_worker: int,
    submit: Callable[[int, dict[str, Any]], Any],
    next_done: Callable[[list[Any]], tuple[Any, Any]],
    arrived: Callable[[Any], None],
) -> None:
    """Keep ``per_worker`` questions in flight on each of ``workers`` and hand each result to ``arrived`` as it comes.

    ``submit(worker, row)`` starts one question and returns its handle (a Ray ObjectRef); ``next_done(handles)``
    waits for the first of them to finish and returns it with its result (:func:`next_result`). The worker whose
    question finished is dealt the next one at once. If ``arrived`` raises (a fatal teacher error, the driver
    interrupted), the questions still in flight are left to the caller: every result handed over before is kept.
    """
    queue = iter(rows)
    pending: dict[Any, int] = {}

    def deal(worker: int) -> None:
        row = next(queue, None)
        if row is not None:
            pending[submit(worker, row)] = worker

    for worker in range(workers):
        for _ in range(per_worker):
            deal(worker)
    while pending:
        handle, result = next_done(list(pending))
        worker = pending.pop(handle)
        arrived(result)
        deal(worker)


def next_result(handles: list[Any]) -> tuple[Any, Any]:
    """The first of ``handles`` (Ray ObjectRefs) to finish, and its value."""
    import ray

    [ready], _ = ray.wait(handles, num_returns=1)
    return ready, ray.get(ready)


def forwarded_environment(api_key_env: str | None) -> dict[str, str]:
    """The variables every Ray worker needs from the driver: the teacher's key (read at call time, in the worker).

    Ray passes them as the job's ``runtime_env``, so a cluster whose nodes were started without the key exported
    labels as the driver would; the key goes to the cluster's own processes only, never into a file of the run.
    """
    value = os.environ.get(api_key_env) if api_key_env else None
    return {api_key_env: value} if api_key_env and value else {}


def stage_cpus(settings: Any) -> int:
    """CPUs of a local Ray for ``ray.stages=true``: room for every stage's actors and the assemble tasks."""
    from selfrag.data_gen.ray_stages import STAGE_FUNCTIONS

    tasks = sum(settings.stage_workers.of(name, settings.workers) for name in STAGE_FUNCTIONS)
    return max(settings.workers, math.ceil((tasks + 1) * settings.stage_cpus) + 1)


def write_shards(output: Path, names: Sequence[str], per_shard: int) -> dict[str, Any]:
    """Copy the records files into ``shards/<name>-NNNNN.jsonl`` of ``per_shard`` lines and a manifest (counts and
    SHA-256 of every shard, in order: concatenating a name's shards gives its file back byte for byte)."""
    folder = output / SHARDS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.jsonl"):
        stale.unlink()
    manifest: dict[str, Any] = {"per_shard": per_shard, "files": {}}
    for name in names:
        source = output / name
        lines = source.read_text(encoding="utf-8").splitlines(keepends=True) if source.exists() else []
        shards = []
        for number, chunk in enumerate(_chunks(lines, per_shard)):
            path = folder / f"{Path(name).stem}-{number:05d}.jsonl"
            data = "".join(chunk).encode("utf-8")
            path.write_bytes(data)
            shards.append({"path": f"{SHARDS_DIR}/{path.name}", "lines": len(chunk), "sha256": bytes_digest(data)})
        manifest["files"][name] = {"lines": len(lines), "shards": shards}
    write_json(output / MANIFEST_FILE, manifest)
    return manifest


def _chunks(lines: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(lines), size):
        yield lines[start : start + size]


