"""Whose fault an agent's failure is: agl's own (its gateway or store could not be reached, or answered agl's 503),
so the attempt is ``lost`` and retried, or the agent's, so it fails. Decided from the exception chain and the URL of
the request that failed, never from the message text."""

from __future__ import annotations

from typing import Any

from agl.core.types import HEADER_UNAVAILABLE

#: HTTP client packages whose errors carry the failing request (openai's own client runs on httpx2).
_HTTP_PACKAGES = frozenset({"httpx", "httpx2", "httpcore", "openai"})
#: Error classes (by name, in those packages) that mean the server could not be reached or dropped the connection.
_CONNECTION_ERRORS = frozenset(
    {"ConnectError", "ConnectTimeout", "ReadError", "WriteError", "RemoteProtocolError", "APIConnectionError"}
)
#: Subclasses of those that mean "slow", not "unreachable": the agent's own timeout, not agl's outage.
_SLOW_ERRORS = frozenset({"APITimeoutError", "ReadTimeout", "WriteTimeout", "PoolTimeout"})


def _class_names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__ if c.__module__.partition(".")[0] in _HTTP_PACKAGES}


def _request_of(exc: BaseException) -> Any:
    """The HTTP request an httpx / openai error is about, or None (httpx raises when it was never set)."""
    try:
        return getattr(exc, "request", None)
    except RuntimeError:
        return None


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def _unreachable_request(exc: BaseException, base: str) -> str | None:
    """How ``exc`` itself is a failed request to ``base`` (unreachable, dropped, or agl's own 503), or None.

    Only a 503 marked ``HEADER_UNAVAILABLE`` is agl's: the gateway passes its LLM backend's errors on, and answers
    502/504 when the backend is unreachable or slow; those are the agent's (its model's) failures.
    """
    names = _class_names(exc)
    if not names:
        return None
    request = _request_of(exc)
    url = str(getattr(request, "url", ""))
    if not url.startswith(base):
        return None
    response = getattr(exc, "response", None)
    refused = _status_of(exc) == 503 and HEADER_UNAVAILABLE in getattr(response, "headers", {})
    unreachable = bool(names & _CONNECTION_ERRORS) and not names & _SLOW_ERRORS
    if not (unreachable or refused):
        return None
    what = "HTTP 503" if refused else type(exc).__name__
    return f"{what} on {getattr(request, 'method', 'request')} {url}: {exc}"


def agl_side_failure(exc: BaseException, server_url: str) -> str | None:
    """Why the agent's failure ``exc`` is agl's own fault, or None when it is the agent's.

    It is agl's fault when the exception, or one it was raised from or while handling (``__cause__`` /
    ``__context__``), is a request to ``server_url`` (this runner's gateway and store) that could not connect, lost
    its connection, or was answered agl's own 503 (``HEADER_UNAVAILABLE``). An exception group is agl's fault when
    all of its members are. Timeouts are the agent's (its own limit, a slow model), and so is every other error.
    """
    base = server_url.rstrip("/") + "/"
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            causes = [agl_side_failure(member, server_url) for member in current.exceptions]
            if causes and all(causes):
                return str(causes[0])
        else:
            found = _unreachable_request(current, base)
            if found is not None:
                return found
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None
