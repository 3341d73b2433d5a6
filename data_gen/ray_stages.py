"""``executor=ray ray.stages=true``: the teacher labelling as Ray Data stages, one per decision type.

    questions -> write -> decide -> retrieve -> relevance -> support -> utility -> assemble -> journal
                 (a pass per sentence: a question whose answer has more sentences goes round again)

Each stage is its own ``map_batches`` operator with its own pool of actors (``ray.stage_workers.<stage>``), so the
stage with the most calls (relevance: top-k a retrieval) can be given more workers than the one with the fewest
(decide: one a sentence). A row is one question and its state: the question, its seed passage and the log of every
answer its steps got so far (searches, teacher replies, labels). A stage replays the question's
:class:`~selfrag.data_gen.assembly.Recipe` from that log (no teacher call: the log answers) to the step pending now,
answers the steps of its own kind (through the project's teacher and labeler, every call via the run's one cache),
and hands the row on; the rows of other kinds pass through untouched. The recipe is the one the single-process
:class:`~selfrag.data_gen.assembly.Assembler` drives, so for the same teacher answers the records are byte-identical
and each decision type costs the same calls.

Which stage answers what:

- ``write``: the teacher writes the question (from a seed passage) and the answer (a question without one, after a
  search for its evidence);
- ``decide``: the retrieve decision on the question, and each later sentence's three-way decision;
- ``retrieve``: the top-k passages of a retrieving sentence (its ctxs, or the prebuilt index);
- ``relevance``: IsREL of each candidate; ``support``: IsSUP of the relevant ones (or of the evidence continued);
- ``utility``: IsUSE of the whole answer; ``assemble``: the journal entry (record, critic rows, drops, counts).

The decisions of a sentence depend on the passage chosen for the one before (a [Continue to Use Evidence] sentence
is judged against it), so one pass of the pipeline takes every question one sentence further; the questions still
in their sentences at the end of a pass (their state is in the row) make the next pass, with fewer rows each time.
Faults: Ray Data restarts a dead stage actor and retries its batch; the replies its killed calls had stored come
from the cache, and the driver journals each question once.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from selfrag.config import from_dict, to_dict
from selfrag.corpus import Query
from selfrag.data_gen.cache import SharedCache
from selfrag.trajectory import Label, Passage

#: The stages in pipeline order (``assemble`` makes no teacher call).
STAGES = ("write", "decide", "retrieve", "relevance", "support", "utility", "assemble")
#: The label kinds each stage answers.
LABEL_STAGE = {
    "retrieve": "decide",
    "retrieve_sentence": "decide",
    "relevance": "relevance",
    "support": "support",
    "utility": "utility",
}
DONE = "done"
FAILED = "failed"


def stage_of(step: Any) -> str:
    """The stage that answers ``step`` (None: the recipe finished -> ``assemble``)."""
    from selfrag.data_gen.assembly import Chat, Search

    if step is None:
        return "assemble"
    if isinstance(step, Search):
        return "retrieve"
    if isinstance(step, Chat):
        return "write"
    return LABEL_STAGE[step.items[0].kind]


# --- a question's log: the answers its steps got, as JSON ----------------------------------------------------


def encode(step: Any, answer: Any) -> Any:
    from selfrag.data_gen.assembly import Chat, Search

    if isinstance(step, Search):
        return [passage.to_json() for passage in answer]
    if isinstance(step, Chat):
        return [answer.text, answer.prompt_tokens, answer.completion_tokens]
    return [
        [None if r.label is None else r.label.to_json(), r.drop, r.calls, r.prompt_tokens, r.completion_tokens]
        for r in answer
    ]


def decode(step: Any, data: Any) -> Any:
    from selfrag.data_gen.assembly import Chat, Search
    from selfrag.data_gen.labelers import LabelResult
    from selfrag.data_gen.teachers import ChatReply

    if isinstance(step, Search):
        return [Passage(p["id"], p["title"], p["text"]) for p in data]
    if isinstance(step, Chat):
        return ChatReply(data[0], int(data[1]), int(data[2]))
    return [
        LabelResult(None if label is None else Label(**label), drop, calls, prompt, completion)
        for label, drop, calls, prompt, completion in data
    ]


def replay(recipe: Any, query: Query, seed: Passage | None, log: Sequence[Any]) -> tuple[Any, Any, Any]:
    """(the recipe's generator, its pending step or None, its outcome once finished) after the answers in ``log``."""
    steps = recipe.steps(query, seed)
    try:
        step = next(steps)
        for data in log:
            step = steps.send(decode(step, data))
    except StopIteration as finished:
        return steps, None, finished.value
    return steps, step, None


def _row_query(row: dict[str, Any]) -> tuple[Query, Passage | None]:
    seed = json.loads(row["seed"]) if row["seed"] else None
    query = Query.from_json(json.loads(row["query"]), "a ray batch")
    return query, None if seed is None else Passage(seed["id"], seed["title"], seed["text"])


def _recipe(config: Any) -> Any:
    from selfrag.data_gen.assembly import Recipe

    return Recipe(config.top_k, config.teacher.engine_options.seed, config.label_retries, config.teacher.temperature)


# --- the stages --------------------------------------------------------------------------------------------


class Worker:
    """A Ray worker process's labelling state for one run: a teacher (its cache: the keeper), a labeler and, once a
    searching stage runs here, a retriever. Stages are Ray tasks: the worker processes Ray keeps reuse this state from
    batch to batch and stage to stage (one event loop, one connection pool, one connection breaker a process), so a
    pass of the pipeline starts no process and builds no retriever twice."""

    def __init__(self, config: dict[str, Any], passages: list[Any], keeper: Any) -> None:
        from selfrag.data_gen.config import GenerateConfig

        self.config = from_dict(GenerateConfig, config)
        self.passages_ref = passages[0]  # in the object store: fetched by the first search here
        self.cache = SharedCache(keeper)
        self.recipe = _recipe(self.config)
        self.loop = asyncio.new_event_loop()
        self.assembler: Any = None
        self.retriever: Any = None
        self.searches = False  # the index is open here

    def close(self) -> None:
        if self.assembler is not None:
            self.loop.run_until_complete(self.assembler.teacher.aclose())
        self.loop.close()

    def run(self, kinds: tuple[str, ...], batch: dict[str, Any]) -> dict[str, list[Any]]:
        rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        rows = self.loop.run_until_complete(self._work(kinds, rows))
        return {name: [row[name] for row in rows] for name in batch}

    def _build(self) -> Any:
        from selfrag.data_gen.assembly import Assembler
        from selfrag.data_gen.labelers import LLMLabeler
        from selfrag.data_gen.teachers import CachedTeacher, build_teacher
        from selfrag.retrieval import PrecomputedRetriever

        config = self.config
        teacher = CachedTeacher(build_teacher(config.teacher), self.cache)
        labeler = LLMLabeler(
            teacher, config.label_retries, seed=config.teacher.engine_options.seed,
            temperature=config.teacher.temperature,
        )
        self.retriever = PrecomputedRetriever({}, None)
        return Assembler(teacher, labeler, self.retriever, config.top_k, seed=config.teacher.engine_options.seed)

    def _open_index(self) -> None:
        """The prebuilt index (or BM25 over the corpus) for the stages that search, once a process."""
        import ray

        from selfrag.data_gen.queries import fallback_retriever
        from selfrag.inference.retrievers.spec import open_retriever

        passages = [Passage(p["id"], p["title"], p["text"]) for p in ray.get(self.passages_ref)]
        self.retriever.fallback = fallback_retriever(open_retriever(self.config.retriever), passages)
        self.searches = True

    async def _work(self, kinds: tuple[str, ...], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.assembler is None:  # built inside the loop: the HTTP client belongs to it
            self.assembler = self._build()
        mine = [row for row in rows if row["stage"] in kinds]
        if "retrieve" in kinds and mine:
            if not self.searches:
                self._open_index()
            for row in mine:  # a question's own ctxs answer its searches
                query, _ = _row_query(row)
                if query.ctxs:
                    self.retriever.by_query[query.question] = tuple(query.ctxs)
        teacher, config = self.assembler.teacher, self.config
        fresh, hits = teacher.fresh_calls, teacher.cache_hits
        options = config.teacher.engine_options
        slots = asyncio.Semaphore(2 * max(options.concurrency, options.batch_size))

        async def one(row: dict[str, Any]) -> None:
            async with slots:
                await self._advance(kinds, row)

        await asyncio.gather(*(one(row) for row in mine))
        if rows:
            counts = json.loads(rows[0]["calls"])
            made, cached = counts.get(kinds[0], [0, 0])
            counts[kinds[0]] = [made + teacher.fresh_calls - fresh, cached + teacher.cache_hits - hits]
            rows[0]["calls"] = json.dumps(counts, sort_keys=True)
        return rows

    async def _advance(self, kinds: tuple[str, ...], row: dict[str, Any]) -> None:
        """Answer the row's pending steps while they are this stage's; then mark the stage that answers the next."""
        from selfrag.data_gen.teachers import TeacherError

        query, seed = _row_query(row)
        log = json.loads(row["log"])
        steps, step, _ = replay(self.recipe, query, seed, log)
        try:
            while step is not None and stage_of(step) in kinds:
                answer = await self.assembler.answer(step)
                log.append(encode(step, answer))
                try:
                    step = steps.send(answer)
                except StopIteration:
                    step = None
        except TeacherError as error:
            # Not journaled: the next run asks again (a permanent error such as HTTP 401 stops the run).
            row["stage"] = FAILED
            row["failed" if error.retryable else "fatal"] = (
                f"teacher unavailable: {error.reason}; rerun to retry" if error.retryable else error.reason
            )
            return
        row["log"], row["stage"] = json.dumps(log), stage_of(step)


_WORKERS: dict[str, Worker] = {}


def _worker(run: str, config: dict[str, Any], passages: list[Any], keeper: Any) -> Worker:
    worker = _WORKERS.get(run)
    if worker is None:
        for earlier in _WORKERS.values():  # an earlier run's state (its loop, client, index) is done with
            earlier.close()
        _WORKERS.clear()
        worker = _WORKERS[run] = Worker(config, passages, keeper)
    return worker


# One function a stage (Ray Data names its tasks after them: MapBatches(relevance_stage)).


def write_stage(batch: dict[str, Any], **context: Any) -> dict[str, list[Any]]:
    return _worker(**context).run(("write", "retrieve"), batch)  # an answer's evidence is searched before it


def decide_stage(batch: dict[str, Any], **context: Any) -> dict[str, list[Any]]:
    return _worker(**context).run(("decide",), batch)


def retrieve_stage(batch: dict[str, Any], **context: Any) -> dict[str, list[Any]]:
    return _worker(**context).run(("retrieve",), batch)


def relevance_stage(batch: dict[str, Any], **context: Any) -> dict[str, list[Any]]:
    return _worker(**context).run(("relevance",), batch)


def support_stage(batch: dict[str, Any], **context: Any) -> dict[str, list[Any]]:
    return _worker(**context).run(("support",), batch)


def utility_stage(batch: dict[str, Any], **context: Any) -> dict[str, list[Any]]:
    return _worker(**context).run(("utility",), batch)


STAGE_FUNCTIONS: dict[str, Callable[..., dict[str, list[Any]]]] = {
    "write": write_stage,
    "decide": decide_stage,
    "retrieve": retrieve_stage,
    "relevance": relevance_stage,
    "support": support_stage,
    "utility": utility_stage,
}


def assemble(batch: dict[str, Any], config: dict[str, Any]) -> dict[str, list[Any]]:
    """The ``assemble`` stage (a Ray task, no teacher): a finished question's outcome from its log, as the journal
    entry the single-process run writes."""
    from selfrag.data_gen.config import GenerateConfig

    recipe = _recipe(from_dict(GenerateConfig, config))
    rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
    for row in rows:
        if row["stage"] == "assemble":
            query, seed = _row_query(row)
            _, _, outcome = replay(recipe, query, seed, json.loads(row["log"]))
            row["entry"] = json.dumps({**outcome.to_json(), "input_digest": row["digest"]})
            row["stage"] = DONE
    return {name: [row[name] for row in rows] for name in batch}


# --- the driver --------------------------------------------------------------------------------------------


def label_in_stages(
    config: Any,
    rows: list[dict[str, Any]],
    passages: Sequence[Passage],
    keeper: Any,
    finish: Callable[[dict[str, Any]], None],
    bar: Any,
) -> dict[str, dict[str, int]]:
    """Run ``rows`` (query, seed, digest) through the stages, pass after pass, calling ``finish`` with each row that
    comes out done or failed; returns the teacher calls of each stage (made now, answered from the cache)."""
    import uuid

    import ray

    settings = config.ray
    config_data = to_dict(config)
    context = {
        "run": uuid.uuid4().hex,
        "config": config_data,
        "passages": [ray.put([passage.to_json() for passage in passages])],
        "keeper": keeper,
    }
    pending = [{**row, "log": "[]", "stage": "", "entry": "", "failed": "", "fatal": "", "calls": "{}"}
               for row in rows]
    recipe = _recipe(config)
    for row in pending:  # the first step: `write` for a seed passage or a question without an answer, else `decide`
        _, step, _ = replay(recipe, *_row_query(row), [])
        row["stage"] = stage_of(step)
    calls: dict[str, Counter[str]] = {}
    while pending:
        present = {row["stage"] for row in pending}
        blocks = max(1, -(-len(pending) // settings.batch_size))
        dataset: Any = ray.data.from_items(pending, override_num_blocks=blocks)
        for name, function in STAGE_FUNCTIONS.items():
            if name == "write" and "write" not in present:
                continue  # a later pass (or questions that all have answers): no one to write for
            # Ray retries a batch whose worker died (3 times by default); Ray Data fuses adjacent stages of the
            # same concurrency into one task (fewer hand-offs), stages of different concurrency stay apart.
            dataset = dataset.map_batches(
                function,
                fn_kwargs=context,
                batch_size=settings.batch_size,
                batch_format="numpy",
                concurrency=settings.stage_workers.of(name, settings.workers),
                num_cpus=settings.stage_cpus,
            )
        dataset = dataset.map_batches(
            assemble, fn_kwargs={"config": config_data}, batch_size=settings.batch_size, batch_format="numpy",
            num_cpus=settings.stage_cpus,
        )
        pending = []
        with warnings.catch_warnings():  # a later pass has few rows: fewer batches than a stage's concurrency is fine
            warnings.filterwarnings("ignore", message=".*only received .* input", category=UserWarning)
            for found in dataset.iter_rows():  # journaled as they come: a killed driver loses no finished question
                row = {name: (value.item() if hasattr(value, "item") else value) for name, value in found.items()}
                for name, (made, cached) in json.loads(row["calls"]).items():
                    calls.setdefault(name, Counter()).update({"made": made, "from_cache": cached})
                row["calls"] = "{}"
                if row["stage"] in (DONE, FAILED):
                    finish(row)
                    bar.update(1)
                else:  # more sentences: the next pass
                    pending.append(row)
    return {name: dict(calls[name]) for name in STAGES if name in calls}
