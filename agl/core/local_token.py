"""The token of an ``agl server`` on this machine, kept in a file only its user can read.

``agl server`` without tokens of its own makes a trainer token, writes it to ``local_token_path(port)`` (mode 0600 in
a 0700 folder) and removes the file when it stops; agl's clients (``HttpStore``, so the Trainer, ``agl runner``,
``agl runs``, ``agl dashboard --store http://...``) read it when they talk to a loopback URL without ``AGL_TOKEN``.
So a local user needs no flag, and other users of the machine, or web pages, get nothing. Light: no server imports.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

#: Where local tokens live: ``$AGL_HOME/servers`` when the variable is set, else ``~/.agl/servers``.
ENV_HOME = "AGL_HOME"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def local_token_path(port: int) -> Path:
    """The file of the token of the loopback server on ``port`` (loopback names all reach the same server)."""
    home = os.environ.get(ENV_HOME)
    return (Path(home) if home else Path.home() / ".agl") / "servers" / f"loopback-{port}.token"


def write_local_token(port: int, token: str) -> Path:
    """Write ``token`` for the server on ``port`` (this process), readable by this user only; returns the file. The
    file names the process too, so that the file of a server that was killed (``kill -9`` leaves it) is never
    taken for the token of a later server on the same port."""
    path = local_token_path(port)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{token}\n{os.getpid()}\n")
    tmp.replace(path)
    return path


def remove_local_token(port: int, token: str) -> None:
    """Remove the file of the server on ``port`` if it still holds ``token`` (a newer server's file stays)."""
    path = local_token_path(port)
    with contextlib.suppress(OSError):
        if path.read_text().split()[:1] == [token]:
            path.unlink()


def read_local_token(url: str) -> str | None:
    """The token a loopback server at ``url`` wrote for this user; None for another host, no file, or a file that
    others could have written or read (not owned by this user, or open to group or others)."""
    parts = urlsplit(url)
    if not parts.hostname or not _loopback(parts.hostname):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = local_token_path(port)
        info = path.stat()
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            return None
        token, pid = path.read_text().split()
        os.kill(int(pid), 0)  # the server runs as this user: any OSError means it is gone (its pid reused or free)
        return token
    except (OSError, ValueError):
        return None
