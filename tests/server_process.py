"""`agl server` as a real process for the end-to-end and fault tests: a free port, start, kill."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(db: Path, port: int) -> subprocess.Popen[bytes]:
    """``agl server`` over the SQLite file ``db`` on ``port``; returns once it answers /health (at most 60 s)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agl.cli", "server", "--store", f"sqlite:///{db}", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("agl server did not start within 60 s")


def kill(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process (if it still runs) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
