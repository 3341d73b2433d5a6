"""Learn from outcomes: GRPO on a trained Self-RAG model, with retrieval in the loop (TRL ``GRPOTrainer``).

    selfrag rl --config configs/rl/smollm2-135m-cpu.yaml model=runs/smollm2-selfrag output_dir=runs/smollm2-rl

Each step samples ``training.generations`` rollouts for each of ``training.questions_per_step`` questions: the
policy decodes as the runtime's long form does and the retriever writes passages in where the model writes
``[Retrieval]`` (:mod:`selfrag.app.rl_rollout`); each rollout is scored by the reward's terms
(:mod:`selfrag.app.rl_reward`) and GRPO moves the LoRA weights toward the better rollouts of each group. Passage
tokens are masked out of the loss (TRL's ``env_mask``, the rollout function's output). With ``rollout.engine=vllm``
the rollouts decode in vLLM colocated with the trainer (:class:`VLLMRollouts`: the policy's LoRA saved and served
as a new ``LoRARequest`` each step).

Writes into ``output_dir``: the adapter, the tokenizer, ``selfrag.json`` (so ``selfrag ask``/``serve``/``eval`` load
it as any trained model), ``trained-questions.json`` (the starting model's and RL's questions), the resolved
``config.yaml``, ``rewards.json`` (every logged step's mean reward per term, and the rollouts' engine) and
``run.json``. Checkpoints go to ``output_dir/checkpoints``; a killed run started again with the same settings
resumes from the last one (:func:`selfrag.runs.check_rerun`, as ``selfrag train``); different settings are refused
unless ``restart=true``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfrag.artifacts import ModelMeta, load_trained_questions, save_meta, save_trained_questions
from selfrag.config import to_dict, write_resolved
from selfrag.corpus import Query, load_queries
from selfrag.errors import InputError
from selfrag.fsutil import write_json
from selfrag.inference.engines.options import EngineOptions, import_vllm
from selfrag.inference.retrievers.spec import open_retriever
from selfrag.loading import describe_model, embedding_rows, grow_embeddings, load_base_model
from selfrag.models import resolve_model
from selfrag.reflection import ReflectionIds
from selfrag.retrieval import Retriever
from selfrag.runs import check_rerun, run_fingerprint, setting_defaults
from selfrag.training.dataset import read_records
from selfrag.training.trainer import last_checkpoint

from .rl_config import RLConfig, RolloutConfig
from .rl_reward import TERMS, Reward, build_judge
from .rl_rollout import PolicyEngine, Rollouts

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
#: where rollout.engine=vllm writes the adapter it serves (the current step's only)
ROLLOUT_ADAPTER = "rollout-adapter"
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

    def summary(self) -> str:
        if self.already_trained:
            return (f"already trained: {self.output_dir} holds the finished run of these settings and questions; "
                    "nothing was changed (restart=true trains again from the start)")
        if not self.history:
            return f"adapter written to {self.output_dir} ({self.questions} questions); no step was logged"
        first, last = self.history[0], self.history[-1]
        terms = ", ".join(f"{term} {first.get(term, float('nan')):+.3f} -> {last.get(term, float('nan')):+.3f}"
                          for term in ("reward", *TERMS))
        timed = [row for row in self.history if "step_seconds" in row]
        clock = ""
        if timed:
            step = sum(row["step_seconds"] for row in timed) / len(timed)
            rollout = sum(row.get("rollout_seconds", 0.0) for row in timed) / len(timed)
            clock = f"\n{step:.1f} s a step, {rollout:.1f} s of it decoding rollouts (mean of the logged steps)"
        return (f"adapter written to {self.output_dir} ({self.questions} questions, steps {int(first['step'])}-"
                f"{int(last['step'])}{f', resumed from {self.resumed_from}' if self.resumed_from else ''})\n"
                f"mean reward per term, first -> last logged step: {terms}{clock}")


@dataclass(frozen=True)
class Policy:
    """The model GRPO trains (a PeftModel), its tokenizer and reflection ids, and what its selfrag.json says."""

    model: Any
    tokenizer: Any
    token_ids: ReflectionIds
    meta: ModelMeta
    directory: Path  # where it was loaded from


def run(config: RLConfig) -> RLResult:
    """Train the policy of ``config.model`` with GRPO and save the adapter into ``config.output_dir``."""
    from transformers import set_seed

    output_dir = Path(config.output_dir)
    state = check_rerun(output_dir, rl_fingerprint(config), config.restart, defaults=setting_defaults(RLConfig))
    # A finished run of the same settings is a no-op, as in selfrag train: resuming would rewrite its outputs.
    if state == "resume" and all((output_dir / name).is_file() for name in FINISHED_FILES):
        logger.info("%s already holds this finished run (same settings and questions); nothing to do", output_dir)
        rewards = json.loads((output_dir / REWARDS_FILE).read_text(encoding="utf-8"))
        return RLResult(output_dir, list(rewards.get("history") or []), int(rewards.get("questions", 0)),
                        rewards.get("resumed_from"), already_trained=True)

    # --- Questions and passages first: a bad file fails before a model loads ------------------------
    questions = read_questions(config)
    retriever = open_retriever(config.retriever)
    assert retriever is not None  # validate() requires one
    reward = Reward(config.reward, build_judge(config.reward))

    engine = rollout_engine(config.rollout.engine, config.model)
    logger.info("rollouts decode with %s%s", engine, " (vLLM colocated, the LoRA served each step)"
                if engine == "vllm" else "")

    # --- The policy: an adapter goes on training, a merged model gets a new LoRA --------------------
    set_seed(config.training.seed)
    policy = load_policy(config)

    # --- GRPO: rollouts through the runtime's decode, the reward's terms, passage tokens masked ------
    trainer = grpo_trainer(config, policy, questions, retriever, reward, output_dir / CHECKPOINTS, engine)
    resume = last_checkpoint(output_dir / CHECKPOINTS) if state == "resume" else None
    if resume:
        logger.info("resuming from %s", resume)
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        trainer.rollout_func.close()  # vLLM's engine processes and memory, where it decoded the rollouts

    # --- Save: adapter, tokenizer, selfrag.json, resolved config, rewards per term ------------------
    # the LoRA and the trained reflection rows, not the grown embedding matrix (selfrag.loading grows the base again)
    policy.model.save_pretrained(str(output_dir), save_embedding_layers=False)
    policy.tokenizer.save_pretrained(str(output_dir))
    meta = policy.meta
    save_meta(output_dir, ModelMeta(policy.token_ids, meta.strategy, meta.prompt_template, meta.base_model, "adapter"))
    write_resolved(config, output_dir)
    write_trained_questions(output_dir, policy.directory, questions)
    history = reward_history(trainer.state.log_history)
    shutil.rmtree(output_dir / ROLLOUT_ADAPTER, ignore_errors=True)
    write_json(output_dir / REWARDS_FILE, {"history": history, "resumed_from": resume, "questions": len(questions),
                                           "rollout_engine": engine})
    return RLResult(output_dir, history, len(questions), resume, policy.model)


def rl_fingerprint(config: RLConfig) -> dict[str, Any]:
    """The settings and the data's content hashes that make a run; ``run.json`` in its output_dir."""
    inputs = {"queries": config.queries, "records": config.records}
    return run_fingerprint("rl", to_dict(config), inputs, ignore=("output_dir", "restart"))


