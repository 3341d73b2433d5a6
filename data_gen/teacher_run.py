"""Teacher-labelled trajectories (``labeler=llm``): inputs -> retrieve -> label -> assemble -> write.

    selfrag generate --config configs/data_gen/http-teacher.yaml teacher.model=gpt-4o-mini output=runs/data

Resumable: every teacher call is cached (one SQLite cache per teacher, outside the run: see ``teacher.cache``)
and every finished question is one line of ``<output>/journal.jsonl``. Kill the run at any moment and rerun the
same command: finished questions are skipped, unfinished ones replay their cached calls, and the output files
(rendered from the journal, sorted by id) are byte-identical to an uninterrupted run's. A rerun with other
content settings refuses and names each difference (``restart=true`` starts over, keeping the cache); so does a
corpus whose content changed under the same path, while a question whose text or answer changed is labelled again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from selfrag.config import to_dict
from selfrag.corpus import Chunk, Query, load_chunks, load_queries
from selfrag.data_gen.assembly import Assembler, Outcome
from selfrag.data_gen.cache import CallCache, Ledger, default_cache_path
from selfrag.data_gen.config import GenerateConfig, parse_shard
from selfrag.data_gen.fingerprints import FINGERPRINT_FILE, check_output, passages_digest, query_digest
from selfrag.data_gen.labelers import LLMLabeler
from selfrag.data_gen.outputs import JOURNAL_FILE, OUTPUT_FILES, Journal, write_outputs
from selfrag.data_gen.queries import fallback_retriever, select_queries
from selfrag.data_gen.teachers import CachedTeacher, TeacherError, build_teacher
from selfrag.errors import ConfigError
from selfrag.fsutil import write_json
from selfrag.inference.retrievers.spec import open_retriever
from selfrag.jsonl import write_jsonl_atomic
from selfrag.retrieval import PrecomputedRetriever, Retriever
from selfrag.sentences import SPLITTER
from selfrag.trajectory import Passage

logger = logging.getLogger(__name__)

CACHE_FILE = "teacher-cache.sqlite"
CONFIG_FILE = "config.yaml"
RUN_FILE = "run.json"
INPUT_FIX = (
    "pass restart=true to label every question again (calls whose prompts did not change are answered from the "
    "teacher cache), set the old values to resume, or use a new output directory"
)
#: Settings that change what the output says; a resumed run must use the same ones (the corpus by its content; each
#: question by its own digest in the journal: an edited one is labelled again).
CONTENT_SETTINGS = (
    "labeler",
    "split",
    "shard",
    "seed",
    "top_k",
    "heldout",
    "label_retries",
    "question_count",
    "chunk_words",
    "chunk_overlap",
    "teacher.engine",
    "teacher.model",
    "teacher.temperature",
    "teacher.engine_options.seed",
    "retriever.index",
    "retriever.url",
    "retriever.mode",
)


def run_llm(config: GenerateConfig) -> dict[str, Any]:
    """The whole run; returns the stats (with this run's cache and call counts under ``run``)."""
    started = time.monotonic()
    output = Path(config.output)
    key_env = config.teacher.engine_options.api_key_env
    if config.teacher.engine == "openai" and key_env and not os.environ.get(key_env):
        raise ConfigError(
            [
                f"teacher.engine_options.api_key_env: environment variable {key_env} is empty; export it with the "
                "API key, or set teacher.engine_options.api_key_env= (empty) for a server without one"
            ]
        )

    # --- Inputs: the retriever (a prebuilt index shared by every shard and worker, or BM25 built here over the
    # corpus), the corpus (file or folder of chunks; not needed beside a prebuilt index when queries are given) and
    # the queries (given, or written by the teacher) -----------------------------------------------------------
    prebuilt = open_retriever(config.retriever)
    passages, chunks = load_passages(config) if config.passages is not None else ([], None)
    corpus_digest = passages_digest(passages)
    # the assembler labels each answer sentence by sentence: the splitter is an input too
    check_output(config, output, CONTENT_SETTINGS, {"passages": corpus_digest, "sentences": SPLITTER}, start_over,
                 bookkeeping=(CACHE_FILE, "corpus.jsonl"), fix=INPUT_FIX)
    if chunks is not None:
        write_jsonl_atomic(output / "corpus.jsonl", (chunk.to_json() for chunk in chunks))
    passages_by_id = {passage.id: passage for passage in passages}
    tasks = select_tasks(config, passages)
    logger.info("%d passages; %d questions in this shard", len(passages), len(tasks))
    retriever = PrecomputedRetriever(
        {query.question: query.ctxs for query, _ in tasks}, fallback_retriever(prebuilt, passages)
    )
    without = [query.id for query, _ in tasks if not query.ctxs]
    if without and retriever.fallback is None:
        raise ConfigError([
            f"{len(without)} queries (first: {without[0]!r}) have no ctxs and no retriever is set; set "
            "retriever.index=DIR or retriever.url=postgresql://... (or retriever.corpus=FILE for BM25 built in memory)"
        ])
    write_config(config, output)

    # --- Label every question not finished by an earlier run (or changed since) ----------------------------
    journal = Journal(output / JOURNAL_FILE)
    digests = {query.id: query_digest(query, None if s is None else passages_by_id[s]) for query, s in tasks}
    todo = [(query, seed) for query, seed in tasks if not _finished(journal.done.get(query.id), digests[query.id])]
    changed = [query.id for query, _ in todo if query.id in journal.done]
    if changed:
        logger.warning("%d question(s) changed since the run in %s (%s; from %s): labelling them again", len(changed),
                       output, _first(changed), _query_files(config))
    cache_path = teacher_cache_path(config, output)
    logger.info("teacher cache: %s", cache_path)
    failed: dict[str, str] = {}
    extra: dict[str, Any] = {}
    try:
        if config.executor == "ray":
            from selfrag.data_gen.ray_executor import label_with_ray

            added: set[str] = set()

            def add(entry: dict[str, Any]) -> bool:
                if entry["query_id"] in added:
                    return False
                added.add(entry["query_id"])
                journal.add(entry)
                return True

            failed, paid, hits, extra = label_with_ray(config, todo, passages, digests, cache_path, add)
        else:
            paid, hits = _label_locally(config, retriever, passages_by_id, journal, todo, failed, digests, cache_path)
    except TeacherError as error:  # permanent (e.g. HTTP 401/404, unreachable): a setting to fix, not a bug
        done = sum(1 for query, _ in tasks if _finished(journal.done.get(query.id), digests[query.id]))
        raise ConfigError(
            [f"teacher: {error.reason} ({done} of {len(tasks)} questions are finished and kept)"]
        ) from None
    finally:
        journal.close()

    # --- Outputs, rendered from the journal (sorted: identical however the run was interrupted) ------------
    selected = {query.id for query, _ in tasks}
    entries = [entry for query_id, entry in journal.done.items() if query_id in selected and query_id not in failed]
    entries += [Outcome(query_id, "", drops=[reason]).to_json() for query_id, reason in failed.items()]
    prices = (config.teacher.price_input_per_million, config.teacher.price_output_per_million)
    stats = write_outputs(output, entries, config.heldout, config.seed, prices, config.split)
    run_info = {
        "questions_already_done": len(tasks) - len(todo),
        "questions_labelled_now": len(todo) - len(failed),
        "questions_changed": len(changed),
        "questions_changed_ids": changed,
        "questions_failed_now": len(failed),
        "teacher_calls_made": paid.calls,
        "teacher_calls_from_cache": hits,
        "teacher_tokens_paid": {"prompt": paid.prompt_tokens, "completion": paid.completion_tokens},
        "cost_paid_now": paid.cost(prices),
        "teacher_cache": str(cache_path),
        "seconds": round(time.monotonic() - started, 3),
        **extra,
    }
    if config.executor == "ray":
        from selfrag.data_gen.ray_executor import write_shards

        write_shards(output, [name for name in OUTPUT_FILES if name.endswith(".jsonl")], config.ray.shard_records)
    write_json(output / RUN_FILE, run_info)
    return {**stats, "run": run_info}


def _label_locally(
    config: GenerateConfig,
    retriever: Retriever,
    passages_by_id: dict[str, Passage],
    journal: Journal,
    todo: Sequence[tuple[Query, str | None]],
    failed: dict[str, str],
    digests: dict[str, str],
    cache_path: Path,
) -> tuple[Ledger, int]:
    """Label ``todo`` in this process; returns (the teacher calls paid, calls answered from the cache)."""
    cache = CallCache(cache_path)
    teacher = CachedTeacher(build_teacher(config.teacher), cache)
    labeler = LLMLabeler(
        teacher, retries=config.label_retries, seed=config.teacher.engine_options.seed,
        temperature=config.teacher.temperature,
    )
    assembler = Assembler(teacher, labeler, retriever, config.top_k, seed=config.teacher.engine_options.seed)
    try:
        asyncio.run(_label_all(config, assembler, journal, todo, failed, passages_by_id, digests))
    finally:
        cache.close()
    return cache.ledger, teacher.cache_hits


def _finished(entry: dict[str, Any] | None, digest: str) -> bool:
    """A journal entry stands for the question as it is now (an entry without a digest, an older version's, does not:
    the question is labelled again, its calls from the cache)."""
    return entry is not None and entry.get("input_digest") == digest


def teacher_cache_path(config: GenerateConfig, output: Path) -> Path:
    """``teacher.cache``; unset, the output's own cache of an older run, else one cache per teacher."""
    if config.teacher.cache is not None:
        return Path(config.teacher.cache)
    if (output / CACHE_FILE).is_file():
        return output / CACHE_FILE
    return default_cache_path(config.teacher.engine, config.teacher.model)


async def _label_all(
    config: GenerateConfig,
    assembler: Assembler,
    journal: Journal,
    todo: Sequence[tuple[Query, str | None]],
    failed: dict[str, str],
    passages_by_id: dict[str, Passage],
    digests: dict[str, str],
) -> None:
    # Twice as many questions in flight as teacher slots keeps every slot busy (a question's calls are
    # mostly in sequence: each decision depends on the one before).
    options = config.teacher.engine_options
    slots = asyncio.Semaphore(2 * max(options.concurrency, options.batch_size))

    async def one(query: Query, seed_id: str | None) -> None:
        async with slots:
            try:
                seed = None if seed_id is None else passages_by_id[seed_id]
                outcome = await assembler.assemble(query, seed)
            except TeacherError as error:
                # Not journaled: the next run asks again (a permanent error such as HTTP 401 stops the run).
                if not error.retryable:
                    raise
                failed[query.id] = f"teacher unavailable: {error.reason}; rerun to retry"
                return
            journal.add({**outcome.to_json(), "input_digest": digests[query.id]})

    tasks = [asyncio.create_task(one(query, seed)) for query, seed in todo]
    try:
        with tqdm(total=len(tasks), desc="generate", unit="question", dynamic_ncols=True) as bar:
            for finished in asyncio.as_completed(tasks):
                await finished
                bar.update(1)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await assembler.teacher.aclose()


def write_config(config: GenerateConfig, output: Path) -> None:
    """The resolved config, written atomically: a kill mid-write must not leave a config that refuses to resume."""
    output.mkdir(parents=True, exist_ok=True)
    tmp = output / f".{CONFIG_FILE}.tmp-{os.getpid()}"
    tmp.write_text(yaml.safe_dump(to_dict(config), sort_keys=False), encoding="utf-8")
    os.replace(tmp, output / CONFIG_FILE)


def load_passages(config: GenerateConfig) -> tuple[list[Passage], list[Chunk] | None]:
    """The corpus; for a folder also its chunks (written to ``<output>/corpus.jsonl`` with file and position)."""
    corpus = Path(str(config.passages))
    if not corpus.is_dir():
        from selfrag.corpus import load_corpus

        return load_corpus(corpus), None
    chunks = load_chunks(corpus, config.chunk_words, config.chunk_overlap)
    return [chunk.passage for chunk in chunks], chunks


def select_tasks(config: GenerateConfig, passages: Sequence[Passage]) -> list[tuple[Query, str | None]]:
    """(query, seed passage id) pairs of this shard: given queries, or sampled passages to write questions from."""
    from selfrag.splits import shard_of

    if config.queries is not None:
        queries = select_queries(load_queries(config.queries), config.split, config.shard, config.queries)
        tasks: list[tuple[Query, str | None]] = [(query, None) for query in queries]
    else:
        count = min(config.question_count, len(passages))
        sampled = random.Random(config.seed).sample(list(passages), count)
        index, total = parse_shard(config.shard)
        tasks = [
            (Query(f"gen/{p.id}", "", gold_passage_ids=(p.id,), meta={"source": "teacher"}), p.id)
            for p in sampled
            if shard_of(f"gen/{p.id}", total) == index
        ]
    if config.limit is not None:
        tasks = tasks[: config.limit]
    return tasks


def start_over(output: Path) -> None:
    """Delete what an earlier teacher run wrote into ``output`` (only its own files; a teacher cache there stays)."""
    for name in (JOURNAL_FILE, *OUTPUT_FILES, RUN_FILE, "corpus.jsonl", CONFIG_FILE, FINGERPRINT_FILE):
        (output / name).unlink(missing_ok=True)


def summarize(stats: dict[str, Any], output: Path) -> str:
    run = stats["run"]
    drops = Counter(stats["drops"])
    lines = [
        f"{stats['questions_labelled']} of {stats['questions']} questions labelled; "
        f"{stats['records']['train']} train + {stats['records']['heldout']} held-out records, "
        f"{stats['critic_records']['train'] + stats['critic_records']['heldout']} critic records in {output}",
        f"teacher: {run['teacher_calls_made']} calls paid now (cost {run.get('cost_paid_now', 0.0)}), "
        f"{run['teacher_calls_from_cache']} from the cache ({run['teacher_cache']}); the data set's labels took "
        f"{stats['teacher']['prompt_tokens']} + {stats['teacher']['completion_tokens']} tokens, cost "
        f"{stats['teacher']['cost']} in all",
        f"already done: {run['questions_already_done']} questions; changed and labelled again: "
        f"{run.get('questions_changed', 0)}; failed now: {run['questions_failed_now']}",
        "drops: " + (", ".join(f"{reason} x{count}" for reason, count in drops.most_common()) or "none"),
        f"stats: {output / 'stats.md'}",
    ]
    return "\n".join(lines)


def run_problems(stats: dict[str, Any], output: Path) -> list[str]:
    """Why this run did not finish its job (the CLI exits non-zero on any): failed questions, or no record at all."""
    run = stats["run"]
    problems = []
    if run["questions_failed_now"]:
        first = next((reason for reason in stats["drops"] if reason.startswith("teacher")), "no answer")
        first = first.removesuffix("; rerun to retry")
        problems.append(
            f"{run['questions_failed_now']} of {stats['questions']} questions failed on the teacher ({first}); "
            f"run the same command again to retry them: the {stats['questions_labelled']} finished ones are kept "
            "and their calls come from the cache"
        )
    records = stats["records"]["train"] + stats["records"]["heldout"]
    if records == 0 and stats["questions"] and not run["questions_failed_now"]:
        reasons = Counter(stats["drops"])
        top = ", ".join(f"{reason} x{count}" for reason, count in reasons.most_common(2)) or "no reason recorded"
        problems.append(
            f"no record written: all {stats['questions']} questions were dropped ({top}; "
            f"see {output / 'drops.jsonl'}); "
            "the teacher's replies did not give the labels: check teacher.model (an instruction-following model "
            "that can reply in JSON), or raise label_retries"
        )
    return problems


def _first(ids: list[str], shown: int = 3) -> str:
    """``'q1', 'q2', 'q3' and 4 more``: the first ids of a list, for a log line."""
    head = ", ".join(repr(value) for value in ids[:shown])
    return head + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _query_files(config: GenerateConfig) -> str:
    files = [str(path) for path in (config.queries, *config.more_queries) if path is not None]
    return " and ".join(files) if files else f"the questions the teacher wrote from {config.passages}"
