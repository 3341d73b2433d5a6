"""``selfrag eval``: the four modes on the same data and base model, with every metric, a table and plots.

    selfrag eval --config configs/eval/demo.yaml model=selfrag-quickstart/model output_dir=runs/eval

Writes into ``output_dir``: ``results.json`` (every figure), ``table.md``, ``quality.png`` and ``cost.png``,
``records/<mode>.jsonl`` (one line per example: answer, decisions, claims and their verdicts, cost),
``reflection.jsonl`` (per-label predictions) and the resolved ``config.yaml``.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfrag.config import to_dict, write_resolved
from selfrag.fsutil import claim_output, hold_output, left_clean_if_refused, write_json
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import build_engine, build_plain_engine
from selfrag.inference.prompted import BEHAVIOUR_VERSION as PROMPTED_VERSION
from selfrag.inference.runtime import BEHAVIOUR_VERSION
from selfrag.jsonl import write_jsonl_atomic
from selfrag.runs import file_digest, setting_defaults, setting_renames
from selfrag.sentences import split_sentences

from . import metrics, report
from .claims import Claim, CriticJudge, Judge, LLMJudge, NLIJudge, OverlapJudge
from .config import CPU_SECONDS_PER_QUESTION, MODE_TITLES, EvalConfig
from .counting import CountingEngine, base_model_of
from .data import check_not_trained_on, check_passages, load_examples, load_reflection_labels, passage_ids, searched
from .modes import ExampleRetriever, answer_all, plain_runner, prompted_runtime, selfrag_runner
from .resume import AnswerStore, mode_fingerprint, model_identity, predictions_key

logger = logging.getLogger(__name__)

RETRIEVING = ("plain_rag", "ft_rag", "prompted", "single_pass")
#: the resolved config (selfrag.config.write_resolved), written before the engines load
CONFIG_FILE = "config.yaml"
#: what sums up every mode's answers: removed once any mode is answered again, written again at the end
SUMMARY_FILES = ("results.json", "table.md", "reflection.jsonl", "quality.png", "cost.png")
#: how a one-decode baseline's answer is read (abstains only with the abstain sentence; hedges are reported)
BASELINE_VERSION = 2
#: answers of these modes are read or decided by versioned code: a new version answers again
RUNTIME_VERSIONS = {"single_pass": BEHAVIOUR_VERSION, "prompted": PROMPTED_VERSION,
                    **dict.fromkeys(("no_retrieval", "plain_rag", "ft_rag"), BASELINE_VERSION)}


@dataclass
class EvalResult:
    output_dir: Path
    summaries: dict[str, dict[str, Any]]
    reflection: dict[str, Any]
    table: str
    answers: str
    plots: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        parts = [self.answers, self.table]
        if self.reflection:
            parts.append(report.reflection_table(self.reflection))
        parts.append(f"results, records and plots in {self.output_dir}")
        return "\n".join(part for part in parts if part)


class _Engines:
    """Builds each model's engine once, on first use (``inference.engine`` with ``inference.engine_options``)."""

    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        self._trained: CountingEngine | None = None
        self._plain: dict[str, CountingEngine] = {}

    def trained(self) -> CountingEngine:
        if self._trained is None:
            self._trained = CountingEngine(build_engine(self.config.inference, self.config.model))
        return self._trained

    def trained_calibration(self) -> Any:
        """The trained model's calibration: its engine's where it is built or the model is a hub id, else read from
        the model folder's ``selfrag.json`` (a rerun that keeps every answer and label prediction never loads it)."""
        folder = Path(self.config.model).expanduser()
        if self._trained is not None or not folder.is_dir():  # a hub id: its engine resolves the model's files
            return getattr(self.trained(), "calibration", None)
        from selfrag.artifacts import load_meta

        meta = load_meta(folder)
        return None if meta is None else meta.calibration

    def plain(self, model: str | None = None) -> CountingEngine:
        name = model or self.config.base_model or base_model_of(self.config.model)
        if name not in self._plain:
            self._plain[name] = CountingEngine(build_plain_engine(self.config.inference, name))
        return self._plain[name]


def run(config: EvalConfig) -> EvalResult:
    """Answer, judge and report; a run refused on its inputs (trained questions, a wrong model) leaves no folder."""
    with left_clean_if_refused(config.output_dir, bookkeeping=(CONFIG_FILE,)), \
            hold_output(config.output_dir, "eval"):  # a second eval into the same folder is refused
        return _run(config)


