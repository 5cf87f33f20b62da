"""A throwaway PostgreSQL server for tests and benchmarks (``PostgresCluster``).

A real PostgreSQL (``initdb`` + ``pg_ctl`` from the system's installation; ``scripts/test.sh`` installs Debian's
``postgresql`` when missing): a cluster in a temporary folder, listening on 127.0.0.1 on a free port with its unix
socket inside that folder, trust authentication, stopped with ``pg_ctl stop -m immediate`` and deleted by ``stop()``.
PostgreSQL refuses to run as root, so under root the cluster belongs to, and runs as, the ``postgres`` system user
(else ``nobody``) through ``runuser``. ``durable=False`` (tests) also switches off ``fsync``; either way commits do
not wait for the disk (``synchronous_commit=off``: a crash of the server process loses nothing committed, a crash
of the machine may lose the last fraction of a second), as SQLite's ``synchronous=NORMAL`` does.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

#: The cluster's superuser (trust authentication: no password).
PG_USER = "agl"


def _pg_bin(name: str) -> str:
    """A PostgreSQL program: on PATH, else the newest one Debian installed under /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(Path(p).parts[-3].split(".")[0])
    )
    if not versions:
        raise RuntimeError(
            f"PostgreSQL's {name} was not found (on PATH or under /usr/lib/postgresql/*/bin): install PostgreSQL "
            "(scripts/test.sh does: apt-get install -y postgresql)"
        )
    return versions[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    """A throwaway PostgreSQL server; ``new_database()`` creates an empty database and returns its URL."""

    def __init__(self, durable: bool = False) -> None:
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix="agl-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self._prefix: list[str] = []
        self._names = itertools.count(1)
        self._started = False

    def _run(self, *cmd: str, timeout: float = 120) -> None:
        done = subprocess.run([*self._prefix, *cmd], capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")

    def start(self) -> PostgresCluster:
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root: run them as an unprivileged system user
            runuser = shutil.which("runuser")
            if runuser is None:
                raise RuntimeError("running as root and runuser (util-linux) is missing: cannot start PostgreSQL")
            for user in ("postgres", "nobody"):
                try:
                    entry = pwd.getpwnam(user)
                except KeyError:
                    continue
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
                self._prefix = [runuser, "-u", user, "--"]
                break
            else:
                raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")
        self._run(
            _pg_bin("initdb"), "-D", str(self.data), "-U", PG_USER, "--auth=trust", "-E", "UTF8", "--no-instructions"
        )
        last = ""
        for _ in range(5):  # a free port may be taken between the check and the server's bind: try another
            self.port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c synchronous_commit=off "
                "-c max_connections=300 -c shared_buffers=64MB"
            )
            if not self.durable:
                options += " -c fsync=off -c full_page_writes=off"
            try:
                pg_ctl = _pg_bin("pg_ctl")
                self._run(pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start")
            except RuntimeError as exc:
                last = f"{exc}\n{self.log.read_text(errors='replace')[-2000:] if self.log.exists() else ''}"
                continue
            self._started = True
            return self
        raise RuntimeError(f"pg_ctl start failed 5 times; last:\n{last}")

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} STRATEGY FILE_COPY")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        try:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except psycopg.Error:
            pass  # the cluster is thrown away at the end anyway

    def stop(self) -> None:
        try:
            # postmaster.pid, not _started: a start that timed out may still have left a server running
            if self._started or (self.data / "postmaster.pid").exists():
                self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
