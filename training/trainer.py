"""What a run's trainer (:class:`~selfrag.training.sft_trainer.SelfRAGSFTTrainer`) is given: held-out evaluation
during training, method full's scaled reflection-row steps, the ``SFTConfig`` options, checkpoints and saving.

    arguments = sft_arguments(config, checkpoints)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from selfrag.errors import ConfigError, InputError
from selfrag.reflection import ReflectionIds
from selfrag.training.config import TrainConfig
from selfrag.training.distributed import use_cpu_backend
from selfrag.training.evaluate import reflection_accuracy
from selfrag.training.judgement import headline, judge

logger = logging.getLogger(__name__)


@contextmanager
def lora_head_allowed(model: Any) -> Iterator[None]:
    """Let TRL's SFTTrainer take a model with LoRA on ``lm_head`` (strategy ``reserved``).

    TRL 1.16 refuses it in ``__init__`` because its fused loss reads ``lm_head.weight`` directly and would
    never train the adapter. This recipe's loss is the model's own forward (``SelfRAGSFTTrainer``), which
    goes through the LoRA head, so the check does not apply; it is hidden only while the trainer is built.
    """
    model.get_output_embeddings = lambda: None  # an instance attribute shadows the method
    try:
        yield
    finally:
        del model.get_output_embeddings


def check_sharding(trainer: Any, strategy: str, config: TrainConfig | None = None) -> None:
    """Refuse what sharded parameters break: strategy ``reserved``'s gradient masks (LoRA), and method full's
    scaled row steps, which index the embedding matrix that FSDP / ZeRO-3 hold in shards."""
    sharded = trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled
    full = config is not None and config.method == "full"
    if sharded and full and config is not None and config.training.row_lr_multiplier != 1.0:
        raise ConfigError([
            f"training.row_lr_multiplier={config.training.row_lr_multiplier} with method=full scales the "
            "reflection rows' steps inside the embedding matrix, which FSDP and DeepSpeed ZeRO-3 shard; set "
            "training.row_lr_multiplier=1 or launch with configs/accelerate/ddp.yaml or single_gpu.yaml"
        ])
    if strategy == "reserved" and sharded and not full:
        raise ConfigError([
            "tokens.strategy=reserved keeps the other rows of its embed_tokens/lm_head LoRA at zero with gradient "
            "masks, which FSDP and DeepSpeed ZeRO-3 bypass; launch with configs/accelerate/ddp.yaml or "
            "single_gpu.yaml (an 8B LoRA fits one GPU), or use tokens.strategy=add"
        ])


def save_adapter(trainer: Any, model: Any, output_dir: Path, kind: str = "adapter") -> None:
    """Write the adapter (or, ``kind`` merged, the whole model) once: gathered from the shards under
    FSDP/DeepSpeed, else from the main process.

    Strategy ``add``: the base is resized before the adapter loads and the new rows live in the
    trainable-token deltas; ``reserved``: the base is unchanged. Either way the full embedding matrix need
    not be saved with the adapter (and vLLM's loader skips it). method full: the model with its grown
    embedding, as ``from_pretrained`` reads it.
    """
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        trainer.save_model(str(output_dir))  # gathers the sharded weights; writes on the main process only
    elif trainer.is_world_process_zero():
        if kind == "merged":
            model.save_pretrained(str(output_dir))
        else:
            model.save_pretrained(str(output_dir), save_embedding_layers=False)



def sft_options(config: TrainConfig, checkpoints: Path, plan: Any = None) -> dict[str, Any]:
    """``trl.SFTConfig`` keyword arguments: the recipe's settings, then the ``trl`` pass-through, then the micro-batch
    and checkpointing of ``plan`` (a :class:`~selfrag.training.plan.BatchPlan`, ``training.memory_plan``)."""
    training = config.training
    options: dict[str, Any] = {
        "output_dir": str(checkpoints),
        "learning_rate": training.learning_rate,
        "num_train_epochs": training.epochs,
        "max_steps": training.max_steps,
        "per_device_train_batch_size": training.batch_size,
        "gradient_accumulation_steps": training.gradient_accumulation_steps,
        "seed": training.seed,
        "logging_steps": training.logging_steps,
        "save_steps": training.save_steps,
        # Pre-tokenized with our own labels: TRL must neither re-tokenize, rebuild labels nor truncate.
        "dataset_kwargs": {"skip_prepare_dataset": True},
        "max_length": None,
        "packing": False,
        # Batches of similar length: padding was ~30% of the tokens with random batches of demo records. With
        # order=question the examples are already arranged (order_by_question) and are read as they stand.
        "train_sampling_strategy": "group_by_length" if training.order == "length" else "sequential",
        # Checkpointing costs time for no gain at these sizes; bf16 autocast where the hardware does it natively.
        "gradient_checkpointing": False,
        "bf16": use_bf16(training.bf16),
        "report_to": "none",
        "include_num_input_tokens_seen": "non_padding",  # metrics.json's tokens/s (training.resources.StepTimer)
        "dataloader_pin_memory": torch.cuda.is_available(),
        "save_total_limit": 2,
    }
    if use_cpu_backend():  # several processes, no GPU: one gloo group, not N independent single-process runs
        options.update(use_cpu=True, ddp_backend="gloo")
    if config.lora.layers is not None:  # an untied base's input rows get no gradient then: DDP must not wait for it
        options["ddp_find_unused_parameters"] = True
    options.update(config.trl)
    if plan is not None:
        options.update(per_device_train_batch_size=plan.micro_batch, gradient_accumulation_steps=plan.accumulation,
                       gradient_checkpointing=plan.checkpointing)
    if (options.get("bf16") or options.get("fp16")) and not torch.cuda.is_available():
        # transformers refuses mixed precision without a GPU unless told it trains on the CPU
        options.setdefault("use_cpu", True)
    given = options.get("lr_scheduler_kwargs")
    scheduler = dict(json.loads(given) if isinstance(given, str) else given or {})  # JSON text: checked by validate
    decay = scheduler.get("num_decay_steps")
    if isinstance(decay, float) and 0 < decay < 1 and training.max_steps > 0:
        # a ratio of the run, as transformers reads a float warmup_steps: the recipe's decay stays its last fifth
        # whether the run is the quickstart's 300 steps, a 600-step rerun or CI's 4-step smoke run
        scheduler["num_decay_steps"] = max(1, round(decay * training.max_steps))
        options["lr_scheduler_kwargs"] = scheduler
    return options



def sft_arguments(config: TrainConfig, checkpoints: Path, plan: Any = None) -> Any:
    """The ``trl.SFTConfig`` of a run; settings transformers refuses (its own checks of the ``trl`` pass-through
    and of what it meets on this machine) become one :class:`ConfigError` line, not a traceback."""
    from trl import SFTConfig

    try:
        return SFTConfig(**sft_options(config, checkpoints, plan))
    except ValueError as error:
        raise ConfigError([f"trl: transformers refused these settings: {error}"]) from None


@contextmanager
def full_precision(model: Any) -> Iterator[None]:
    """The model's own forward for the duration: accelerate wraps a bf16 run's forward in autocast *on the model
    object*, where held-out scoring would read bf16 logits (which tie a third of the IsREL pairs)."""
    original = model.__dict__.get("_original_forward")
    if original is None:
        yield
        return
    patched = model.forward
    model.forward = original
    try:
        yield
    finally:
        model.forward = patched


@contextmanager
def input_side_detached(model: Any, on: bool, checkpointing: bool = False) -> Iterator[None]:
    """``lora.layers``: the input embeddings' output detached for the duration (the training steps).

    No block below the lowest adapted one has a trainable weight, so with the input side detached the backward
    pass stops there; the reflection rows still learn, from the output head (tied to the same rows, or its own
    trainable rows). With gradient checkpointing the detached output is made to require grad again, as
    transformers' ``enable_input_require_grads`` does: re-entrant checkpointing trains nothing inside a block
    whose input does not require grad.
    """
    if not on:
        yield
        return

    def detach(module: Any, inputs: Any, output: Any) -> Any:
        detached = output.detach()
        if checkpointing and torch.is_grad_enabled():
            detached.requires_grad_(True)
        return detached

    handle = model.get_input_embeddings().register_forward_hook(detach)
    try:
        yield
    finally:
        handle.remove()


class LoraInputCast:
    """PEFT's cast of each LoRA layer's input to the adapter's dtype, skipped while ``skipped()`` is open.

    PEFT casts a LoRA layer's input to its weights' dtype (fp32) before the adapter's matmuls. Under bf16 autocast
    those matmuls run in bf16 all the same, so autocast casts the input straight back. That is two copies of every
    adapted layer's input, the forward and the checkpointed recompute: 17% of an 8B step's device time on a lent H200
    (2026-11-30). Skipped, the result is the same; only the copies go. Used around each training step only: scoring
    outside autocast (the held-out accuracy, the judgement) keeps PEFT's cast, which it needs there. An empty layer
    list (``skip`` false) changes nothing.
    """

    def __init__(self, model: Any, skip: bool) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        # the layers that cast (LoRA's; PEFT's trainable-token rows take ids, not activations). Not PEFT's own
        # disable_input_dtype_casting: it reads the flag on every tuner layer, and TrainableTokensLayer (strategy
        # reserved's rows) has none (AttributeError); it would also walk every module each micro-batch
        self.layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)
                       and hasattr(module, "cast_input_dtype_enabled")] if skip else []

    @contextmanager
    def skipped(self) -> Iterator[None]:
        before = [layer.cast_input_dtype_enabled for layer in self.layers]
        for layer in self.layers:
            layer.cast_input_dtype_enabled = False
        try:
            yield
        finally:
            for layer, value in zip(self.layers, before, strict=True):
                layer.cast_input_dtype_enabled = value


@contextmanager
def attention_kernels(names: Sequence[str]) -> Iterator[None]:
    """``training.attention_kernels``: torch's scaled-dot-product attention limited to these backends while open
    (an empty list: torch's own choice). Names are checked by the config; a backend that cannot run the model's
    attention here makes torch refuse at the first step, which is reported as one line naming the setting."""
    if not names:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    try:
        with sdpa_kernel([backends[name] for name in names]):
            yield
    except RuntimeError as error:
        if "No available kernel" not in str(error) and "No viable backend" not in str(error):  # older / newer torch
            raise
        raise InputError(f"training.attention_kernels={list(names)}: torch has no such attention kernel for this model "
                         f"on this device ({str(error).splitlines()[0]}); add math, or leave the list empty "
                         "(torch's choice)") from None


def drop_autocast(model: Any) -> Any:
    """``model`` with accelerate's mixed-precision forward removed for good (after training: the held-out scores,
    the judgement and the caller's use of the returned model run in the model's own precision)."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model, keep_fp32_wrapper=False)


def use_bf16(setting: bool | str) -> bool:
    """``training.bf16`` resolved: ``auto`` is on where this machine computes bf16 natively (:func:`native_bf16`)."""
    return native_bf16() if setting == "auto" else bool(setting)


def native_bf16() -> bool:
    """A CUDA GPU with bf16, or a CPU with AVX512-BF16 or AMX: where bf16 autocast is faster than fp32.

    Elsewhere PyTorch emulates bf16 on the CPU, slower than fp32. Measured on the 2-core development machine
    (AVX512-BF16): a LoRA step of SmolLM2-135M on 4 x 300 tokens took 2.1 s in bf16 autocast, 4.8 s in fp32.
    """
    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (Linux); empty where it cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags") and ":" in line:
            return set(line.split(":", 1)[1].split())
    return set()


def accuracy_callback(
    examples: list[dict[str, Any]],
    token_ids: ReflectionIds,
    judgement_examples: list[dict[str, Any]] | None = None,
    judgement_items: int = 100,
    training: Any = None,
    timer: Any = None,
) -> Any:
    """A trainer callback that scores held-out reflection accuracy and the judgement, and logs them.

    Every ``training.eval_steps`` steps, or at each checkpoint when that is 0, but not after the last step: the
    judgement after training scores that model, and :func:`~selfrag.training.run.run` adds it as the last entry.
    Each one's seconds go to ``timer`` (a :class:`~selfrag.training.resources.StepTimer`), whose estimate then
    counts them.
    """
    from transformers import TrainerCallback

    every = int(getattr(training, "eval_steps", 0) or 0)

    def evaluate(state: Any, model: Any) -> None:
        if state.max_steps and state.global_step >= state.max_steps:
            return  # the last step: the final judgement after training scores it (with every judgement item)
        started = time.perf_counter()
        entry: dict[str, Any] = {"step": state.global_step}
        with full_precision(model):  # scored as after training, not in the steps' bf16 autocast
            if examples:
                entry["reflection_accuracy"] = reflection_accuracy(model, examples, token_ids)
            if judgement_examples:
                report = judge(model, judgement_examples, token_ids, judgement_items)
                entry["judgement"] = headline(report)
        seconds = time.perf_counter() - started
        logger.info("step %d (judged in %.0f s): %s", state.global_step, seconds,
                    {k: v for k, v in entry.items() if k != "step"})
        state.log_history.append(entry)
        if timer is not None:
            timer.judged(int(state.global_step), seconds, int(state.max_steps or 0))

    class ReflectionAccuracyCallback(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            if every and model is not None and state.global_step % every == 0:
                evaluate(state, model)

        def on_save(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            if not every and model is not None:
                evaluate(state, model)

    return ReflectionAccuracyCallback()


def row_step_callback(model: Any, token_ids: ReflectionIds, multiplier: float) -> Any:
    """method=full: each optimizer step of the reflection rows (input embeddings, and an untied head) is scaled
    by ``multiplier``, their ``row_lr_multiplier``.

    The rows share one parameter with every other row, so no optimizer group can give them their own rate;
    for Adam(W) a step scaled after the fact is the step of a ``multiplier`` times larger learning rate (the
    moments do not depend on the rate).
    """
    from transformers import TrainerCallback

    ids = sorted(token_ids.all_ids)

    def matrices() -> list[Any]:
        embedding = model.get_input_embeddings().weight
        head = model.get_output_embeddings()
        untied = head is not None and head.weight.data_ptr() != embedding.data_ptr()
        return [embedding, head.weight] if untied else [embedding]

    class RowStepCallback(TrainerCallback):
        before: list[Any] = []

        def on_pre_optimizer_step(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.before = [weight[ids].detach().clone() for weight in matrices()]

        def on_optimizer_step(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            with torch.no_grad():
                for weight, old in zip(matrices(), self.before, strict=True):
                    weight[ids] = old + multiplier * (weight[ids] - old)
            self.before = []

    return RowStepCallback()


#: the file the Trainer writes last into a ``checkpoint-N`` (after the weights, optimizer, scheduler and RNG states)
CHECKPOINT_COMPLETE = "trainer_state.json"


def last_checkpoint(checkpoints: Path) -> str | None:
    """The newest complete ``checkpoint-N`` of a previous (killed) run, or None.

    A run killed while it saved leaves a ``checkpoint-N`` without its last file (transformers' own
    ``get_last_checkpoint`` returns it, and resuming then fails with "Can't find a valid checkpoint"): such a folder is
    skipped, with a warning, and the run resumes from the newest one the Trainer finished writing.
    """
    if not checkpoints.is_dir():
        return None
    numbered = sorted(((int(path.name.split("-", 1)[1]), path) for path in checkpoints.glob("checkpoint-*")
                       if path.is_dir() and path.name.split("-", 1)[1].isdigit()), reverse=True)
    for _, path in numbered:
        if (path / CHECKPOINT_COMPLETE).is_file():
            return str(path)
        logger.warning("%s is incomplete (no %s: the run was killed while saving it); not resuming from it",
                       path, CHECKPOINT_COMPLETE)
    return None