def _run(config: EvalConfig) -> EvalResult:
    from tqdm.auto import tqdm

    from selfrag.inference.retrievers.spec import open_retriever

    started = time.monotonic()
    claim_output(config.output_dir, "eval", key="output_dir")
    examples = load_examples(config.data, config.format, config.limit, config.split)
    trained = 0  # the most questions any evaluated model was trained on (allow_trained_questions=true lets them in)
    for model in [config.model, *([config.ft_rag_model] if config.ft_rag_model else [])]:
        trained = max(trained, check_not_trained_on(examples, model, config.data, config.split, "eval",
                                                    config.allow_trained_questions))
    labels = load_reflection_labels(config.labels) if config.labels else []
    needs_passages = any(mode in config.modes for mode in RETRIEVING)
    check_passages(examples, searched(config.retriever), None, needs_passages)
    inference = config.inference
    opened = open_retriever(config.retriever)
    check_passages(examples, searched(config.retriever), passage_ids(opened), needs_passages)
    retriever = ExampleRetriever(examples, opened)
    out = config.output_dir
    write_resolved(config, out)
    engines = _Engines(config)
    # an NLI judge loads its own model: a wrong judge.model fails here, before any question is answered
    nli = _judge(config, engines) if config.judge.kind == "nli" else None

    records: dict[str, list[dict[str, Any]]] = {}
    pending: dict[str, list[dict[str, Any]]] = {}  # modes to answer (again, or the rest of): the rows kept so far
    store = AnswerStore(out)
    for dropped in store.forget_others(config.modes):
        (out / "records" / f"{dropped}.jsonl").unlink(missing_ok=True)  # not this run's: never left to mix in
        logger.info("%s: not in modes; its answers from an earlier run were removed", dropped)
    logger.info("%s", estimate(config, len(examples)))
    settings = to_dict(config)
    inputs = {"data": config.data, "corpus": config.retriever.corpus}
    digests = {name: None if path is None else file_digest(path) for name, path in inputs.items()}
    ids = [example.id for example in examples]
    identity = functools.cache(model_identity)  # the base model serves several modes: read its files once
    for mode in config.modes:
        model = mode_model(mode, config)
        # single-pass and prompted answers are the runtimes': a runtime that decides differently answers again
        version = RUNTIME_VERSIONS.get(mode)
        mode_settings = settings if version is None else {**settings, "runtime_version": version}
        fingerprint = mode_fingerprint(mode_settings, mode, identity(model), digests, out)
        done = store.start(mode, fingerprint, ids, setting_defaults(EvalConfig), setting_renames(EvalConfig))
        if len(done) == len(examples):
            records[mode] = done
            store.finish(mode)
        else:
            pending[mode] = done
    # The answers of the modes answered again and the folder's summaries are about to change: a run stopped from here
    # on leaves none of the old ones beside this run's config.yaml (all are written again once every mode is answered).
    if pending:
        for path in [out / "records" / f"{mode}.jsonl" for mode in pending] + [out / n for n in SUMMARY_FILES]:
            path.unlink(missing_ok=True)
    for mode, done in pending.items():
        engine, runner = _mode(mode, engines, retriever, inference, config)
        with tqdm(total=len(examples), initial=len(done), desc=MODE_TITLES[mode]) as bar:
            rest = answer_all(runner, engine, examples[len(done):], config.batch_size, bar,
                              on_batch=functools.partial(store.append, mode))
        records[mode] = done + rest
        store.finish(mode)
    records = {mode: records[mode] for mode in config.modes}  # the table's columns in the modes' order

    judge = nli or _judge(config, engines)
    for mode, rows in records.items():
        _judge_claims(judge, rows)
        write_jsonl_atomic(out / "records" / f"{mode}.jsonl", rows)

    for name in SUMMARY_FILES:  # an earlier run's (its labels, its plots) never stays beside this run's results
        (out / name).unlink(missing_ok=True)
    reflection: dict[str, Any] = {}
    if labels and config.labels is not None:
        from .token_agreement import agreement, predict

        key = predictions_key(settings, identity(config.model), config.labels, out)
        predictions = store.kept_predictions(key)
        if predictions is None:
            predictions = predict(engines.trained(), labels)
            store.keep_predictions(key, predictions)
        write_jsonl_atomic(out / "reflection.jsonl", predictions)
        # the relevance verdict as single-pass acts on it: at the model's calibrated (or configured) threshold
        calibration = engines.trained_calibration()
        reflection = agreement(predictions, inference.resolved(calibration).relevance_threshold)

    summaries = {mode: metrics.summarize(rows) for mode, rows in records.items()}
    table = report.markdown_table(summaries, config.judge.kind) if summaries else "(no mode ran)\n"
    if trained:  # said with the figures, wherever they are read (table.md, the printed table, results.json)
        table = report.trained_note(trained, len(examples)) + "\n" + table
    plots = report.write_plots(summaries, out) if config.plots and summaries else []
    (out / "table.md").write_text(table + ("\n" + report.reflection_table(reflection) if reflection else ""), "utf-8")
    results = {
        "data": str(config.data),
        "model": config.model,
        "base_model": config.base_model or (base_model_of(config.model) if _needs_base(config) else None),
        "ft_rag_model": config.ft_rag_model,
        "judge": config.judge.kind,
        "allow_trained_questions": config.allow_trained_questions,
        "trained_questions": trained,  # how many of the questions the model was trained on (trained-questions.json)
        "modes": summaries,
        "reflection": reflection,
        "hardware": _hardware(),
        "seconds": round(time.monotonic() - started, 1),
    }
    write_json(out / "results.json", results)
    answers = report.show_answers(records, config.show)
    return EvalResult(out, summaries, reflection, table, answers, plots)


