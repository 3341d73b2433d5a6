"""Learn from outcomes: GRPO on a trained Self-RAG model, with retrieval in the loop (TRL ``GRPOTrainer``).

    selfrag rl --config configs/rl/smollm2-135m-cpu.yaml model=runs/smollm2-selfrag output_dir=runs/smollm2-rl

Each step samples ``training.generations`` rollouts for each of ``training.questions_per_step`` questions: the
policy decodes as the runtime's long form does and the retriever writes passages in where the model writes
``[Retrieval]`` (:mod:`selfrag.rl.rollout`); each rollout is scored by the reward's terms
(:mod:`selfrag.rl.reward`) and GRPO moves the LoRA weights toward the better rollouts of each group. Passage
tokens are masked out of the loss (TRL's ``env_mask``, the rollout function's output:
:mod:`selfrag.rl.rollout_function`). With ``rollout.engine=vllm`` the rollouts decode in vLLM colocated with the
trainer (:mod:`selfrag.rl.vllm_rollouts`: the policy's LoRA saved and served as a new ``LoRARequest`` each step).

Writes into ``output_dir``: the adapter, the tokenizer, ``selfrag.json`` (so ``selfrag ask``/``serve``/``eval`` load
it as any trained model), ``trained-questions.json`` (the starting model's and RL's questions), the resolved
``config.yaml``, ``rewards.json`` (every logged step's mean reward per term, and the rollouts' engine) and
``run.json``. The start model's calibration is kept in ``selfrag.json`` marked ``measured_on`` the start model, and
the summary says to run ``selfrag calibrate`` on the RL model (:func:`carried_calibration`). Checkpoints go to
``output_dir/checkpoints``; a killed run started again with the same settings resumes from the last one
(:func:`selfrag.runs.check_rerun`, as ``selfrag train``); different settings are refused unless ``restart=true``.
Ctrl-C finishes the step, saves a checkpoint and stops (:class:`selfrag.training.interrupt.SaveOnInterrupt`), so
the same command resumes there even before the first ``training.save_steps`` checkpoint.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from selfrag.artifacts import ModelMeta, load_meta, load_trained_questions, save_meta, save_trained_questions
from selfrag.config import to_dict, write_resolved
from selfrag.corpus import Query, load_queries
from selfrag.errors import InputError
from selfrag.fsutil import hold_output, write_json
from selfrag.inference.retrievers.spec import open_retriever
from selfrag.retrieval import Retriever
from selfrag.runs import check_rerun, run_fingerprint, setting_defaults, setting_renames
from selfrag.training.dataset import read_records
from selfrag.training.trainer import last_checkpoint

from .config import RLConfig
from .history import reward_history
from .policy import load_policy, rollout_engine
from .reward import TERMS, Reward, build_judge
from .rollout_function import ROLLOUT_ADAPTER

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
REWARDS_FILE = "rewards.json"
#: what a finished run holds (rewards.json is written last)
FINISHED_FILES = ("adapter_model.safetensors", "selfrag.json", REWARDS_FILE)


@dataclass(frozen=True)
class RLResult:
    """What a run produced: where, the logged rewards per term, and where it resumed from."""

    output_dir: Path
    history: list[dict[str, float]]
    questions: int
    resumed_from: str | None
    model: Any = None
    already_trained: bool = False  # a rerun of a finished run: nothing was trained or written
    calibration_from: str | None = None  # the model the output's calibration was measured on (None: none carried)

    def summary(self) -> str:
        if self.calibration_from is None:
            return self._outcome()
        return (f"{self._outcome()}\ncalibration: kept from {self.calibration_from}, where it was measured "
                f"(selfrag.json says measured_on); measure it on this model: selfrag calibrate "
                f"model={self.output_dir} data=<dev questions> split=dev retriever.*=<the same passages>")

    def _outcome(self) -> str:
        if self.already_trained:
            return (f"already trained: {self.output_dir} holds the finished run of these settings and questions; "
                    "nothing was changed (restart=true trains again from the start)")
        if not self.history:
            return f"adapter written to {self.output_dir} ({self.questions} questions); no step was logged"
        first, last = self.history[0], self.history[-1]
        terms = ", ".join(f"{term} {first.get(term, float('nan')):+.3f} -> {last.get(term, float('nan')):+.3f}"
                          for term in ("reward", *TERMS))
        timed = [row for row in self.history if "step_seconds" in row]
        clock = f"\n{step_clock(timed)}" if timed else ""
        return (f"adapter written to {self.output_dir} ({self.questions} questions, steps {int(first['step'])}-"
                f"{int(last['step'])}{f', resumed from {self.resumed_from}' if self.resumed_from else ''})\n"
                f"mean reward per term, first -> last logged step: {terms}{clock}")


def step_clock(timed: list[dict[str, float]]) -> str:
    """The time a step takes, from the logged steps: the first is left out of the mean where others follow, since it
    also starts the rollout engine (vLLM's start, its compile and CUDA graphs: over a minute for an 8B model) and warms
    the kernels, which a long run pays once."""
    later = timed[1:] or timed
    step = sum(row["step_seconds"] for row in later) / len(later)
    rollout = sum(row.get("rollout_seconds", 0.0) for row in later) / len(later)
    if len(timed) == 1:
        return f"{step:.1f} s a step, {rollout:.1f} s of it decoding rollouts (one logged step, with the warm-up)"
    return (f"{step:.1f} s a step, {rollout:.1f} s of it decoding rollouts (mean of the logged steps after the first; "
            f"the first took {timed[0]['step_seconds']:.1f} s: the warm-up, and vLLM's start where it decodes)")


def run(config: RLConfig) -> RLResult:
    """Train the policy of ``config.model`` with GRPO and save the adapter into ``config.output_dir``."""
    with hold_output(config.output_dir, "rl"):  # a second rl into the folder is refused: checkpoints interleave
        return _run(config)


def _run(config: RLConfig) -> RLResult:
    from transformers import set_seed

    output_dir = Path(config.output_dir)
    state = check_rerun(output_dir, rl_fingerprint(config), config.restart, defaults=setting_defaults(RLConfig),
                        renamed=setting_renames(RLConfig))
    # A finished run of the same settings is a no-op, as in selfrag train: resuming would rewrite its outputs.
    if state == "resume" and all((output_dir / name).is_file() for name in FINISHED_FILES):
        logger.info("%s already holds this finished run (same settings and questions); nothing to do", output_dir)
        rewards = json.loads((output_dir / REWARDS_FILE).read_text(encoding="utf-8"))
        return RLResult(output_dir, list(rewards.get("history") or []), int(rewards.get("questions", 0)),
                        rewards.get("resumed_from"), already_trained=True,
                        calibration_from=measured_on(load_meta(output_dir)))

    # --- Questions and passages first: a bad file fails before a model loads ------------------------
    questions = read_questions(config)
    retriever = open_rl_retriever(config)
    reward = Reward(config.reward, build_judge(config.reward))

    engine = rollout_engine(config.rollout.engine, config.model)
    logger.info("rollouts decode with %s%s", engine, " (vLLM colocated, the LoRA served each step)"
                if engine == "vllm" else "")

    # --- The policy: an adapter goes on training, a merged model gets a new LoRA --------------------
    set_seed(config.training.seed)
    policy = load_policy(config)

    # --- GRPO: rollouts through the runtime's decode, the reward's terms, passage tokens masked ------
    from selfrag.training.interrupt import SaveOnInterrupt  # transformers, as the trainer

    from .trainer import grpo_trainer  # torch, TRL: loaded once the inputs are checked

    trainer = grpo_trainer(config, policy, questions, retriever, reward, output_dir / CHECKPOINTS, engine)
    interrupt = SaveOnInterrupt()  # Ctrl-C: a checkpoint at the end of the step, so the same command resumes
    trainer.add_callback(interrupt)
    resume = last_checkpoint(output_dir / CHECKPOINTS) if state == "resume" else None
    if resume:
        logger.info("resuming from %s", resume)
    try:
        with interrupt.listening(trainer.accelerator.num_processes):  # several: left to the launcher
            trainer.train(resume_from_checkpoint=resume)
    finally:
        trainer.rollout_func.close()  # vLLM's engine processes and memory, where it decoded the rollouts
    interrupt.stop_if_interrupted()

    # --- Save: adapter, tokenizer, selfrag.json, resolved config, rewards per term ------------------
    # the LoRA and the trained reflection rows, not the grown embedding matrix (selfrag.loading grows the base again)
    policy.model.save_pretrained(str(output_dir), save_embedding_layers=False)
    policy.tokenizer.save_pretrained(str(output_dir))
    meta = policy.meta
    calibration = carried_calibration(meta.calibration, policy.directory)
    save_meta(output_dir, ModelMeta(policy.token_ids, meta.strategy, meta.prompt_template, meta.base_model, "adapter",
                                    calibration))
    write_resolved(config, output_dir)
    write_trained_questions(output_dir, policy.directory, questions)
    history = reward_history(trainer.state.log_history)
    shutil.rmtree(output_dir / ROLLOUT_ADAPTER, ignore_errors=True)
    write_json(output_dir / REWARDS_FILE, {"history": history, "resumed_from": resume, "questions": len(questions),
                                           "rollout_engine": engine})
    return RLResult(output_dir, history, len(questions), resume, policy.model,
                    calibration_from=measured_on(load_meta(output_dir)))


def carried_calibration(calibration: dict[str, Any] | None, start: Path) -> dict[str, Any] | None:
    """The start model's calibration for the RL model's selfrag.json, marked ``measured_on`` the start model (a
    calibration carried through several RL runs keeps naming the model it was measured on); None where it has none.

    Kept, not dropped: its thresholds were chosen on the start policy, which RL moved, so they are a starting point,
    not a measurement of this model; the summary says so in one line and names ``selfrag calibrate``, whose
    calibration replaces this one (without ``measured_on``)."""
    if calibration is None:
        return None
    return {**calibration, "measured_on": str(calibration.get("measured_on") or start)}


def measured_on(meta: ModelMeta | None) -> str | None:
    """Where the calibration in ``meta`` was measured when it was carried from another model (None: measured on this
    model by ``selfrag calibrate``, or no calibration)."""
    calibration = meta.calibration if meta is not None else None
    value = calibration.get("measured_on") if calibration else None
    return str(value) if value else None


def rl_fingerprint(config: RLConfig) -> dict[str, Any]:
    """The settings and the data's content hashes that make a run; ``run.json`` in its output_dir."""
    inputs: dict[str, Path | None] = {"queries": config.queries, "records": config.records}
    # each further file by content, keys only when set (a run made before they existed keeps its fingerprint)
    inputs.update({f"more_queries[{number}]": path for number, path in enumerate(config.more_queries)})
    inputs.update({f"more_passages[{number}]": path for number, path in enumerate(config.more_passages)})
    return run_fingerprint("rl", to_dict(config), inputs, ignore=("output_dir", "restart", "more_queries",
                                                                  "more_passages"))


def read_questions(config: RLConfig) -> list[Query]:
    """The questions to train on: the split (or the records' questions) of ``queries`` and ``more_queries``, each with
    gold answers or unanswerable, at most ``per_source`` of each source, then the first ``limit``."""
    queries = joined_queries([config.queries, *config.more_queries])
    if config.records is not None:
        wanted = {str(record.meta.get("query_id", record.id)) for record in read_records(config.records)}
        queries = [query for query in queries if query.id in wanted]
    elif config.split != "all":
        queries = [query for query in queries if query.meta.get("split") == config.split]
    queries = [query for query in queries if query.answers or not query.answerable]
    if config.per_source is not None:
        queries = per_source(queries, config.per_source)
    queries = queries[: config.limit] if config.limit is not None else queries
    if not queries:
        where = f"records={config.records}" if config.records is not None else f"split={config.split}"
        raise InputError(f"queries {str(config.queries)!r}: no question with gold answers (or answerable: false) "
                         f"is selected by {where}; check the file, or use split=all")
    return queries


def joined_queries(paths: Sequence[Path]) -> list[Query]:
    """Every file's queries in order, each tagged with its file where it names no ``meta.source``; ``InputError`` for
    an id two files share."""
    where: dict[str, Path] = {}
    joined = []
    for path in paths:
        for query in load_queries(path):
            if query.id in where:
                raise InputError(
                    f"{path}: query id {query.id!r} is also in {where[query.id]}; a question may be in one of "
                    "queries / more_queries only: remove one, or prefix each source's ids with its name")
            where[query.id] = path
            if "source" not in query.meta:
                query = replace(query, meta={**query.meta, "source": str(path)})
            joined.append(query)
    return joined


def per_source(queries: Sequence[Query], most: int) -> list[Query]:
    """The first ``most`` questions of each ``meta.source``, source by source in the order the sources first appear
    (GRPO's sampler shuffles them; the order only fixes which questions a seed draws)."""
    by_source: dict[str, list[Query]] = {}
    for query in queries:
        kept = by_source.setdefault(str(query.meta.get("source")), [])
        if len(kept) < most:
            kept.append(query)
    return [query for kept in by_source.values() for query in kept]


def open_rl_retriever(config: RLConfig) -> Retriever:
    """The rollouts' retriever: ``retriever`` as every stage opens it, ``more_passages`` joined to its corpus."""
    retriever = open_retriever(config.retriever, more=config.more_passages)
    assert retriever is not None  # validate() requires one
    return retriever


def write_trained_questions(output_dir: Path, start: Path, questions: Sequence[Query]) -> None:
    """``trained-questions.json``: the questions RL trained on and those the starting model had (calibrate and eval
    refuse them)."""
    path = save_trained_questions(output_dir, [query.question for query in questions])
    earlier = load_trained_questions(start)
    if earlier:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["questions"] = sorted(set(data["questions"]) | earlier)
        write_json(path, data)


