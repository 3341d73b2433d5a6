"""A throwaway PostgreSQL server with pgvector on 127.0.0.1, from the binaries the ``pgserver`` package ships.

    with LocalPostgres("/tmp/pg") as server:                     # initdb, then postgres on a free TCP port
        url = server.url("postgres", table="passages")           # postgresql://selfrag:...@127.0.0.1:PORT/...

For tests, benchmarks and trying ``retriever.kind=pgvector`` on one machine (``selfrag pg start DIR`` runs one in
the background until ``selfrag pg stop DIR``): ``pip install pgserver`` bundles
PostgreSQL 16 with the pgvector extension (Debian's postgresql packages here have no pgvector). The server
listens on loopback only, with password (SCRAM) authentication, so a test exercises the same TCP path and the
same login as a real deployment. PostgreSQL refuses to run as root; as root the server runs as ``nobody``.
A production server is any PostgreSQL >= 13 with pgvector >= 0.5 (HNSW); nothing here is needed for it.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from selfrag.errors import ConfigError
from selfrag.extras import MissingExtraError, missing_line

USER = "selfrag"


def postgres_bin() -> Path:
    """The folder of pgserver's PostgreSQL binaries (found without importing pgserver, which takes a lock)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(missing_line("pgserver", "a local PostgreSQL (selfrag pg)"))
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _reachable_by_others(path: Path) -> bool:
    """Whether every folder above ``path`` lets other users through (o+x), as the server's user needs."""
    return all(folder.stat().st_mode & 0o001 for folder in [path, *path.parents])


class LocalPostgres:
    """initdb into ``directory`` (kept if it holds a cluster already), start on 127.0.0.1, stop on exit."""

    def __init__(self, directory: str | Path, port: int | None = None, password: str | None = None) -> None:
        self.directory = Path(directory).resolve()
        self.data = self.directory / "data"
        port_file = self.directory / "port"
        if port is None and port_file.is_file():
            port = int(port_file.read_text().strip())  # the port it was started on last: its URL stays the same
        self.port = port or free_port()
        password_file = self.directory / "password"
        if password is None and password_file.is_file():
            password = password_file.read_text().strip()
        self.password = password or secrets.token_hex(12)
        self._bin = postgres_bin()
        self._user = "nobody" if os.geteuid() == 0 else None  # postgres will not run as root

    def _run(self, program: str, *args: str, timeout: float = 60) -> None:
        done = subprocess.run(
            [str(self._bin / program), *args], user=self._user, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            log = self.directory / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
            raise RuntimeError(f"{program} {' '.join(args)} failed: {done.stderr.strip()}\n{tail}")

    def _use_reachable_binaries(self) -> None:
        """As root the server runs as ``nobody``, who cannot run binaries under e.g. /root: use a private copy
        (~40 MB, made once in the cluster's folder). The binaries find their vendored libraries at
        $ORIGIN/../../../pgserver.libs: the copy keeps that layout."""
        if self._user is None or _reachable_by_others(self._bin):
            return
        site = self._bin.parents[2]
        copy = self.directory / "pgserver-copy"
        if not (copy / "pgserver" / "pginstall" / "bin").is_dir():
            shutil.copytree(self._bin.parent, copy / "pgserver" / "pginstall", symlinks=True,
                            ignore=shutil.ignore_patterns("include"), dirs_exist_ok=True)
            if (site / "pgserver.libs").is_dir():
                shutil.copytree(site / "pgserver.libs", copy / "pgserver.libs", dirs_exist_ok=True)
        self._bin = copy / "pgserver" / "pginstall" / "bin"

    def start(self) -> LocalPostgres:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._user is not None and not _reachable_by_others(self.directory.parent):
            raise ConfigError([f"the server runs as {self._user} (PostgreSQL refuses root), who cannot reach "
                               f"{self.directory}; give a directory whose parents others may enter (e.g. under /tmp)"])
        self._use_reachable_binaries()
        socket_dir = self.directory / "socket"
        socket_dir.mkdir(exist_ok=True)
        if self._user is not None:
            shutil.chown(self.directory, self._user)
            shutil.chown(socket_dir, self._user)
        if not (self.data / "PG_VERSION").is_file():
            password_file = self.directory / "password"
            password_file.write_text(self.password + "\n")
            if self._user is not None:
                shutil.chown(password_file, self._user)
            password_file.chmod(0o600)
            self._run(
                "initdb", "-D", str(self.data), "-U", USER, f"--pwfile={password_file}", "--auth=scram-sha-256",
                "--encoding=UTF8", "--locale=C", "--no-instructions",
            )
        (self.directory / "port").write_text(f"{self.port}\n")
        options = f"-h 127.0.0.1 -p {self.port} -k {socket_dir}"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.directory / "server.log"), "-o", options, "-w",
                  "-t", "60", "start", timeout=90)
        return self

    def running(self) -> bool:
        """Whether this cluster's server is up (``pg_ctl status``)."""
        if not (self.data / "postmaster.pid").is_file():
            return False
        self._use_reachable_binaries()
        done = subprocess.run([str(self._bin / "pg_ctl"), "-D", str(self.data), "status"], user=self._user,
                              capture_output=True, text=True, timeout=30)
        return done.returncode == 0

    def stop(self) -> None:
        if (self.data / "postmaster.pid").is_file():
            self._use_reachable_binaries()
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", timeout=90)

    def url(self, database: str = "postgres", table: str | None = None, password: str | None = None) -> str:
        secret = quote(self.password if password is None else password, safe="")
        query = f"?table={table}" if table else ""
        return f"postgresql://{USER}:{secret}@127.0.0.1:{self.port}/{database}{query}"

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                connection.execute(f'CREATE DATABASE "{name}"')

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
