"""SIGTERM to a real server process (tests/inference/replica_server.py: the app on the scripted engine, served by
``graceful_server`` as ``selfrag serve`` serves it) over loopback: what in-flight requests get, and how soon it exits.

Before (issue 44): past ``graceful_shutdown_s`` uvicorn cancelled the requests: a bare text/plain 500, a stream cut
without an error event, a traceback each, and the process waited for the engine's batch (21 s instead of 3).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from server_harness import ARITHMETIC, ARITHMETIC_ANSWER, MODEL

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(delay_s: float, grace_s: float) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tests/inference/replica_server.py"), "--port", str(port),
         "--delay", str(delay_s), "--grace", str(grace_s)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}: {process.stderr.read().decode()}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("the server did not become ready")


def _metric(url: str, name: str) -> float:
    line = next(line for line in httpx.get(f"{url}/metrics").text.splitlines() if line.startswith(f"{name} "))
    return float(line.split()[1])


def _body(stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": ARITHMETIC}]}


def _ask_both(url: str, results: dict[str, Any]) -> list[threading.Thread]:
    """One plain and one streamed request, each in a thread; ``results`` gets the plain response and stream lines."""

    def plain() -> None:
        results["plain"] = httpx.post(f"{url}/v1/chat/completions", json=_body(False), timeout=60)

    def streamed() -> None:
        lines: list[str] = []
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=_body(True), timeout=60) as response:
                lines += [line for line in response.iter_lines() if line.startswith("data: ")]
        except httpx.HTTPError as error:  # a cut stream: what the test must not see
            lines.append(f"cut: {error!r}")
        results["stream"] = lines

    threads = [threading.Thread(target=plain), threading.Thread(target=streamed)]
    for thread in threads:
        thread.start()
    return threads


def _terminate(process: subprocess.Popen[bytes]) -> tuple[float, str]:
    """SIGTERM; seconds until the process exited, and its stderr."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    return time.monotonic() - started, stderr.decode("utf-8", "replace")


def test_requests_still_running_after_the_grace_get_503_and_an_error_event_and_the_process_exits_promptly() -> None:
    grace = 1.0
    process, url = _start(delay_s=30.0, grace_s=grace)  # every engine call takes 30 s: both outlive the grace
    results: dict[str, Any] = {}
    threads = _ask_both(url, results)
    deadline = time.monotonic() + 20
    while (engine := _metric(url, "selfrag_in_flight")) < 1 or engine + _metric(url, "selfrag_queue_depth") < 2:
        assert time.monotonic() < deadline, "the requests never reached the server"  # one decoding, both taken
        time.sleep(0.05)
    seconds, stderr = _terminate(process)
    for thread in threads:
        thread.join(30)

    assert seconds < grace + 4, f"exited {seconds:.1f} s after SIGTERM (graceful_shutdown_s={grace})"
    assert "Traceback" not in stderr, stderr
    plain = results["plain"]
    assert plain.status_code == 503 and plain.headers["content-type"] == "application/json", plain.text
    error = plain.json()["error"]
    assert error["code"] == "server_shutting_down" and error["type"] == "server_error"
    assert "graceful_shutdown_s=1 s" in error["message"] and "retry" in error["message"]
    lines = results["stream"]
    assert lines[-1] == "data: [DONE]", lines
    event = json.loads(lines[-2].removeprefix("data: "))
    assert event["error"]["code"] == "server_shutting_down", event


def test_requests_that_end_within_the_grace_are_answered() -> None:
    process, url = _start(delay_s=0.5, grace_s=10.0)
    results: dict[str, Any] = {}
    threads = _ask_both(url, results)
    time.sleep(0.2)
    seconds, stderr = _terminate(process)
    for thread in threads:
        thread.join(30)
    assert results["plain"].status_code == 200, results["plain"].text
    assert results["plain"].json()["choices"][0]["message"]["content"] == ARITHMETIC_ANSWER
    assert results["stream"][-1] == "data: [DONE]" and '"finish_reason": "stop"' in results["stream"][-2]
    assert seconds < 10, seconds  # it waited for the answers, not for the grace
    assert "Traceback" not in stderr, stderr
