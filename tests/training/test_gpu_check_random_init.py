"""``gpu_check.py --random-init`` rehearsed on the CPU: every stage of the one GPU call (the real ``selfrag train`` on a
random-init shape for strategies reserved and add, SIGKILL + resume, the HF engine's short form, parity, the JSON and
the table); the memory formula's CPU branch against a 1B-shape training's peak RSS is test_gpu_check_rss.py (its own
file, so the two run on separate test workers).

Slow (minutes: each training is its own ``selfrag train`` process); the fast checks of the same code are in
test_memory.py (the dry run's meta-device counts) and tests/core/test_shapes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_modules import repo_module

#: the 1B shape cut to a toy (its real 128,256-entry vocabulary kept): every stage in a few minutes on 2 cores
TOY = ["num_hidden_layers=2", "hidden_size=128", "intermediate_size=256", "num_attention_heads=4",
       "num_key_value_heads=2", "head_dim=32"]


@pytest.fixture(scope="module")
def gpu_check():  # type: ignore[no-untyped-def]
    with repo_module("benchmarks", "gpu_check") as module:
        yield module


@pytest.mark.slow
def test_every_stage_runs_on_the_cpu_and_writes_the_table(gpu_check, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code = gpu_check.main(["--random-init", "--device", "cpu", "--shape", "1b", "--scale", *TOY, "--steps", "2",
                           "--train-override", "training.batch_size=1", "training.gradient_accumulation_steps=2",
                           "training.max_length=512",
                           "--questions", "2", "--stages", "rl", "resume", "engine", "parity", "--rl-steps", "2",
                           "--rl-override", "training.questions_per_step=1", "training.generations=2",
                           "rollout.segment_tokens=4", "rollout.max_segments=1", "--output", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert code == 0, report
    assert report["data"]["records"] == 4 and report["data"]["longest"] >= report["data"]["shortest"]
    assert [row["strategy"] for row in report["train"]] == ["reserved", "add"]
    for row in report["train"]:
        assert row["throughput"]["steps"] == 1 and row["throughput"]["tokens_per_second"] > 0
        assert row["peak_memory"]["device"] == "cpu" and row["measured_gb"] > 0.3
        assert row["estimate_gb"] > 0 and row["mfu"] is None  # no card peak on a CPU
        assert len(row["losses"]) == 2
    rl = report["rl"]  # selfrag rl's 8B recipe on train-reserved's adapter (LoRA on lm_head: TRL refuses it bare)
    assert rl["adapter"] and rl["steps"] == 2 and rl["generations"] == 2 and rl["questions_per_step"] == 1
    assert 0 < rl["rollout_seconds"] < rl["step_seconds"] and rl["completion_tokens"] > 0
    assert rl["card_peak_gb"] is None and len(rl["rewards"]) == 2
    resume = report["resume"]
    assert resume["ok"] and resume["killed"] and resume["killed_at"] == ["checkpoint-2"]
    assert resume["resumed_from"].endswith("checkpoint-2") and resume["steps_logged"] == [1, 2, 3, 4]
    assert report["engine"]["questions"] == 2 and report["engine"]["questions_per_second"] > 0
    assert report["parity"]["float32"]["within_tolerance"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| reserved |" in table and "| add |" in table and "resume: killed (SIGKILL)" in table
    assert "rl: 2 GRPO steps (1 questions x 2 rollouts" in table
    assert table in capsys.readouterr().out


@pytest.mark.slow
def test_the_issue_53_stages_rehearse_on_the_cpu(gpu_check, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Training before/after (padded vs padding-free; memory_plan is ignored without a GPU) and the serving stage on
    the HF stand-in (vLLM is not installed here): what the first call of a lent GPU runs, scaled to a toy."""
    code = gpu_check.main(["--random-init", "--device", "cpu", "--shape", "1b", "--scale", *TOY, "--steps", "2",
                           "--strategies", "reserved", "--train-variants", "recipe", "packed-plan", "profile",
                           "--train-override", "training.batch_size=2", "training.gradient_accumulation_steps=1",
                           "training.max_length=512", "--questions", "2", "--stages", "vllm",
                           "--output", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert code == 0, report
    assert [(row["variant"], row["padding_free"]) for row in report["train"]] == [
        ("recipe", False), ("packed-plan", True), ("profile", False)]
    assert report["train"][2]["profile"][0].startswith("training.profile_steps: 1 optimizer step(s)")
    assert all(row["throughput"]["tokens_per_second"] > 0 and len(row["losses"]) == 2 for row in report["train"])
    serving = report["vllm"]
    assert serving["engine"] == "hf"
    assert [(row["mode"], row["batch"]) for row in serving["rows"]] == [
        ("plain RAG", 1), ("plain RAG", 32), ("single-pass", 1), ("single-pass", 32)]
    assert all(row["questions_per_second"] > 0 for row in serving["rows"])
    # a batched call answers several questions at once: calls a question fall below 1 there
    assert all(row["generated_tokens_per_question"] > 0 and row["engine_calls_per_question"] > 0
               for row in serving["rows"])
    assert serving["decode"]["single-pass"]["tokens"] > 0 and serving["single_pass_p50_over_plain_batch_1"] > 0
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| reserved | packed-plan |" in table and "serving on the hf engine" in table
    assert "profile of reserved (profile), training.profile_steps:" in table and "aten::" in table