def read_questions(config: RLConfig) -> list[Query]:
    """The questions to train on: the split (or the records' questions), each with gold answers or unanswerable."""
    queries = load_queries(config.queries)
    if config.records is not None:
        wanted = {str(record.meta.get("query_id", record.id)) for record in read_records(config.records)}
        queries = [query for query in queries if query.id in wanted]
    elif config.split != "all":
        queries = [query for query in queries if query.meta.get("split") == config.split]
    queries = [query for query in queries if query.answers or not query.answerable]
    queries = queries[: config.limit] if config.limit is not None else queries
    if not queries:
        where = f"records={config.records}" if config.records is not None else f"split={config.split}"
        raise InputError(f"queries {str(config.queries)!r}: no question with gold answers (or answerable: false) "
                         f"is selected by {where}; check the file, or use split=all")
    return queries


def load_policy(config: RLConfig) -> Policy:
    """An adapter from ``selfrag train`` with its LoRA trainable, or a merged model wrapped in a new LoRA."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    served = describe_model(config.model)
    meta, tokenizer = served.meta, served.tokenizer
    dtype = getattr(torch, config.dtype)
    if served.is_adapter:
        base: Any = load_base_model(resolve_model(meta.base_model), dtype, random_init=config.random_init,
                                    seed=config.training.seed)
        grow_embeddings(base, embedding_rows(tokenizer, meta.token_ids))
        model = PeftModel.from_pretrained(base, str(served.directory), is_trainable=True)
    else:
        merged: Any = load_base_model(str(served.directory), dtype, random_init=config.random_init,
                                      seed=config.training.seed)
        lora = config.lora
        model = get_peft_model(merged, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                  target_modules=lora.target_modules, task_type="CAUSAL_LM"))
        meta = ModelMeta(meta.token_ids, meta.strategy, meta.prompt_template, str(served.directory), "adapter")
    return Policy(model, tokenizer, meta.token_ids, meta, served.directory)


def rollout_engine(choice: str, model: str) -> str:
    """What decodes the rollouts, ``hf`` or ``vllm`` (``rollout.engine``; ``auto`` resolved here): vLLM serves the
    policy's LoRA through ``LoRARequest``, which takes a ``tokens.strategy=reserved`` adapter only. Checked before
    any model loads: a policy vLLM cannot serve, or no vLLM, is one line naming the fix."""
    if choice == "hf":
        return "hf"
    served = describe_model(model)
    servable = served.is_adapter and served.meta.strategy == "reserved"
    if choice == "auto":
        import torch

        found = importlib.util.find_spec("vllm") is not None
        return "vllm" if servable and found and torch.cuda.is_available() else "hf"
    if not servable:
        what = f"a tokens.strategy={served.meta.strategy} adapter" if served.is_adapter else "a merged model"
        raise InputError(f"rollout.engine=vllm serves the policy's LoRA through vLLM's LoRARequest, which needs a "
                         f"tokens.strategy=reserved adapter; model {model!r} is {what}: use rollout.engine=hf")
    import_vllm("rollout.engine=vllm")
    return "vllm"


def write_trained_questions(output_dir: Path, start: Path, questions: Sequence[Query]) -> None:
    """``trained-questions.json``: the questions RL trained on and those the starting model had (calibrate and eval
    refuse them)."""
    path = save_trained_questions(output_dir, [query.question for query in questions])
    earlier = load_trained_questions(start)
    if earlier:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["questions"] = sorted(set(data["questions"]) | earlier)
        write_json(path, data)


class MergedLora:
    """The LoRA folded into the base weights while the rollouts decode (``rollout.merge_lora``): the decode then runs
    a plain model (2.2x faster on the 8B shape on an H200, benchmarks/rollout_profile.py). PEFT's unmerge rounds:
    in bfloat16 a merge and unmerge a step moved the weights by 0.24% (rms) over 100 steps, half a LoRA update's size,
    so the weights are put back from a copy of them taken once (the base is frozen): exact, at the memory of a second
    copy of the adapted weights on their device (14 GB on the 8B shape, 0.5 GB on SmolLM2-135M in float32)."""

    def __init__(self) -> None:
        self.originals: dict[str, Any] = {}

    @staticmethod
    def applies(model: Any) -> bool:
        """A PEFT model whose base is not quantised (4/8-bit weights cannot be put back by a copy)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else None
        return base is not None and hasattr(model, "merge_adapter") and not getattr(base, "is_quantized", False) \
            and not getattr(base, "is_loaded_in_4bit", False) and not getattr(base, "is_loaded_in_8bit", False)

    def merge(self, model: Any) -> None:
        import torch

        if not self.originals:
            with torch.no_grad():
                self.originals = {name: tensor.detach().clone() for name, tensor in self._base_weights(model).items()}
        model.merge_adapter()

    def unmerge(self, model: Any) -> None:
        import torch

        model.unmerge_adapter()  # PEFT's own state (which adapters are merged) back to unmerged
        with torch.no_grad():
            for name, tensor in self._base_weights(model).items():
                tensor.copy_(self.originals[name])

    @staticmethod
    def _base_weights(model: Any) -> dict[str, Any]:
        """The frozen tensors a merge writes: the weights of every adapted layer's base layer."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        found = {}
        for name, module in model.named_modules():
            if isinstance(module, BaseTunerLayer):
                base = module.get_base_layer()
                for key, tensor in base.named_parameters(recurse=False):
                    found[f"{name}.{key}"] = tensor
        return found


class VLLMRollouts:
    """vLLM colocated with the trainer (``rollout.engine=vllm``): the starting adapter's base loaded once in vLLM;
    before each step's rollouts the policy's LoRA as it is now is saved to ``folder`` and served under a new
    ``LoRARequest`` id (:meth:`~selfrag.inference.engines.vllm.VLLMEngine.replace_adapter`; the last step's is
    dropped), so every step samples the policy being trained. The tokens vLLM samples are what GRPO trains on; TRL
    computes their log-probs with the policy itself."""

    def __init__(self, policy: Policy, folder: Path, options: EngineOptions) -> None:
        from selfrag.inference.engines.vllm import VLLMEngine

        self.engine = VLLMEngine(policy.directory, options)
        self.folder = folder
        self.served: Path | None = None

    def serve(self, model: Any, step: int, seed: int) -> Any:
        """The engine, serving ``model``'s current LoRA and sampling from ``seed``."""
        path = self.folder / f"step-{step}"
        shutil.rmtree(path, ignore_errors=True)
        model.save_pretrained(str(path), save_embedding_layers=False)
        self.engine.replace_adapter(path)
        self.engine.reseed(seed)
        if self.served is not None and self.served != path:
            shutil.rmtree(self.served, ignore_errors=True)
        self.served = path
        return self.engine


