"""Which LLM backends a server forwards to: ``agl server --allow-backend PATTERN``, matched part by part."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from agl.core.net import DEFAULT_PORTS, backend_address

_WILDCARD = re.compile(r"[*?\[]")
_PATTERN = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<netloc>[^/?#@]+)(?P<path>(?:/[^?#]*)?)$")
_NETLOC = re.compile(r"^(?:\[(?P<v6>(?=[^\]]*:)[^\]]+)\]|(?P<host>[^:]+))(?::(?P<port>[^:]+))?$")


def url_parts(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of ``url`` as the gateway's HTTP client will connect to it
    (``agl.core.net.backend_address``); None when it is no URL the gateway can call. User info is not part of the
    host (``http://a@b/`` is host ``b``); dot segments are resolved and the trailing slash dropped."""
    try:
        return backend_address(url)
    except ValueError:
        return None


def _host_matches(host: str, pattern: str) -> bool:
    """Whether ``host`` matches the host ``pattern`` label by label (``.``; ``:`` for IPv6), so that no wildcard
    reaches across a dot into a name the pattern's owner does not control."""
    sep = ":" if ":" in pattern else "."
    labels, wanted = host.split(sep), pattern.split(sep)
    return len(labels) == len(wanted) and all(
        (label or sep == ":") and fnmatchcase(label, want) for label, want in zip(labels, wanted, strict=True)
    )


@dataclass(frozen=True)
class BackendPattern:
    """One allowed-backend pattern (``agl server --allow-backend PATTERN``): ``scheme://host[:port][/path]``.

    Scheme, host, port and path are matched separately against the backend URL as the gateway connects to it, so a
    wildcard never reaches across parts (``https://*.example.com`` does not admit ``https://evil.com/x.example.com``).
    Host, port and path take fnmatch wildcards (``*``, ``?``, ``[...]``). In a host a wildcard stays within one label
    (one octet of an IPv4 address, one group of an IPv6 one): ``http://10.0.0.*:8000`` admits ``10.0.0.7``, never
    ``10.0.0.7.attacker.example``, and ``*.example.com`` admits ``eu.example.com``, not ``a.b.example.com``. No port
    means the scheme's default (``:*`` for any). A path without wildcards is a prefix at a ``/`` boundary
    (``https://api.openai.com`` admits every path there; ``https://h/v1`` admits ``/v1`` and ``/v1/...``, not
    ``/v10``); a path with wildcards must match the whole path.
    """

    text: str
    scheme: str
    host: str
    port: str
    path: str

    @classmethod
    def parse(cls, text: str) -> BackendPattern:
        """The pattern ``text``; ValueError saying what is wrong when it is not one."""
        match = _PATTERN.match(text.strip())
        netloc = _NETLOC.match(match["netloc"]) if match else None
        if match is None or netloc is None:
            raise ValueError(
                f"allowed backend {text!r} is not a pattern scheme://host[:port][/path] (no user info, query or "
                "fragment), e.g. https://api.openai.com/v1 or http://10.0.0.*:8000"
            )
        scheme = match["scheme"].lower()
        if scheme not in DEFAULT_PORTS:
            raise ValueError(f"allowed backend {text!r}: the scheme must be http or https, not {scheme!r}")
        host = (netloc["v6"] or netloc["host"]).lower()
        return cls(text, scheme, host, netloc["port"] or str(DEFAULT_PORTS[scheme]), match["path"].rstrip("/"))

    def matches(self, scheme: str, host: str, port: int, path: str) -> bool:
        if scheme != self.scheme or not _host_matches(host, self.host) or not fnmatchcase(str(port), self.port):
            return False
        if _WILDCARD.search(self.path):
            return fnmatchcase(path, self.path)
        return not self.path or path == self.path or path.startswith(self.path + "/")


class AllowedBackends:
    """The backends a server forwards to: URLs matching any of ``patterns`` (none: no backend at all)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = [BackendPattern.parse(p) for p in patterns]

    def allows(self, url: str) -> bool:
        parts = url_parts(url)
        if parts is None or any(segment in (".", "..") for segment in parts[3].split("/")):
            return False
        return any(p.matches(*parts) for p in self.patterns)

    def __str__(self) -> str:
        return ", ".join(p.text for p in self.patterns) or "none"
