"""The token of an ``agl server`` on this machine, kept in files only its user can read.

``agl server`` without tokens of its own serves with the trainer token of its store (``store_token``): made once per
store and kept under ``$AGL_HOME/stores`` (mode 0600 in a 0700 folder), as Jupyter keeps its cookie secret, so a
server restarted on the same store (after a crash, a ``kill -9``, a reboot) has the same token and the attempt keys
signed with it still hold: the runners and trainers started before the restart carry on. ``agl server --rotate-token``
makes a new one, and the old token stops working. While it runs, the server also writes its token to
``local_token_path(port)`` and removes that file when it stops; agl's clients (``HttpStore``, so the Trainer,
``agl runner``, ``agl runs``, ``agl dashboard --store http://...``) read it when they talk to a loopback URL without
``AGL_TOKEN``. So a local user needs no flag, and other users of the machine, or web pages, get nothing. Light: no
server imports.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from pathlib import Path
from urllib.parse import urlsplit

from agl.core.net import is_loopback

#: Where local tokens live: ``$AGL_HOME/servers`` when the variable is set, else ``~/.agl/servers``.
ENV_HOME = "AGL_HOME"


def _home() -> Path:
    home = os.environ.get(ENV_HOME)
    return Path(home) if home else Path.home() / ".agl"


def local_token_path(port: int) -> Path:
    """The file of the token of the loopback server on ``port`` (loopback names all reach the same server)."""
    return _home() / "servers" / f"loopback-{port}.token"


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by this user only, in a folder only this user can enter."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def _private_text(path: Path) -> str:
    """The text of a file this user owns and nobody else may read or write; OSError when it is missing or open to
    others (``PermissionError`` naming the file and what to do)."""
    info = path.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(
            f"{path} is not this user's alone (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}): its "
            "token may be known to others; delete the file (agl server then makes a new token) or chmod 600 it"
        )
    return path.read_text()


def store_identity(store_url: str) -> str | None:
    """What names a store across restarts, with no password in it: the absolute path of a SQLite file, a PostgreSQL
    URL without its password, an ``http`` store's URL; None for a store that dies with its process (``:memory:``)."""
    if store_url.startswith("sqlite:"):
        from agl.core.store.sqlite import path_from_url

        path = path_from_url(store_url)
        return None if str(path) == ":memory:" else f"sqlite:{path.resolve()}"
    parts = urlsplit(store_url)
    if parts.password is None:
        return store_url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", "@", 1)).geturl()


def store_token_path(store_url: str) -> Path | None:
    """The file of the trainer token of a default ``agl server`` over ``store_url``; None for a store that dies with
    its process."""
    identity = store_identity(store_url)
    if identity is None:
        return None
    return _home() / "stores" / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.token"


def store_token(store_url: str, *, rotate: bool = False) -> str:
    """The trainer token of a default ``agl server`` over ``store_url``: the one kept for that store, made (or, with
    ``rotate``, made anew) when there is none. The same store gives the same token at every start, so the clients of
    a server that crashed carry on with the server restarted on that store. A file others could read is refused
    (``PermissionError``) rather than trusted. A store that dies with its process gets a new token at each start."""
    path = store_token_path(store_url)
    if path is None:
        return secrets.token_urlsafe(32)
    if not rotate:
        try:
            token = _private_text(path).split()[:1]
        except FileNotFoundError:
            token = []
        if token:
            return token[0]
    made = secrets.token_urlsafe(32)
    _write_private(path, f"{made}\n{store_identity(store_url)}\n")
    return made


def write_local_token(port: int, token: str) -> Path:
    """Write ``token`` for the server on ``port`` (this process), readable by this user only; returns the file. The
    file names the process too, so that the file of a server that was killed (``kill -9`` leaves it) is never
    taken for the token of a later server on the same port."""
    path = local_token_path(port)
    _write_private(path, f"{token}\n{os.getpid()}\n")
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
    if not parts.hostname or not is_loopback(parts.hostname):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        token, pid = _private_text(local_token_path(port)).split()
        os.kill(int(pid), 0)  # the server runs as this user: any OSError means it is gone (its pid reused or free)
        return token
    except (OSError, ValueError):
        return None
