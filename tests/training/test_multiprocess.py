"""`selfrag train` as two processes on the CPU (torchrun through `accelerate launch`, gloo), on the tiny model.

Each launch records, per process, every file it writes under output_dir (tests/training/multiprocess_entry.py,
a Python audit hook). Launched the way a CPU-only user launches it:

    accelerate launch --multi_gpu --num_processes 2 -m selfrag.app.cli train --config ... output_dir=...

(``--cpu --num_processes 2`` runs ONE process in accelerate 1.15: its CPU multi-process path is mpirun with a
hostfile.) About 10 s a launch on 2 cores; the whole file ~1.5 min.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_judgement_training import synthetic_records
from training_records import training_records

from selfrag.jsonl import write_jsonl_atomic

pytestmark = pytest.mark.slow

ENTRY = Path(__file__).with_name("multiprocess_entry.py")
ACCELERATE = Path(sys.executable).with_name("accelerate")
LAUNCH_TIMEOUT_S = 240
#: Every output a run writes (the adapter's weights are written by safetensors' native code: its config stands in).
OUTPUTS = ("run.json", "selfrag.json", "config.yaml", "metrics.json", "training.png", "judgement.json",
           "tokenizer_config.json", "adapter_config.json")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def settings(base: Path, records: Path, out: Path, **extra: object) -> list[str]:
    values = {"model": base, "records": records, "output_dir": out, "training.max_steps": 4,
              "training.batch_size": 2, "training.logging_steps": 1, "training.eval_fraction": 0,
              "training.max_length": 512, "training.save_steps": 2, "training.learning_rate": 0.01,
              "lora.r": 4, "lora.alpha": 8, "lora.dropout": 0.0, **extra}
    return [f"{key}={value}" for key, value in values.items()]


def launch(
    overrides: list[str], work: Path, processes: int = 2, env: dict[str, str] | None = None, launcher: list[str] = ()
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, set[int]]]]:
    """Run ``selfrag train`` as ``processes`` processes; returns the result and {path: {event: ranks}}."""
    out = Path(next(item.split("=", 1)[1] for item in overrides if item.startswith("output_dir=")))
    writers = work / f"writers-{len(list(work.glob('writers-*')))}"
    environment = {
        **os.environ, "SELFRAG_TEST_WATCH": str(out), "SELFRAG_TEST_WRITERS": str(writers),
        "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "", **(env or {}),
    }
    if processes == 1:
        command = [sys.executable, str(ENTRY), "train", *overrides]
    else:
        command = [str(ACCELERATE), "launch", "--num_processes", str(processes), "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
                   *(launcher or ["--multi_gpu"]), str(ENTRY), "train", *overrides]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    events: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for log in writers.glob("rank*.log"):
        rank = int(log.stem.removeprefix("rank"))
        for line in log.read_text().splitlines():
            event, path = line.split("\t")
            events[path][event].add(rank)
    return result, events


def outcome(result: subprocess.CompletedProcess[str]) -> str:
    return f"rc={result.returncode}\n{result.stderr[-4000:]}"


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("mp-records")
    train, test = folder / "records.jsonl", folder / "eval.jsonl"
    write_jsonl_atomic(train, [record.to_json() for record in training_records()])  # 8 examples: 4 batches of 2
    write_jsonl_atomic(test, [record.to_json() for record in synthetic_records(8, seed=3)])
    return train, test


@dataclass(frozen=True)
class TwoProcessRun:
    folder: Path
    out: Path
    result: subprocess.CompletedProcess[str]
    events: dict[str, dict[str, set[int]]]
    weights: dict[str, torch.Tensor]
    overrides: list[str]


@pytest.fixture(scope="module")
def two_processes(tiny_base_dir, records, tmp_path_factory) -> TwoProcessRun:  # type: ignore[no-untyped-def]
    """One 2-process run (batch 2, judgement on), shared by the writer, restart and equivalence tests."""
    train, test = records
    folder = tmp_path_factory.mktemp("two")
    out = folder / "out"
    overrides = settings(tiny_base_dir, train, out, eval_records=test, judgement_items=4)
    result, events = launch(overrides, folder)
    assert result.returncode == 0, outcome(result)
    weights = load_file(out / "adapter_model.safetensors")  # read now: the restart test replaces the run
    return TwoProcessRun(folder, out, result, events, weights, overrides)


def test_one_process_writes_every_output(two_processes: TwoProcessRun) -> None:
    out, events = two_processes.out, two_processes.events
    for name in OUTPUTS:
        assert (out / name).is_file(), name
        assert events[name]["write"] | events[name]["rename-to"] == {0}, f"{name} written by ranks {events[name]}"
    shared = {path: ranks for path, by_event in events.items() for ranks in by_event.values() if len(ranks) > 1}
    assert not shared, f"files written by more than one process: {shared}"
    assert two_processes.result.stdout.count("adapter written to") == 1  # the main process reports


def test_two_processes_train_as_one_with_two_accumulation_steps(two_processes: TwoProcessRun, records) -> None:  # type: ignore[no-untyped-def]
    """2 processes x batch 2 == 1 process x batch 2 x 2 accumulation steps: the same examples in each step, each
    micro-batch's mean loss averaged over the step's micro-batches either way (DDP averages the gradients).

    Measured: identical to the last bit (gloo sums two fp32 gradients, the accumulation adds two halves); the
    tolerance allows the rounding of another reduction order. With ``order=length`` (the default) they differed
    before the sampler fix: transformers grouped lengths by one process's step (groups of 4 vs 2 examples).
    """
    folder = two_processes.folder
    overrides = [item for item in two_processes.overrides if not item.startswith(("output_dir=", "eval_records="))]
    one, _ = launch([*overrides, f"output_dir={folder / 'one'}", "training.gradient_accumulation_steps=2"], folder,
                    processes=1)
    assert one.returncode == 0, outcome(one)
    single, double = load_file(folder / "one" / "adapter_model.safetensors"), two_processes.weights
    assert set(single) == set(double)
    for name, weight in single.items():
        assert torch.allclose(weight, double[name], rtol=1e-5, atol=1e-6), (
            f"{name}: max difference {(weight - double[name]).abs().max().item():.3g}")
    assert any(weight.abs().max() > 0 for name, weight in single.items() if "lora_B" in name)  # it trained


def test_a_different_run_is_refused_once_and_restart_clears_on_one_process(two_processes: TwoProcessRun) -> None:
    folder, out = two_processes.folder, two_processes.out
    changed = [*two_processes.overrides, "training.learning_rate=0.02"]
    refused, _ = launch(changed, folder)  # refused on every process, in one line said once
    assert refused.returncode != 0
    lines = [line for line in refused.stderr.splitlines() if line.startswith("selfrag train: error:")]
    assert len(lines) == 1 and "restart=true" in lines[0], outcome(refused)

    # restart=true: the main process alone deletes the old run; the other waits, then both train the new one.
    again, events = launch([*changed, "restart=true"], folder)
    assert again.returncode == 0, outcome(again)
    removers = {rank for by_event in events.values() for rank in by_event.get("remove", set())}
    assert removers == {0}, f"the old run was deleted by ranks {removers}"
    assert json.loads((out / "run.json").read_text())["settings"]["training.learning_rate"] == 0.02
    assert all(ranks == {0} for by_event in events.values() for ranks in by_event.values()), dict(events)


def test_a_killed_process_stops_the_run_in_one_line_and_the_rerun_resumes(tiny_base_dir, records, tmp_path) -> None:  # type: ignore[no-untyped-def]
    train, _ = records
    out = tmp_path / "out"
    overrides = settings(tiny_base_dir, train, out, **{"training.max_steps": 6, "trl.ddp_timeout": 60})
    killed, _ = launch(overrides, tmp_path, env={"SELFRAG_TEST_KILL": "1:2"})  # rank 1 dies after checkpoint-2
    assert killed.returncode != 0
    lines = [line for line in killed.stderr.splitlines() if line.startswith("selfrag train: error:")]
    assert len(lines) == 1, outcome(killed)
    assert "another training process" in lines[0] and lines[0].endswith("resume from " + str(
        out / "checkpoints" / "checkpoint-2")), lines[0]
    assert not (out / "metrics.json").exists()

    resumed, _ = launch(overrides, tmp_path)
    assert resumed.returncode == 0, outcome(resumed)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["resumed_from"] == str(out / "checkpoints" / "checkpoint-2")
    assert [entry["step"] for entry in metrics["train_losses"]] == [1, 2, 3, 4, 5, 6]  # none repeated, none lost


def test_two_machines_on_loopback_train_as_one(two_processes: TwoProcessRun) -> None:
    """Two `accelerate launch` invocations, --num_machines 2 --machine_rank 0/1, one process each, meeting at
    127.0.0.1: one run, the global main process the only writer, the weights of the one-machine run."""
    folder = two_processes.folder
    out = folder / "machines"
    overrides = [item for item in two_processes.overrides if not item.startswith(("output_dir=", "eval_records="))]
    port = str(free_port())
    children = []
    for machine in (0, 1):
        writers = folder / f"machine-writers-{machine}"
        environment = {**os.environ, "SELFRAG_TEST_WATCH": str(out), "SELFRAG_TEST_WRITERS": str(writers),
                       "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                       "CUDA_VISIBLE_DEVICES": ""}
        command = [str(ACCELERATE), "launch", "--multi_gpu", "--num_machines", "2", "--num_processes", "2",
                   "--machine_rank", str(machine), "--main_process_ip", "127.0.0.1", "--main_process_port", port,
                   "--rdzv_backend", "static", "--mixed_precision", "no", "--dynamo_backend", "no",
                   str(ENTRY), "train", *overrides, f"output_dir={out}"]
        children.append(subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True))
    results = [child.communicate(timeout=LAUNCH_TIMEOUT_S) for child in children]
    for child, (_, err) in zip(children, results, strict=True):
        assert child.returncode == 0, err[-3000:]
    second = [line for log in (folder / "machine-writers-1").glob("rank*.log") for line in log.read_text().splitlines()]
    assert not second, f"the second machine wrote {second}"
    assert (out / "selfrag.json").is_file()
    weights = load_file(out / "adapter_model.safetensors")
    for name, weight in weights.items():
        assert torch.allclose(weight, two_processes.weights[name], rtol=1e-5, atol=1e-6), name


def test_fsdp_without_gpus_is_refused_in_one_line(tiny_base_dir, records, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """accelerate 1.15 enables FSDP only for GPU-like process types: on CPU it would train full DDP replicas."""
    train, _ = records
    refused, _ = launch(settings(tiny_base_dir, train, tmp_path / "out"), tmp_path,
                        launcher=["--use_fsdp", "--fsdp_version", "2"])
    assert refused.returncode != 0
    lines = [line for line in refused.stderr.splitlines() if line.startswith("selfrag train: error:")]
    assert len(lines) == 1 and "FSDP" in lines[0] and "no GPU" in lines[0], outcome(refused)
