"""Two ``selfrag serve`` replicas behind nginx on loopback, with the config that deploy/ ships.

Each replica is its own process (tests/inference/replica_server.py: the real app on the scripted engine), so one can
be killed; nginx runs as the current user with its config, pid and logs in a temp folder, rendered by
deploy/render_nginx.py, and is stopped after. Skipped where nginx is not installed (scripts/setup.sh installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import ARITHMETIC, CAPITAL, MODEL, wait_until

REPO = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
FAIL_TIMEOUT_S = 1.0

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed; run scripts/setup.sh")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the process exited with {process.returncode} before port {port} opened")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open in {timeout} s")


class Replica:
    """``replica_server.py`` on a free port; ``ready_file``: it loads until the file exists."""

    def __init__(self, tmp: Path, name: str, delay_s: float, ready: bool = True) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self.ready_file = tmp / f"{name}.ready"
        if ready:
            self.ready_file.touch()
        self.log = (tmp / f"{name}.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "tests/inference/replica_server.py"), "--port", str(self.port),
             "--ready-file", str(self.ready_file), "--delay", str(delay_s)],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )

    def wait_started(self) -> Replica:
        wait_for_port(self.port, self.process)
        return self

    def chat_answers(self) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        line = 'selfrag_requests_total{route="/v1/chat/completions",status="200"} '
        return sum(float(row[len(line):]) for row in text.splitlines() if row.startswith(line))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.log.close()


class Balancer:
    """nginx with deploy/nginx.conf.template rendered for ``replicas``; its files under ``run_dir``."""

    def __init__(self, run_dir: Path, replicas: list[Replica]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.run_dir = run_dir
        user = ["--user", "root"] if os.geteuid() == 0 else []  # as root nginx would run its workers as nobody
        rendered = subprocess.run(
            [sys.executable, str(REPO / "deploy/render_nginx.py"), "--listen", f"127.0.0.1:{self.port}",
             "--run-dir", str(run_dir), "--fail-timeout", str(FAIL_TIMEOUT_S), *user,
             *[arg for replica in replicas for arg in ("--replica", replica.address)]],
            check=True, capture_output=True, text=True,
        ).stdout
        self.config = run_dir / "nginx.conf"
        self.config.write_text(rendered)
        self.process = subprocess.Popen(
            [str(NGINX), "-c", str(self.config), "-p", str(run_dir), "-e", str(run_dir / "error.log"),
             "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        wait_for_port(self.port, self.process, timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: finish open connections
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        assert not (self.run_dir / "nginx.pid").exists(), "nginx left its pid file: it did not stop cleanly"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    """``start(delays, ready)`` -> (replicas, balancer); everything started is stopped after the test."""
    started: list[Any] = []

    def start(*specs: tuple[float, bool]) -> tuple[list[Replica], Balancer]:
        replicas = [Replica(tmp_path, f"replica{i}", delay, ready) for i, (delay, ready) in enumerate(specs)]
        started.extend(replicas)
        for replica in replicas:
            replica.wait_started()
        balancer = Balancer(tmp_path / "nginx", replicas)
        started.append(balancer)
        return replicas, balancer

    yield start
    for item in reversed(started):
        item.stop()


def body(question: str, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "stream": stream}


@dataclass
class Streamed:
    """One streamed answer as the client saw it."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)  # seconds after the request, per chunk
    done: bool = False
    replica: str = ""
    status: int = 0

    def comparable(self) -> list[Any]:
        """The chunks without what differs per request (id, created)."""
        return [{k: v for k, v in chunk.items() if k not in ("id", "created")} for chunk in self.chunks]

    @property
    def complete(self) -> bool:
        return self.status == 200 and self.done and any(c.get("selfrag", {}).get("type") == "final"
                                                        for c in self.chunks)


def stream(url: str, question: str, client: httpx.Client | None = None) -> Streamed:
    result = Streamed()
    started = time.monotonic()
    http = client or httpx.Client(timeout=30)
    try:
        with http.stream("POST", f"{url}/v1/chat/completions", json=body(question, True)) as response:
            result.status = response.status_code
            result.replica = response.headers.get("x-selfrag-replica", "").split(",")[-1].strip()
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    result.done = True
                elif line.startswith("data: "):
                    result.chunks.append(json.loads(line[6:]))
                    result.arrival.append(time.monotonic() - started)
    finally:
        if client is None:
            http.close()
    return result


