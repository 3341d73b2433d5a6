"""The gold labelling path of `selfrag generate` (``labeler=gold``): labels derived from a data set's annotations.

Writes ``records.jsonl`` (one :class:`selfrag.trajectory.Record` per line), ``heldout.jsonl`` (the records
of the ``heldout`` fraction of questions, by a stable hash of question id and seed), ``critic.jsonl`` /
``critic-heldout.jsonl`` (one row per gold decision, see :mod:`selfrag.data_gen.gold_outputs`), ``stats.json``
and the resolved ``config.yaml`` into ``output``. A killed run resumes when rerun into the same directory:
records already written are kept and never written twice, and the critic files are rendered again from them.
:func:`selfrag.data_gen.run.run` dispatches here.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from tqdm.auto import tqdm

from selfrag.config import write_resolved
from selfrag.corpus import Query, load_corpus, load_queries, retrieval_needed
from selfrag.data_gen.answer_forms import with_answer_form
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.distractors import Evidence, NegativeMix, article_of, find_evidence
from selfrag.data_gen.fingerprints import FINGERPRINT_FILE, check_output, passages_digest
from selfrag.data_gen.gold import GoldLabeler, check_support_labels, has_judged_output
from selfrag.data_gen.gold_outputs import CRITIC_OF, HELDOUT_FILE, RECORDS_FILE, write_critic
from selfrag.data_gen.queries import check_gold_ids, select_queries
from selfrag.errors import ConfigError, InputError
from selfrag.fsutil import write_json
from selfrag.inference.retrievers.spec import open_retriever
from selfrag.jsonl import JsonlAppender, read_jsonl, truncate_partial_line
from selfrag.retrieval import BM25Retriever, PrecomputedRetriever, Retriever
from selfrag.runs import file_digest
from selfrag.sentences import SPLITTER
from selfrag.splits import in_fraction, kept_out
from selfrag.trajectory import Passage

logger = logging.getLogger(__name__)

STATS_FILE = "stats.json"
CONFIG_FILE = "config.yaml"
BATCH_SIZE = 64  # queries per BM25 search and per fsynced write
# Settings that change what a record says: a resumed run must use the same ones.
CONTENT_SETTINGS = (
    "passages", "queries", "labeler", "distractors", "easy_negatives", "hard_negatives", "support_negatives",
    "article_negatives", "erased_negatives", "off_answer_negatives", "train_abstain_text", "abstain_text", "heldout",
    "seed", "retriever", "answer_form",
)

T = TypeVar("T")


@dataclass(frozen=True)
class GenerateResult:
    output: Path
    records_path: Path
    stats_path: Path
    records_written: int  # by this run (a resumed run writes only what was missing)
    stats: dict[str, Any] = field(default_factory=dict)
    message: str = ""  # the summary, when the labeler writes its own
    #: Why the run did not do its job (questions that failed, no record at all); the CLI exits 1 on any.
    problems: tuple[str, ...] = ()

    def summary(self) -> str:
        """A few lines for the CLI: what was written, where, and the label counts."""
        if self.message:
            return self.message
        run_stats = self.stats.get("run", {})
        critic = self.stats.get("critic_records", {})
        train, heldout = self.stats.get("records", 0), self.stats.get("heldout_records", 0)
        lines = [
            f"wrote {self.records_written} records now; in all {train} train records ({self.stats.get('queries', 0)} "
            f"queries) in {self.records_path} and {heldout} held-out records in {self.output / HELDOUT_FILE}",
            f"critic rows: {critic.get('train', 0)} train, {critic.get('heldout', 0)} held out",
            f"already done: {run_stats.get('queries_already_done', 0)} queries; "
            f"skipped: {_counts(run_stats.get('skipped'))}",
        ]
        if run_stats.get("negatives_short"):
            lines.append(f"negatives short of what was asked: {_counts(run_stats['negatives_short'])}")
        for slot, counts in self.stats.get("labels", {}).items():
            lines.append(f"{slot}: " + ", ".join(f"{value} {count}" for value, count in counts.items()))
        lines.append(f"stats: {self.stats_path}")
        return "\n".join(lines)


def _counts(counts: Mapping[str, int] | None) -> str:
    return ", ".join(f"{reason} x{count}" for reason, count in (counts or {}).items()) or "none"


def run_gold(config: GenerateConfig) -> GenerateResult:
    """Label ``config.queries`` from their annotations into ``config.output`` (already claimed by run())."""
    if config.queries is None or config.passages is None:  # validate() says so too; keeps the type checker informed
        raise ConfigError(["queries and passages are required with labeler=gold"])
    missing_inputs(config)
    random.seed(config.seed)
    output = Path(config.output)
    records_path = output / RECORDS_FILE
    if config.restart and (output / CONFIG_FILE).exists():
        for name in (*CRITIC_OF, *CRITIC_OF.values()):
            (output / name).unlink(missing_ok=True)
    # before any slow work: resuming needs the same content settings (and the same queries, cheap to digest)
    early = {"queries": file_digest(config.queries)} if Path(config.queries).is_file() else {}
    check_output(config, output, CONTENT_SETTINGS, early, start_over, partial=True)

    # --- Open the prebuilt retriever (its errors before any slow work), load passages and queries -----
    prebuilt = open_retriever(config.retriever)
    passages = load_corpus(config.passages)
    # the splitter too: answers' and erased passages' sentences split another way are other records
    digests = {"passages": passages_digest(passages), "queries": file_digest(config.queries), "sentences": SPLITTER}
    for number, extra_passages in enumerate(config.more_passages):  # keys only when set: older runs' inputs stay
        more = load_corpus(extra_passages)
        digests[f"more_passages[{number}]"] = passages_digest(more)
        passages += more
    passages_by_id = joined_passages(passages, [config.passages, *config.more_passages])
    queries = load_queries(config.queries)
    logger.info("loaded %d passages and %d queries", len(passages), len(queries))
    for number, extra in enumerate(config.more_queries):
        digests[f"more_queries[{number}]"] = file_digest(extra)
    for key, answers_file in answers_files(config):
        digests[key] = file_digest(answers_file)
    check_output(config, output, CONTENT_SETTINGS, digests, start_over)  # the same paths may hold new content

    # --- Select split and shard -----------------------------------------------------------------
    selected = select_queries(queries, config.split, config.shard, config.queries)
    if config.limit is not None:
        selected = selected[: config.limit]
    answered = with_answers(
        unique_queries(selected, config.queries, config.more_queries, config.split, config.shard),
        [path for _, path in answers_files(config)],
    )
    selected = with_answer_form(answered, config.answer_form)
    templated = sum(before.output != after.output for before, after in zip(answered, selected, strict=True))
    check_support_labels(selected, str(config.queries))
    labeler = GoldLabeler(passages_by_id, config.abstain_text, config.train_abstain_text)
    corpora = ", ".join(str(path) for path in (config.passages, *config.more_passages))
    check_gold_ids(selected, labeler.gold_ids_used, passages_by_id, [Path(config.queries), *config.more_queries],
                   f"passages {corpora}")

    # --- Resume: what an earlier run into this directory already wrote --------------------------
    done = written_ids(records_path) | written_ids(output / HELDOUT_FILE)
    check_no_held_records(records_path, config.split)
    write_resolved(config, output, CONFIG_FILE)
    if done:
        logger.info("resuming: %d records already in %s", len(done), records_path)

    # --- Label each batch of queries and append the new records ---------------------------------
    mix = NegativeMix(
        retrieved=config.distractors, easy=config.easy_negatives, hard=config.hard_negatives,
        support=config.support_negatives, seed=config.seed, article=config.article_negatives,
        erased=config.erased_negatives, off_answer=config.off_answer_negatives,
    )
    # a query's own ctxs first; else the prebuilt index, or BM25 built here in memory (small corpora only)
    fallback = prebuilt if prebuilt is not None else BM25Retriever(passages)
    retriever = PrecomputedRetriever({query.question: query.ctxs for query in selected}, fallback)
    counts: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    short: Counter[str] = Counter()  # negatives asked for but not found, by kind and reason
    with (
        JsonlAppender(records_path) as appender,
        JsonlAppender(output / HELDOUT_FILE) as heldout_appender,
        tqdm(total=len(selected), desc="generate", unit="query") as bar,
    ):
        for batch in batched(selected, BATCH_SIZE):
            labelable = []
            for query in batch:
                problem = labeler.problem(query)
                if problem is None:
                    labelable.append(query)
                else:
                    skipped[problem] += 1
            evidence = evidence_for(labelable, retriever, passages_by_id, mix, selected)
            rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}  # by held out
            for query, found in zip(labelable, evidence, strict=True):
                short.update(negatives_short(query, found, mix, passages_by_id))
                records = labeler.label(query, found)
                new = [record for record in records if record.id not in done]
                if not records:  # e.g. unanswerable, no own passage found and distractors=0
                    skipped["no evidence"] += 1
                else:
                    counts["queries_labelled" if new else "queries_already_done"] += 1
                done.update(record.id for record in new)
                held = kept_out(query.meta.get("split"), config.split) or in_fraction(query.id, config.heldout,
                                                                                       config.seed)
                rows[held] += [record.to_json() for record in new]
            appender.write(rows[False])
            heldout_appender.write(rows[True])
            counts["records_written"] += len(rows[False]) + len(rows[True])
            bar.update(len(batch))

    # --- Critic rows and stats, over everything in the records files ----------------------------
    stats = record_stats(records_path)
    stats["heldout_records"] = record_stats(output / HELDOUT_FILE)["records"]
    stats.update(write_critic(output))
    stats["run"] = {
        "queries_selected": len(selected),
        "queries_labelled": counts["queries_labelled"],
        "queries_already_done": counts["queries_already_done"],
        "records_written": counts["records_written"],
        "answers_templated": templated,  # answer_form=template: queries answering with a template reply
        "skipped": dict(skipped),
        "negatives_short": dict(sorted(short.items())),
    }
    stats_path = output / STATS_FILE
    write_json(stats_path, stats)
    logger.info(
        "wrote %d records now (%d train + %d held-out in all) to %s",
        counts["records_written"], stats["records"], stats["heldout_records"], output,
    )
    incomplete: tuple[str, ...] = ()
    if stats["records"] + stats["heldout_records"] == 0:
        incomplete = (
            f"no record written: {len(selected)} queries selected (split={config.split}, shard={config.shard}), "
            f"skipped: {_counts(skipped)}; check that the queries carry answers or gold_passage_ids and that "
            "split selects them (split=all takes every query)",
        )
    return GenerateResult(output, records_path, stats_path, counts["records_written"], stats, problems=incomplete)


def negatives_short(
    query: Query, found: Evidence, mix: NegativeMix, passages_by_id: Mapping[str, Passage]
) -> Counter[str]:
    """Negatives of each same-article kind asked for but not drawn, by why (no article known, too few passages)."""
    short: Counter[str] = Counter()
    if not retrieval_needed(query.needs_retrieval) or has_judged_output(query):
        return short
    for kind, asked, got in (("hard", mix.hard, found.hard), ("article", mix.article, found.article)):
        if asked and len(got) < asked:
            if article_of(query, passages_by_id) is None:
                why = "the question's article is unknown (no meta.title, no gold passage with a title)"
            else:
                why = "too few passages of the question's article without the answer"
            short[f"{kind}_negatives: {why}"] += 1
    return short


def start_over(output: Path) -> None:
    """Delete what an earlier gold run wrote into ``output`` (only its own files)."""
    for name in (RECORDS_FILE, HELDOUT_FILE, *CRITIC_OF.values(), STATS_FILE, FINGERPRINT_FILE):
        (output / name).unlink(missing_ok=True)


def written_ids(records_path: Path) -> set[str]:
    """Ids of the records already in ``records_path``; a partial last line (a killed write) is dropped."""
    if not records_path.exists():
        return set()
    truncate_partial_line(records_path)
    return {str(row.get("id")) for _, row in read_jsonl(records_path, "records")}


def check_no_held_records(records_path: Path, split: str) -> None:
    """Refuse to resume training records that hold a question marked dev or test (written before split=all sent
    them to heldout.jsonl): resuming would keep them where training reads them."""
    if not records_path.exists():
        return
    for number, row in read_jsonl(records_path, "records"):
        marked = (row.get("meta") or {}).get("split")
        if kept_out(marked, split):
            raise InputError(
                f"{records_path}:{number}: a record of a question marked {marked!r}, written by an older version "
                f"(split={split} now sends those to {HELDOUT_FILE}); pass restart=true to write the records again"
            )


def evidence_for(
    queries: Sequence[Query],
    retriever: Retriever,
    passages_by_id: Mapping[str, Passage],
    distractors: int | NegativeMix,
    answer_pool: Sequence[Query] = (),
) -> list[Evidence]:
    """Search only for queries that retrieve and take negatives; the others (no retrieval, a judged output) get
    empty evidence.

    ``answer_pool``: the questions whose answers may serve as support negatives (all selected ones, so a
    batch boundary does not change a record).
    """
    searches = [retrieval_needed(query.needs_retrieval) and not has_judged_output(query) for query in queries]
    searching = [query for query, search in zip(queries, searches, strict=True) if search]
    found = iter(
        find_evidence(searching, retriever, passages_by_id, distractors, answer_pool=answer_pool) if searching else []
    )
    return [next(found) if search else Evidence(()) for search in searches]


def record_stats(records_path: Path) -> dict[str, Any]:
    """Counts per label value per reflection type, per record kind, and of records and queries."""
    labels: dict[str, Counter[str]] = {slot: Counter() for slot in ("retrieve", "relevance", "support", "utility")}
    kinds: Counter[str] = Counter()
    query_ids = set()
    records = 0
    for _, row in read_jsonl(records_path, "records"):
        records += 1
        meta = row.get("meta") or {}
        kinds[str(meta.get("kind"))] += 1
        query_ids.add(meta.get("query_id"))
        for segment in row["segments"]:
            for slot in ("retrieve", "relevance", "support"):
                if segment.get(slot):
                    labels[slot][segment[slot]["value"]] += 1
        if row.get("utility"):
            labels["utility"][row["utility"]["value"]] += 1
    return {
        "records": records,
        "queries": len(query_ids),
        "kinds": dict(sorted(kinds.items())),
        "labels": {slot: dict(sorted(counter.items())) for slot, counter in labels.items()},
    }


def batched(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def joined_passages(passages: Sequence[Passage], files: Sequence[Path | None]) -> dict[str, Passage]:
    """Passages by id across passages and more_passages; ``InputError`` for an id two of them share."""
    by_id: dict[str, Passage] = {}
    for passage in passages:
        if passage.id in by_id:
            raise InputError(
                f"passage id {passage.id!r} is in more than one of passages / more_passages "
                f"({', '.join(map(str, files))}); each source's passage ids must be unique across them: prefix them "
                "with the source's name"
            )
        by_id[passage.id] = passage
    return by_id


def unique_queries(selected: Sequence[Query], main: Path | None, paths: Sequence[Path], split: str,
                   shard: str) -> list[Query]:
    """The selected queries followed by each further file's queries in ``split`` and ``shard`` (none where a file has
    no line in the split: the general-knowledge questions are all training ones); ``InputError`` for an id that two
    files share."""
    where = {query.id: str(main) for query in selected}
    joined = list(selected)
    for path in paths:
        for query in select_queries(load_queries(path), split, shard, path, required=False):
            if query.id in where:
                raise InputError(
                    f"{path}: query id {query.id!r} is also in {where[query.id]}; a question may be in one of "
                    "queries / more_queries only: remove one, or prefix each source's ids with its name"
                )
            where[query.id] = str(path)
            joined.append(query)
    return joined


def read_answers(path: Path) -> dict[str, str]:
    """An answers file (JSONL ``{id, output}``) as id -> output; ``InputError`` naming the line otherwise."""
    answers: dict[str, str] = {}
    for number, row in read_jsonl(path, "answers"):
        query_id, output = row.get("id"), row.get("output")
        if not isinstance(query_id, str) or not isinstance(output, str) or not output.strip():
            raise InputError(
                f"{path}:{number}: an answers line needs a string 'id' and a non-empty string 'output', got "
                f"{ {k: row.get(k) for k in ('id', 'output')} }; write {{\"id\": QUERY_ID, \"output\": ANSWER}}"
            )
        answers[query_id] = output
    return answers


def missing_inputs(config: GenerateConfig) -> None:
    """``InputError`` naming the first further input file that is not there (the setting, the path and the fix), before
    any slow work: a missing more_queries[1] would otherwise be found after the corpora are loaded. (passages and
    queries are read first, by loaders that say so themselves.)"""
    files = [*((f"more_passages[{number}]", Path(path)) for number, path in enumerate(config.more_passages)),
             *((f"more_queries[{number}]", Path(path)) for number, path in enumerate(config.more_queries)),
             *answers_files(config)]
    for key, path in files:
        if not path.exists():
            fix = f"drop it from {key.split('[')[0]}" if "[" in key else f"set {key}=null"
            raise InputError(f"{key}: file {str(path)!r} not found; check the path, or {fix}")


def answers_files(config: GenerateConfig) -> list[tuple[str, Path]]:
    """The answers files as the run's digests key them (only those set: older runs' inputs stay unchanged)."""
    first = [("answers", Path(config.answers))] if config.answers is not None else []
    return first + [(f"more_answers[{number}]", Path(path)) for number, path in enumerate(config.more_answers)]


def with_answers(queries: Sequence[Query], paths: Sequence[Path]) -> list[Query]:
    """``queries`` with each one listed in an answers file answering with its ``output`` there; ``InputError`` for an
    id two answers files list."""
    answers: dict[str, str] = {}
    where: dict[str, Path] = {}
    for path in paths:
        for query_id, output in read_answers(path).items():
            if query_id in answers:
                raise InputError(f"{path}: id {query_id!r} is answered in {where[query_id]} too; list each question "
                                 "in one answers file")
            answers[query_id], where[query_id] = output, path
    return [replace(query, output=answers[query.id]) if query.id in answers else query for query in queries]