def estimate(config: EvalConfig, examples: int) -> str:
    """One line before the run: how long it takes at most on 2 CPU cores with the 135M model (answers saved by an
    earlier run are not answered again), and what the prompted mode costs."""
    scale = config.inference.max_tokens / 48
    seconds = {mode: examples * CPU_SECONDS_PER_QUESTION[mode] * scale for mode in config.modes}
    total = sum(seconds.values())
    parts = ", ".join(f"{mode} ~{_duration(value)}" for mode, value in seconds.items())
    line = (f"estimate: {examples} questions x {len(config.modes)} modes, up to ~{_duration(total)} on 2 CPU cores "
            f"with a 135M model ({parts}); a GPU is much faster")
    if "prompted" not in config.modes:
        line += "; add prompted to modes for the prompted-critic baseline (~24 engine calls a question)"
    return line


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def mode_model(mode: str, config: EvalConfig) -> str:
    """The model a mode answers with: the trained model (single-pass), the fine-tuned RAG baseline (ft_rag), else the
    base model."""
    if mode == "single_pass":
        return config.model
    if mode == "ft_rag":
        assert config.ft_rag_model is not None  # validated
        return config.ft_rag_model
    return config.base_model or base_model_of(config.model)


def _needs_base(config: EvalConfig) -> bool:
    return any(mode in config.modes for mode in ("no_retrieval", "plain_rag", "prompted"))


def _mode(mode: str, engines: _Engines, retriever: ExampleRetriever, inference: InferenceConfig,
          config: EvalConfig) -> Any:
    from selfrag.inference.runtime import SelfRAG

    if mode in ("no_retrieval", "plain_rag", "ft_rag"):
        engine = engines.plain(config.ft_rag_model if mode == "ft_rag" else None)
        rag = mode != "no_retrieval"
        return engine, plain_runner(engine, retriever, inference.top_k, inference.max_tokens, inference.abstain_text,
                                    rag)
    if mode == "prompted":
        engine = engines.plain()
        return engine, selfrag_runner(prompted_runtime(engine, retriever, inference))
    engine = engines.trained()
    return engine, selfrag_runner(SelfRAG(engine, retriever, inference))


def _judge(config: EvalConfig, engines: _Engines) -> Judge | None:
    kind = config.judge.kind
    if kind == "none":
        return None
    if kind == "overlap":
        return OverlapJudge(config.judge.threshold)
    if kind == "llm":
        return LLMJudge(engines.plain(config.judge.model))
    if kind == "nli":
        assert config.judge.model is not None  # validated
        return NLIJudge.load(config.judge.model, config.judge.threshold)
    return CriticJudge(engines.trained(), config.judge.threshold)


def _judge_claims(judge: Judge | None, rows: list[dict[str, Any]]) -> None:
    """Split each answer into sentences and judge each against the passages the answer came from."""
    from selfrag.trajectory import Passage

    claims: list[Claim] = []
    owners: list[dict[str, Any]] = []
    for row in rows:
        row["claims"] = []
        if row["abstained"] or judge is None:
            continue
        passages = tuple(Passage(p["id"], p["title"], p["text"]) for p in row["cited"])
        for sentence in split_sentences(row["answer"]):
            if len(sentence) < 2:  # a stray "." or letter is no claim
                continue
            claims.append(Claim(row["question"], sentence, passages))
            owners.append(row)
    verdicts = judge.judge(claims) if judge is not None and claims else []
    for claim, owner, verdict in zip(claims, owners, verdicts, strict=True):
        owner["claims"].append({"sentence": claim.sentence, "supported": verdict})


def _hardware() -> dict[str, Any]:
    return {"machine": platform.machine(), "processor": platform.processor() or None, "cpus": os.cpu_count(),
            "python": platform.python_version()}