def test_a_stream_through_the_balancer_equals_a_direct_one(cluster: Any) -> None:
    (first, _second), balancer = cluster((0.3, True), (0.3, True))
    for question in (CAPITAL, ARITHMETIC):
        direct, balanced = stream(first.url, question), stream(balancer.url, question)
        assert direct.complete and balanced.complete
        assert balanced.comparable() == direct.comparable()
        plain = httpx.post(f"{balancer.url}/v1/chat/completions", json=body(question, False), timeout=30).json()
        final = next(c["selfrag"] for c in balanced.chunks if c.get("selfrag", {}).get("type") == "final")
        assert {k: v for k, v in final.items() if k != "type"} == plain["selfrag"]
    # Unbuffered: the first trace event reached the client while the passages were still being decoded (each engine
    # call takes 0.3 s), not with the final event.
    balanced = stream(balancer.url, CAPITAL)
    first_trace = next(i for i, c in enumerate(balanced.chunks) if c.get("selfrag", {}).get("type") == "trace")
    final_index = next(i for i, c in enumerate(balanced.chunks) if c.get("selfrag", {}).get("type") == "final")
    assert balanced.arrival[final_index] - balanced.arrival[first_trace] > 0.2, balanced.arrival


def test_health_gates_traffic(cluster: Any) -> None:
    (ready, loading), balancer = cluster((0.0, True), (0.0, False))
    assert httpx.get(f"{loading.url}/health").status_code == 503
    replies = [httpx.post(f"{balancer.url}/v1/chat/completions", json=body(ARITHMETIC, False), timeout=30)
               for _ in range(10)]
    assert [reply.status_code for reply in replies] == [200] * 10  # no client saw the loading replica's 503
    assert {reply.headers["x-selfrag-replica"].split(",")[-1].strip() for reply in replies} == {ready.address}
    assert loading.chat_answers() == 0 and ready.chat_answers() == 10
    loading.ready_file.touch()  # it finishes loading: after fail_timeout nginx tries it again
    wait_until(lambda: httpx.get(f"{loading.url}/health").status_code == 200)
    deadline = time.monotonic() + FAIL_TIMEOUT_S + 3  # nginx keeps time in whole seconds
    while loading.chat_answers() == 0 and time.monotonic() < deadline:
        reply = httpx.post(f"{balancer.url}/v1/chat/completions", json=body(ARITHMETIC, False), timeout=30)
        assert reply.status_code == 200
        time.sleep(0.05)
    assert loading.chat_answers() > 0  # ready now: it takes its share again


def test_killing_one_replica_under_load_leaves_the_other_replicas_clients_unharmed(cluster: Any) -> None:
    (survivor, victim), balancer = cluster((0.1, True), (0.1, True))
    results: list[tuple[float, Streamed | BaseException]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 5.0
    killed_at: list[float] = []

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop_at:
                started = time.monotonic()
                try:
                    outcome: Streamed | BaseException = stream(balancer.url, CAPITAL, http)
                except httpx.HTTPError as error:  # a stream cut when its replica died
                    outcome = error
                with lock:
                    results.append((started, outcome))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    victim.process.kill()  # SIGKILL: no graceful shutdown, its open streams are cut
    victim.process.wait(10)
    killed_at.append(time.monotonic())
    for thread in threads:
        thread.join(30)
    served = [outcome for _, outcome in results if isinstance(outcome, Streamed) and outcome.complete]
    assert {item.replica for item in served} == {survivor.address, victim.address}  # both took traffic
    for started, outcome in results:
        if isinstance(outcome, Streamed) and outcome.replica == survivor.address:
            assert outcome.complete, outcome  # every answer the survivor began, it finished
        if started > killed_at[0] + 0.05:  # after the kill nginx sends everything to the survivor
            assert isinstance(outcome, Streamed) and outcome.complete and outcome.replica == survivor.address
    failed = [outcome for _, outcome in results if not (isinstance(outcome, Streamed) and outcome.complete)]
    assert len(failed) <= 8  # at most the streams that were open on the killed replica
    assert all(isinstance(item, BaseException) or item.replica == victim.address for item in failed), failed
    assert sum(1 for started, _ in results if started > killed_at[0] + 0.05) >= 8  # load went on after the kill
