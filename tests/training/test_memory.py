"""The memory estimate (selfrag.training.memory) and benchmarks/gpu_check.py's --dry-run, on the CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from selfrag.training.memory import (
    CPU_OVERHEAD_GB,
    GB,
    SHAPES,
    ModelShape,
    Setup,
    estimate_memory,
    lora_parameters,
    memory_table,
)

ROOT = Path(__file__).resolve().parents[2]


def test_shapes_give_the_published_parameter_counts() -> None:
    # config.json shapes -> 8.03B / 3.21B / 1.24B / 7.62B, the counts the model cards state
    expected = {"meta-llama/Llama-3.1-8B-Instruct": 8.03, "meta-llama/Llama-3.2-3B-Instruct": 3.21,
                "meta-llama/Llama-3.2-1B-Instruct": 1.24, "Qwen/Qwen2.5-7B-Instruct": 7.62}
    for name, billions in expected.items():
        assert SHAPES[name].parameters / 1e9 == pytest.approx(billions, abs=0.01), name


def test_each_term_follows_its_formula() -> None:
    shape = SHAPES["meta-llama/Llama-3.1-8B-Instruct"]
    setup = Setup(batch_size=2, max_length=1024)
    estimate = estimate_memory(shape, setup)
    assert estimate.weights_gb == pytest.approx(shape.parameters * 2 / GB)
    # all-linear r=16 on 32 Llama-8B blocks is 41.9M, the embedding and head LoRA of strategy reserved 4.2M more
    assert lora_parameters(shape, 16, False) == 41_943_040
    assert estimate.lora_gb == pytest.approx(estimate.lora_parameters * 16 / GB)
    tokens = 2 * 1024
    assert estimate.activations_gb == pytest.approx((32 * tokens * 4096 * 2 + tokens * 4096 * 34) / GB)
    assert estimate.logits_gb == pytest.approx(tokens * 0.5 * 128256 * 10 / GB)
    # QLoRA shrinks only the weights (embeddings stay bf16) and the optimizer; FSDP divides weights and LoRA states
    qlora = estimate_memory(shape, Setup(2, 1024, quantization="nf4", optimizer_state_bytes=2.0))
    assert 0.3 < qlora.weights_gb / estimate.weights_gb < 0.4
    sharded = estimate_memory(shape, Setup(2, 1024, shards=8))
    assert sharded.weights_gb == pytest.approx(estimate.weights_gb / 8)
    assert sharded.activations_gb == estimate.activations_gb


def test_the_cpu_branch_counts_four_byte_elements_and_the_process() -> None:
    shape = SHAPES["meta-llama/Llama-3.2-1B-Instruct"]
    gpu = estimate_memory(shape, Setup(1, 512, gradient_checkpointing=False))
    cpu = estimate_memory(shape, Setup(1, 512, quantization="fp32", gradient_checkpointing=False, device="cpu"))
    assert cpu.weights_gb == pytest.approx(shape.parameters * 4 / GB)
    assert cpu.activations_gb == pytest.approx(2 * gpu.activations_gb)
    assert cpu.logits_gb == pytest.approx(gpu.logits_gb * 8 / 10)
    assert cpu.overhead_gb == CPU_OVERHEAD_GB and cpu.lora_gb == gpu.lora_gb
    assert ModelShape.from_config(json.loads((ROOT / "configs" / "models" / "llama-3.2-1b" / "config.json")
                                             .read_text())) == shape


def test_the_table_answers_for_each_card() -> None:
    rows = memory_table(SHAPES["meta-llama/Llama-3.1-8B-Instruct"])
    assert [row["recipe"] for row in rows] == ["LoRA bf16, 1 GPU", "QLoRA NF4, 1 GPU", "LoRA bf16, FSDP x8"]
    for row in rows:
        assert row["fits_80gb"] and (row["fits_40gb"] or not row["fits_24gb"])


def load_gpu_check():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def test_gpu_check_dry_run_checks_configs_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = load_gpu_check()
    assert gpu_check.main(["--dry-run", "--stand-in", "1b", "--batch-size", "2", "--output", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check_dry_run.json").read_text())
    assert set(report["configs"]) >= {"configs/train/llama-3.1-8b-instruct-lora.yaml", "configs/accelerate/fsdp.yaml"}
    assert report["configs"]["configs/train/llama-3.1-8b-instruct-qlora.yaml"] == "ok"
    assert report["memory"]["model"] == "meta-llama/Llama-3.2-1B-Instruct"
    assert report["memory"]["chosen"]["setup"]["batch_size"] == 2 and report["versions"]["torch"]
    printed = capsys.readouterr().out
    assert "GB per GPU" in printed
    # training.memory_plan for the 8B recipe (4 x 4 examples of 2048 tokens): an H200 holds micro-batch 8 unchecked
    assert report["memory_plans"]["139.8 GB"].startswith("memory plan: micro-batch 8 x 2 accumulation, gradient "
                                                         "checkpointing off")
    assert "8B recipe on a 80.0 GB card: memory plan:" in printed
    # configs/models/llama-3.1-8b on the meta device, through the one loader: the published 8.03B exactly, and the
    # recipe's LoraConfig applied by PEFT: r=16 on every linear layer (41,943,040) plus, for reserved, LoRA on
    # embed_tokens and the untied lm_head (2 x 16 x (128,256 + 4,096)), for add the 15 trainable rows of each
    meta = report["meta_8b"]
    assert meta["parameters"] == 8_030_261_248 and meta["billions"] == 8.03
    assert meta["reserved"]["lora_trainable"] == 41_943_040 + 2 * 16 * (128_256 + 4_096) == 46_178_304
    assert meta["add"]["lora_trainable"] == 41_943_040 + 2 * 15 * 4_096 == 42_065_920
    assert meta["reserved"]["reflection_ids"] == list(range(128_241, 128_256))
    assert meta["add"]["reflection_ids"] == list(range(128_256, 128_271))


def test_gpu_check_without_a_gpu_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_gpu_check().main(["--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dry-run" in err[0]
    assert not any(tmp_path.iterdir())


def test_gpu_check_reads_the_judgement_reports_aurocs() -> None:
    report = {"relevance": {"easy": {"auroc": 0.991, "low": 0.98}, "hard": {"auroc": 0.8123}},
              "support": {"support": {"auroc": None}}, "confusion": [[1, 2]]}
    gpu_check = load_gpu_check()
    assert gpu_check.aurocs(report, "relevance") == {"easy": 0.991, "hard": 0.812}
    assert gpu_check.aurocs(report, "support") == {} and gpu_check.aurocs(report, "utility") == {}


def test_the_step_timer_estimates_the_rest_from_the_second_step(caplog: pytest.LogCaptureFixture) -> None:
    """After the warm-up step, one line says what a step costs here and how long the steps left take."""
    import logging
    from types import SimpleNamespace

    from selfrag.training.resources import StepTimer

    timer = StepTimer()
    state = SimpleNamespace(num_input_tokens_seen=0, global_step=1, max_steps=101)
    timer.on_train_begin(None, state, None)
    with caplog.at_level(logging.INFO, logger="selfrag.training.resources"):
        timer.on_step_end(None, state, None)
        assert not caplog.records  # the first step is a warm-up: no estimate from it
        timer.marks[-1] = (timer.marks[-1][0] - 3.0, 0)  # the second step took 3 s
        state.global_step = 2
        timer.on_step_end(None, state, None)
    (line,) = [record.getMessage() for record in caplog.records]
    assert "s a step on this machine; the 99 steps left take about 5 min" in line


def test_the_estimate_counts_the_checkpoint_judgements_and_the_throughput_leaves_them_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With a judgement every 50 steps, the second step's line says how many are left; the first judgement's time
    puts them all into the estimate, and the steps' throughput does not count the judging."""
    import logging
    from types import SimpleNamespace

    from selfrag.training.resources import StepTimer

    timer = StepTimer(judge_every=50)
    state = SimpleNamespace(num_input_tokens_seen=0, global_step=0, max_steps=200)
    timer.on_train_begin(None, state, None)
    with caplog.at_level(logging.INFO, logger="selfrag.training.resources"):
        for step in range(1, 52):
            state.global_step, state.num_input_tokens_seen = step, 100 * step
            timer.on_step_end(None, state, None)
            timer.marks[-1] = (1000.0 + 3.0 * step + (60.0 if step > 50 else 0.0), 100 * step)  # 3 s a step
            if step == 50:
                timer.judged(50, 60.0, 200)  # the judgement after step 50 took 60 s
    first, second = [record.getMessage() for record in caplog.records]
    assert "the 198 steps left take about" in first
    # at steps 50, 100 and 150: the last step's is the final judgement, after training
    assert "3 checkpoint judgements more (the first, at step 50, says how long they take)" in first
    # 150 steps at 3 s and 2 judgements at 60 s: 450 + 120 s, 9.5 min
    assert "3.0 s a step" in second and "the checkpoint judgement at step 50 took 60 s" in second
    assert "the 150 steps and 2 judgements left take about 10 min" in second
    summary = timer.summary()
    assert summary["steps"] == 50 and summary["seconds"] == pytest.approx(150.0)  # the 60 s of judging left out
    assert summary["judgement_seconds"] == 60.0 and summary["tokens_per_second"] == pytest.approx(5000 / 150, abs=0.1)
