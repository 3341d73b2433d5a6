"""Teacher-labelled trajectories (``labeler=llm``): inputs -> retrieve -> label -> assemble -> write.

    selfrag generate --config configs/data_gen/http-teacher.yaml teacher.model=gpt-4o-mini output=runs/data

Resumable: every teacher call is cached in ``<output>/teacher-cache.sqlite`` and every finished question
is one line of ``<output>/journal.jsonl``. Kill the run at any moment and rerun the same command: finished
questions are skipped, unfinished ones replay their cached calls, and the output files (rendered from the
journal, sorted by id) are byte-identical to an uninterrupted run's. A rerun with other content settings
refuses and names each difference (``restart=true`` starts over, keeping the cache).
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
from selfrag.corpus import Query, load_chunks, load_queries
from selfrag.data_gen.assembly import Assembler, Outcome
from selfrag.data_gen.cache import CallCache
from selfrag.data_gen.config import GenerateConfig, parse_shard
from selfrag.data_gen.labelers import LLMLabeler
from selfrag.data_gen.outputs import JOURNAL_FILE, OUTPUT_FILES, Journal, write_outputs
from selfrag.data_gen.teachers import CachedTeacher, TeacherError, build_teacher
from selfrag.errors import ConfigError
from selfrag.fsutil import write_json
from selfrag.inference.retrievers.spec import open_retriever
from selfrag.jsonl import write_jsonl_atomic
from selfrag.retrieval import BM25Retriever, PrecomputedRetriever, Retriever
from selfrag.trajectory import Passage

logger = logging.getLogger(__name__)

CACHE_FILE = "teacher-cache.sqlite"
CONFIG_FILE = "config.yaml"
RUN_FILE = "run.json"
#: Settings that change what the output says; a resumed run must use the same ones.
CONTENT_SETTINGS = (
    "corpus",
    "queries",
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
    "teacher.backend",
    "teacher.model",
    "teacher.temperature",
    "teacher.seed",
    "retriever.index",
    "retriever.url",
    "retriever.mode",
)


def run_llm(config: GenerateConfig) -> dict[str, Any]:
    """The whole run; returns the stats (with this run's cache and call counts under ``run``)."""
    started = time.monotonic()
    output = Path(config.output)
    key_env = config.teacher.api_key_env
    if config.teacher.backend == "openai" and key_env and not os.environ.get(key_env):
        raise ConfigError(
            [
                f"teacher.api_key_env: environment variable {key_env} is empty; export it with the API key, "
                "or set teacher.api_key_env=null for a server without one"
            ]
        )
    prepare_output(config, output, CONTENT_SETTINGS)

    # --- Inputs: the retriever (a prebuilt index shared by every shard, or BM25 built here over the corpus),
    # the corpus (file or folder of chunks; not needed beside a prebuilt index when queries are given) and the
    # queries (given, or written by the teacher) ------------------------------------------------------------
    prebuilt = open_retriever(config.retriever)
    passages = load_passages(config, output) if config.corpus is not None else []
    passages_by_id = {passage.id: passage for passage in passages}
    tasks = select_tasks(config, passages)
    logger.info("%d passages; %d questions in this shard", len(passages), len(tasks))
    retriever = PrecomputedRetriever(
        {query.question: query.ctxs for query, _ in tasks}, _fallback(prebuilt, passages)
    )
    without = [query.id for query, _ in tasks if not query.ctxs]
    if without and retriever.fallback is None:
        raise ConfigError([
            f"{len(without)} queries (first: {without[0]!r}) have no ctxs and no retriever is set; set "
            "retriever.index=DIR or retriever.url=postgresql://... (or corpus=FILE for BM25 built in memory)"
        ])
    write_config(config, output)

    # --- Label every question not finished by an earlier run -----------------------------------------------
    journal = Journal(output / JOURNAL_FILE)
    todo = [(query, seed) for query, seed in tasks if query.id not in journal.done]
    cache = CallCache(output / CACHE_FILE)
    teacher = CachedTeacher(build_teacher(config.teacher), cache)
    labeler = LLMLabeler(teacher, retries=config.label_retries, seed=config.teacher.seed)
    assembler = Assembler(teacher, labeler, retriever, config.top_k, seed=config.teacher.seed)
    failed: dict[str, str] = {}
    try:
        asyncio.run(_label_all(config, assembler, journal, todo, failed, passages_by_id))
    except TeacherError as error:  # permanent (e.g. HTTP 401/404): a setting to fix, not a bug
        raise ConfigError([f"teacher: {error.reason}; finished questions are kept, rerun to resume"]) from None
    finally:
        journal.close()
        cache.close()

    # --- Outputs, rendered from the journal (sorted: identical however the run was interrupted) ------------
    selected = {query.id for query, _ in tasks}
    entries = [entry for query_id, entry in journal.done.items() if query_id in selected]
    entries += [Outcome(query_id, "", drops=[reason]).to_json() for query_id, reason in failed.items()]
    prices = (config.teacher.price_input_per_million, config.teacher.price_output_per_million)
    stats = write_outputs(output, entries, config.heldout, config.seed, prices)
    run_info = {
        "questions_already_done": len(tasks) - len(todo),
        "questions_labelled_now": len(todo) - len(failed),
        "questions_failed_now": len(failed),
        "teacher_calls_made": teacher.fresh_calls,
        "teacher_calls_from_cache": teacher.cache_hits,
        "seconds": round(time.monotonic() - started, 3),
    }
    write_json(output / RUN_FILE, run_info)
    return {**stats, "run": run_info}


async def _label_all(
    config: GenerateConfig,
    assembler: Assembler,
    journal: Journal,
    todo: Sequence[tuple[Query, str | None]],
    failed: dict[str, str],
    passages_by_id: dict[str, Passage],
) -> None:
    # Twice as many questions in flight as teacher slots keeps every slot busy (a question's calls are
    # mostly in sequence: each decision depends on the one before).
    slots = asyncio.Semaphore(2 * max(config.teacher.max_concurrency, config.teacher.batch_size))

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
            journal.add(outcome.to_json())

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


def _fallback(prebuilt: Retriever | None, passages: list[Passage]) -> Retriever | None:
    """Where questions without ctxs search: the prebuilt index, else BM25 built here (small corpora), else none."""
    if prebuilt is not None:
        return prebuilt
    return BM25Retriever(passages) if passages else None


def write_config(config: GenerateConfig, output: Path) -> None:
    """The resolved config, written atomically: a kill mid-write must not leave a config that refuses to resume."""
    output.mkdir(parents=True, exist_ok=True)
    tmp = output / f".{CONFIG_FILE}.tmp-{os.getpid()}"
    tmp.write_text(yaml.safe_dump(to_dict(config), sort_keys=False), encoding="utf-8")
    os.replace(tmp, output / CONFIG_FILE)


def load_passages(config: GenerateConfig, output: Path) -> list[Passage]:
    """The corpus; a folder's chunks are also written to ``<output>/corpus.jsonl`` (with file and position)."""
    corpus = Path(str(config.corpus))
    if not corpus.is_dir():
        from selfrag.corpus import load_corpus

        return load_corpus(corpus)
    chunks = load_chunks(corpus, config.chunk_words, config.chunk_overlap)
    write_jsonl_atomic(output / "corpus.jsonl", (chunk.to_json() for chunk in chunks))
    return [chunk.passage for chunk in chunks]


def select_tasks(config: GenerateConfig, passages: Sequence[Passage]) -> list[tuple[Query, str | None]]:
    """(query, seed passage id) pairs of this shard: given queries, or sampled passages to write questions from."""
    from selfrag.data_gen.run import select_queries, shard_of

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


def prepare_output(config: GenerateConfig, output: Path, keys: Sequence[str]) -> None:
    """Refuse to resume into output made with other content settings (naming each), unless ``restart``."""
    old_path = output / CONFIG_FILE
    if not old_path.exists():
        return
    old = yaml.safe_load(old_path.read_text(encoding="utf-8")) or {}
    differences = setting_differences(old, to_dict(config), keys)
    if not differences:
        return
    if config.restart:
        logger.warning("restart=true: removing earlier outputs in %s (%s)", output, "; ".join(differences))
        for name in (JOURNAL_FILE, *OUTPUT_FILES, RUN_FILE, "corpus.jsonl", CONFIG_FILE):
            (output / name).unlink(missing_ok=True)
        return
    raise ConfigError(
        [
            f"{item} differs from the run already in {str(output)!r}; use a new output directory, "
            "set the old value to resume, or pass restart=true to start over"
            for item in differences
        ]
    )


def setting_differences(old: dict[str, Any], new: dict[str, Any], keys: Sequence[str]) -> list[str]:
    differences = []
    for key in keys:
        before, now = _get(old, key), _get(new, key)
        if key in ("corpus", "queries") and before is not None and now is not None:
            same = Path(before).resolve() == Path(now).resolve()
        else:
            same = before == now
        if not same:
            differences.append(f"{key}={now!r} (was {before!r})")
    return differences


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def summarize(stats: dict[str, Any], output: Path) -> str:
    run = stats["run"]
    drops = Counter(stats["drops"])
    lines = [
        f"{stats['questions_labelled']} of {stats['questions']} questions labelled; "
        f"{stats['records']['train']} train + {stats['records']['heldout']} held-out records, "
        f"{stats['critic_records']['train'] + stats['critic_records']['heldout']} critic records in {output}",
        f"teacher: {run['teacher_calls_made']} calls made now, {run['teacher_calls_from_cache']} from the cache; "
        f"{stats['teacher']['prompt_tokens']} + {stats['teacher']['completion_tokens']} tokens, "
        f"cost {stats['teacher']['cost']}",
        f"already done: {run['questions_already_done']} questions; failed now (rerun to retry): "
        f"{run['questions_failed_now']}",
        "drops: " + (", ".join(f"{reason} x{count}" for reason, count in drops.most_common()) or "none"),
        f"stats: {output / 'stats.md'}",
    ]
    if run["questions_failed_now"]:
        lines.append("some questions failed on the teacher (see drops.jsonl); run the same command again to retry them")
    return "\n".join(lines)