class RolloutFunction:
    """TRL's ``rollout_func``: the prompts (each repeated ``generations`` times by GRPO's sampler) -> rollouts of the
    current policy. Sampling is seeded by the step, so a resumed run samples what the killed one would have.
    ``engine``: ``hf`` decodes with the policy itself (its LoRA merged while it decodes, ``rollout.merge_lora``);
    ``vllm`` in vLLM (:class:`VLLMRollouts`, the adapters it serves in the output folder's ``rollout-adapter``)."""

    def __init__(self, policy: Policy, retriever: Retriever, config: RolloutConfig, seed: int,
                 engine: str = "hf") -> None:
        self.policy, self.retriever, self.config, self.seed = policy, retriever, config, seed
        self.engine = engine
        self.merged = MergedLora()
        self.vllm: VLLMRollouts | None = None

    def close(self) -> None:
        """Stop the rollouts' vLLM engine (nothing to do for hf)."""
        if self.vllm is not None:
            self.vllm.engine.close()
            self.vllm = None

    def __call__(self, prompts: Sequence[str], trainer: Any) -> dict[str, Any]:
        started = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        seed = self.seed + 1009 * trainer.state.global_step + trainer.accelerator.process_index
        if self.engine == "vllm":
            if self.vllm is None:
                # output_dir (the args' is its checkpoints); a folder per process: one writer each
                process = trainer.accelerator.process_index
                scratch = Path(trainer.args.output_dir).parent / ROLLOUT_ADAPTER / f"rank{process}"
                self.vllm = VLLMRollouts(self.policy, scratch, self.config.vllm_options())
            engine = self.vllm.serve(model, trainer.state.global_step, seed)
            rollouts = Rollouts(engine, self.retriever, self.config).run(list(prompts))
        else:
            engine = PolicyEngine(model, self.policy.tokenizer, self.policy.token_ids,
                                  self.policy.meta.prompt_template, seed=seed)
            merge = self.config.merge_lora and MergedLora.applies(model)
            if merge:
                self.merged.merge(model)
            try:
                rollouts = Rollouts(engine, self.retriever, self.config).run(list(prompts))
            finally:
                if merge:
                    self.merged.unmerge(model)
        completions, masks = [], []
        for rollout in rollouts:
            ids, mask = list(rollout.completion_ids), list(rollout.env_mask)
            if rollout.finish == "eos":  # the model sampled the end of sequence: TRL reads it as a finished answer
                ids, mask = ids + [engine.eos_ids[0]], mask + [1]
            completions.append(ids)
            masks.append(mask)
        trainer._metrics["train"][TIMINGS["rollout_seconds"]].append(time.perf_counter() - started)
        return {"prompt_ids": [list(r.prompt_ids) for r in rollouts], "completion_ids": completions,
                "logprobs": None, "env_mask": masks, "rollout": rollouts}


