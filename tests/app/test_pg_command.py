"""``selfrag pg start|status|stop DIR``: a local PostgreSQL + pgvector a user can run, through the real CLI."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pgserver") is None, reason="needs pgserver")


def selfrag(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "selfrag.app.cli", *args], capture_output=True, text=True,
                          timeout=180, env=env)


def test_start_status_stop_and_a_restart_keeps_its_port_and_data() -> None:
    import psycopg

    directory = Path(tempfile.mkdtemp(prefix="selfrag-pg-cli-")) / "pg"  # mkdtemp: the test's own folder
    directory.parent.chmod(0o755)  # as root the server runs as nobody, who must reach the folder
    try:
        started = selfrag("pg", "start", str(directory))
        assert started.returncode == 0, started.stderr
        assert "started on 127.0.0.1:" in started.stdout and "password" not in started.stdout.split("PGPASSWORD")[0]
        url = next(w for w in started.stdout.split() if w.startswith("output=")).split("=", 1)[1].strip("'")
        password = (directory / "password").read_text().strip()
        assert password not in started.stdout  # the URL it prints can go into a config file: no secret in it
        dsn = url.split("?")[0].replace("selfrag@", f"selfrag:{password}@")
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
            connection.execute("CREATE TABLE kept (v vector(2))")
            connection.execute("INSERT INTO kept VALUES ('[1,2]')")

        again = selfrag("pg", "start", str(directory))  # already up: says so, starts nothing
        assert again.returncode == 0 and "running on" in again.stdout and url in again.stdout
        status = selfrag("pg", "status", str(directory))
        assert status.returncode == 0 and url in status.stdout

        stopped = selfrag("pg", "stop", str(directory))
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        down = selfrag("pg", "status", str(directory))
        assert down.returncode == 1 and "no server is running" in down.stdout

        restarted = selfrag("pg", "start", str(directory))  # same folder: same port, same data
        assert restarted.returncode == 0 and url in restarted.stdout
        with psycopg.connect(dsn) as connection:
            assert connection.execute("SELECT v::text FROM kept").fetchone() == ("[1,2]",)
    finally:
        selfrag("pg", "stop", str(directory))
        shutil.rmtree(directory.parent, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's server runs as another user")
def test_a_folder_the_server_user_cannot_reach_is_one_line() -> None:
    private = Path(tempfile.mkdtemp(prefix="selfrag-pg-private-"))  # 0700: nobody cannot enter it
    try:
        done = selfrag("pg", "start", str(private / "pg"))
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1 and "cannot reach" in done.stderr and "/tmp" in done.stderr
    finally:
        shutil.rmtree(private, ignore_errors=True)
