"""Listening sockets and the URLs clients reach them at: shared by ``agl.core.server`` and the ``Trainer``, which
binds its embedded server's socket before that server (and its heavy imports) start; and URLs fit to print."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit, urlunsplit

#: The port an http(s) URL without one connects to.
DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, bracketed or with a zone, or ``localhost``) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def backend_address(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of an LLM backend URL as the gateway's HTTP client (aiohttp, which parses with
    yarl) will connect to it: host lower-case and IDNA-encoded, dot segments resolved, trailing slash dropped.

    ValueError saying why for a URL that client could not call: not http(s) or no host; a host yarl and httpx (the
    parser of agl's other clients) read differently; a name DNS cannot take (a label over 63 characters, an empty
    one: the resolver would fail with a UnicodeError at call time). So a URL that passes here never fails at call time
    for its shape, only for its backend (unreachable, refusing): a 502 naming it.
    """
    import httpx
    import yarl

    try:
        parsed = yarl.URL(url)
        other = httpx.URL(url)
    except (TypeError, ValueError, httpx.InvalidURL) as exc:
        raise ValueError(f"not a URL the gateway can call: {exc}") from None
    scheme = parsed.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parsed.raw_host:
        raise ValueError("must be an http:// or https:// URL with a host")
    host = parsed.raw_host.lower()
    if host != other.raw_host.decode("ascii", errors="replace").lower():
        raise ValueError(
            f"not a URL the gateway can call: its host reads as {host!r} to one URL parser and "
            f"{other.host!r} to another"
        )
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            host.encode("idna")
        except UnicodeError as exc:
            raise ValueError(f"not a URL the gateway can call: host {host!r} is no DNS name ({exc})") from None
    return scheme, host, parsed.port or DEFAULT_PORTS[scheme], parsed.path.rstrip("/")


def shown_url(url: str) -> str:
    """A database, server or backend URL fit to print or store: a password in it is replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{netloc}"))


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0 picks a free one).

    Made with protocol ``IPPROTO_TCP``, not 0: the connections it accepts inherit it, and asyncio's own event loop sets
    ``TCP_NODELAY`` only on sockets that say TCP. Without it a response written in two parts waits for the client's
    delayed ACK: measured +45 ms on every gateway call served on asyncio's loop (uvloop sets it regardless)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def url_of(host: str, port: int) -> str:
    """The URL a client on this machine uses (a server bound to every interface is reached on loopback)."""
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1" if host != "::" else "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def bound_url(sock: socket.socket) -> str:
    """The address ``sock`` is actually bound to, as a URL (``http://0.0.0.0:4747`` for every interface)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