def grpo_trainer(config: RLConfig, policy: Policy, questions: Sequence[Query], retriever: Retriever, reward: Reward,
                 checkpoints: Path, engine: str = "hf") -> Any:
    """TRL's GRPOTrainer (:class:`~.rl_trainer.SelfRAGGRPOTrainer`) with the runtime's rollouts, one reward function
    per term and its weight."""
    import os

    from datasets import Dataset
    from trl import GRPOConfig

    from .rl_trainer import SelfRAGGRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.x: pinned by tests
    training = config.training
    options: dict[str, Any] = {"bf16": False, "gradient_checkpointing": False, "report_to": "none",
                               "save_strategy": "steps", "logging_first_step": True,
                               "dataloader_pin_memory": False, **config.trl}
    arguments = GRPOConfig(
        output_dir=str(checkpoints), learning_rate=training.learning_rate, max_steps=training.max_steps,
        per_device_train_batch_size=training.questions_per_step * training.generations,
        num_generations=training.generations, beta=training.beta, seed=training.seed,
        logging_steps=training.logging_steps, save_steps=training.save_steps, reward_weights=reward.weights,
        temperature=config.rollout.temperature, **options,
    )
    data = Dataset.from_list([{"prompt": q.question, "answers": list(q.answers), "answerable": q.answerable}
                              for q in questions])
    return SelfRAGGRPOTrainer(
        model=policy.model, reward_funcs=reward.functions(), args=arguments, train_dataset=data,
        processing_class=policy.tokenizer,
        rollout_func=RolloutFunction(policy, retriever, config.rollout, training.seed, engine),
    )


#: rewards.json's names of the timings SelfRAGGRPOTrainer logs (means over the steps since the previous log)
TIMINGS = {"step_seconds": "time/step_seconds", "rollout_seconds": "time/rollout_seconds",
           "peak_allocated_gb": "memory/peak_allocated_gb", "completion_tokens": "completions/mean_length"}


def reward_history(log_history: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """Each logged step's mean reward in all and per term (TRL's ``rewards/<term>/mean``), its wall seconds and the
    rollouts' part of them, the CUDA allocator's peak so far (GB) and the rollouts' mean length in tokens."""
    rows = []
    for entry in log_history:
        if "reward" not in entry:
            continue
        row = {"step": float(entry["step"]), "reward": float(entry["reward"])}
        row.update({term: float(entry[f"rewards/{term}/mean"]) for term in TERMS if f"rewards/{term}/mean" in entry})
        row.update({name: round(float(entry[key]), 3) for name, key in TIMINGS.items() if entry.get(key) is not None})
        rows.append(row)
    return rows
