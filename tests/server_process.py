"""`agl server` as a real process for the end-to-end and fault tests: a free port, start, kill."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port nobody listens on right now (a connection to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    db: Path, port: int, *args: str, store: str | None = None, home: Path | None = None
) -> subprocess.Popen[bytes]:
    """``agl server`` over the SQLite file ``db`` on ``port`` (extra CLI ``args`` appended); returns once it answers
    /health (at most 60 s). ``store``: another store URL to serve (a PostgreSQL database); ``db`` then only names the
    log. Its output goes to ``server_log(db)``; a server that exits before answering (the port taken, a bad flag)
    fails at once with the end of that log. ``AGL_TOKEN`` of the test's environment is not passed on: a server has
    tokens only when ``args`` give them (``--token-file``); without, it serves open (``--no-token``), as these tests
    are about what a server does, not about its door (``test_auth`` covers the default token). ``home``: start a default
    server (its store's token, kept under ``AGL_HOME=home``) instead of an open one."""
    log = server_log(db)
    env = {k: v for k, v in os.environ.items() if k != "AGL_TOKEN"}
    if home is not None:
        env["AGL_HOME"] = str(home)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agl.cli",
                "server",
                "--store",
                store or f"sqlite:///{db}",
                "--port",
                str(port),
                *args,
                *(() if "--token-file" in args or home is not None else ("--no-token",)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    kill(proc)
    tail = log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"agl server on port {port} did not start (exit code {proc.returncode}):\n{tail}")


def server_log(db: Path) -> Path:
    """Where ``start_server`` sends the output of the server over ``db``."""
    return db.with_name(db.name + ".server.log")


def kill(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process (if it still runs) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
