"""HTTP store: the ``Store`` contract spoken to an ``agl server`` (``agl.core.server``) over its ``/api`` routes.

Concurrency model: one ``httpx.Client`` (a thread-safe connection pool) per store object; every method is one blocking
request (``wait`` loops over the server's capped wait). Errors come back as ``NotFound`` (404) or ``StoreError``
(other 4xx, and 500 with the server's message) carrying the server's message.

Retries (tenacity): a request that never reached the server (connection refused, connect timeout) and a 503 the
server marks as applying nothing (``HEADER_UNAVAILABLE``) are retried with jittered exponential backoff for about
``retry_for`` seconds, so a runner or trainer survives a server restart; then ``StoreUnavailable`` names the server.
A connection that broke *after* the request was sent (the server died mid-request, or closed the connection after a
500), and a 502/503/504 from something in front of the server, leave it unknown whether the request was applied, so
each request is re-sent only when that is safe:

- reads (``get_*``, ``list_*``, ``query_spans``, ``wait``, ``settings``), ``heartbeat``, ``reap`` and ``cancel``
  change nothing or reach the same state again: re-sent.
- ``add_spans`` is idempotent on ``span_id``: re-sent.
- ``complete_attempt`` is accepted only while the attempt runs: a re-send of a report that was already applied
  changes nothing and returns False, like any late report.
- ``lease``: re-sent. If the lost answer had started an attempt, nobody runs it; the store reaps it as ``lost`` after
  ``heartbeat_timeout`` and the rollout goes back to the queue (it costs that rollout one of its ``max_attempts``).
- ``publish_resources`` and ``add_record`` look before sending again: if the latest resources version (or a record of
  the same kind and key) equals what was sent, the first send was applied and that is the answer (a latest version
  holding the very same resources serves as well as a new one).
- ``enqueue`` names its rollouts itself (``RolloutRequest.rollout_id``), and the store returns the stored rollout for
  an id it already has: re-sent, applied once.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx
import tenacity
from pydantic import TypeAdapter

from agl.core import routes
from agl.core.local_token import read_local_token
from agl.core.routes import Route
from agl.core.store.base import (
    NotFound,
    Store,
    StoreDenied,
    StoreError,
    StoreSettings,
    StoreUnavailable,
    check_cancel_reason,
)
from agl.core.types import (
    ENV_TOKEN,
    HEADER_ATTEMPT,
    HEADER_ROLLOUT,
    HEADER_UNAVAILABLE,
    LLM,
    MAX_BODY_LIST,
    REDACTED,
    Attempt,
    AttemptStatus,
    Record,
    Resource,
    ResourceSet,
    Rollout,
    RolloutRequest,
    Span,
    new_id,
)

_SPANS = TypeAdapter(list[Span])
_ROLLOUTS = TypeAdapter(list[Rollout])
_ATTEMPTS = TypeAdapter(list[Attempt])
_RECORDS = TypeAdapter(list[Record])
_REQUESTS = TypeAdapter(list[RolloutRequest])
_RESOURCES = TypeAdapter(dict[str, Resource])

#: The server answers one wait request after at most this long (``agl.core.server.MAX_WAIT_S``).
_SERVER_WAIT_CAP = 30.0
#: Failures that happen before the request reached the server: safe to retry for every method.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: Answers that mean "not now" (a restarting server, a proxy in front of it). Retried for every request when they
#: carry ``HEADER_UNAVAILABLE`` (agl refused before applying anything); otherwise (a proxy's 502/504 may come after
#: the server applied the request) only requests that may be sent twice are retried blindly.
_TRANSIENT_STATUS = frozenset({502, 503, 504})
#: Spans asked for per ``GET /api/spans`` request (the server's most per page).
_SPANS_PAGE = 10_000
#: Attempt keys kept from leases (a runner needs only its current attempt's).
_KEPT_ATTEMPT_KEYS = 256

T = TypeVar("T")


class _Unsure(StoreError):
    """The connection broke after the request was sent: it may or may not have been applied."""


log = logging.getLogger("agl.store")


class _Transient(Exception):
    """A 502/503/504 answer, retried like a refused connection."""

    def __init__(self, resp: httpx.Response) -> None:
        super().__init__(f"HTTP {resp.status_code}: {_message(resp)}")


def _chunks(items: list[T]) -> list[list[T]]:
    """``items`` in lists of at most ``MAX_BODY_LIST``, the most the server takes in one body."""
    return [items[i : i + MAX_BODY_LIST] for i in range(0, len(items), MAX_BODY_LIST)]


class HttpStore(Store):
    """A ``Store`` backed by a remote ``agl server``.

    ``timeout`` bounds one request; ``retry_for`` is how long an unreachable server is retried before
    ``StoreUnavailable`` (see the module docstring for which requests are re-sent after a broken connection).
    ``token`` is sent as ``Authorization: Bearer <token>`` (default: env ``AGL_TOKEN``, else for a loopback URL the
    token that server wrote for this user, ``agl.core.local_token``; none when neither is there; ``""``: none); a server
    that refuses it answers 401/403, raised as ``StoreError`` with the server's message. A token taken from that file
    is read again when the server answers 401: a client started while its server was down, or whose server's token was
    rotated, takes the token the server on that port now has for this user. The ``api_key`` of every
    ``LLM`` read from a server is ``REDACTED``; publishing it back keeps the key the server has.

    Example::

        store = HttpStore("http://127.0.0.1:4747")
        [ro] = store.enqueue([RolloutRequest(task={"q": "2+2"})])
    """

    def __init__(self, url: str, timeout: float = 60.0, retry_for: float = 60.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry_for = retry_for
        token = os.environ.get(ENV_TOKEN) if token is None else token
        #: whether the token is the one the loopback server on that port wrote for this user (then followed on a 401)
        self._local = token is None
        if token is None:
            token = read_local_token(self.url)
        headers = {"authorization": f"Bearer {token}"} if token else None
        self._client = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)
        self._settings: StoreSettings | None = None
        #: attempt id → (rollout id, key) of the attempts this client leased: it heartbeats, completes and writes spans
        #: of them with their key, not its token (the server takes nothing else from a runner for them).
        self._attempt_keys: OrderedDict[str, tuple[str, str]] = OrderedDict()

    @property
    def settings(self) -> StoreSettings:
        """The server store's timing rules (fetched once); the defaults when the server does not say.

        While the server cannot be reached the defaults are returned but not kept, so a later call asks again.
        """
        if self._settings is None:
            try:
                data = self._call(routes.SETTINGS).json()
                self._settings = StoreSettings(
                    heartbeat_timeout=float(data["heartbeat_timeout"]), attempt_timeout=float(data["attempt_timeout"])
                )
            except StoreUnavailable:
                return StoreSettings()
            except (StoreError, KeyError, TypeError, ValueError):
                self._settings = StoreSettings()
        return self._settings

    @settings.setter
    def settings(self, value: StoreSettings) -> None:
        self._settings = value

    # transport ------------------------------------------------------------------------------------------------
    def _call(
        self,
        route: Route,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        resend: bool = True,
        timeout: float | None = None,
        attempt_id: str | None = None,
    ) -> httpx.Response:
        """One request to ``route`` (its path's parameters bound) with retries; returns a 2xx response or raises
        NotFound / StoreError.

        ``resend``: whether the request may be sent again after the connection broke once it was sent (when not,
        ``_Unsure`` is raised at once). ``attempt_id``: an attempt this client leased, whose key (not the token) is
        sent, with the headers naming the attempt.
        """
        method, path = route.method, route.path
        headers = {"content-type": "application/json"} if content is not None else {}
        held = self._attempt_keys.get(attempt_id) if attempt_id is not None else None
        if held is not None and attempt_id is not None:
            headers.update({"authorization": f"Bearer {held[1]}", HEADER_ROLLOUT: held[0], HEADER_ATTEMPT: attempt_id})
        if params is not None:
            params = {k: v for k, v in params.items() if v is not None}

        def send() -> httpx.Response:
            try:
                resp = self._client.request(
                    method,
                    path,
                    json=json,
                    content=content,
                    params=params,
                    headers=headers,
                    timeout=timeout if timeout is not None else self.timeout,
                )
            except httpx.TransportError as exc:
                if resend or isinstance(exc, _NOT_SENT):
                    raise
                raise _Unsure(
                    f"{method} {self.url}{path}: connection broke after the request was sent "
                    f"({type(exc).__name__}: {exc}); not sent again because it may have been applied"
                ) from exc
            if resp.status_code in _TRANSIENT_STATUS:
                if resend or HEADER_UNAVAILABLE in resp.headers:
                    raise _Transient(resp)
                raise _Unsure(
                    f"{method} {self.url}{path}: HTTP {resp.status_code} from something in front of the agl server "
                    f"({_message(resp)}); not sent again blindly because it may have been applied"
                )
            return resp

        def warn_once(state: tenacity.RetryCallState) -> None:
            """Say that the server is failing at the first retry of a call, so a waiting runner is never silent."""
            if state.attempt_number == 1 and state.outcome is not None:
                exc = state.outcome.exception()
                problem = str(exc) if isinstance(exc, _Transient) else f"{type(exc).__name__}: {exc}"
                log.warning("%s %s%s: %s; retrying for up to %gs", method, self.url, path, problem, self.retry_for)

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_delay(self.retry_for),
            wait=tenacity.wait_exponential(multiplier=0.05, max=2.0) + tenacity.wait_random(0, 0.1),
            retry=tenacity.retry_if_exception_type((httpx.TransportError, _Transient)),
            before_sleep=warn_once,
            reraise=True,
        )
        try:
            resp = retrying(send)
            if resp.status_code == 401 and held is None and self._follow_local_token():
                resp = retrying(send)  # a 401 applied nothing: send it again with the server's token
        except (httpx.TransportError, _Transient) as exc:
            problem = str(exc) if isinstance(exc, _Transient) else f"{type(exc).__name__}: {exc}"
            raise StoreUnavailable(
                f"{method} {self.url}{path}: agl server at {self.url} unavailable for {self.retry_for:g}s "
                f"({problem}); is `agl server` running?"
            ) from exc
        if resp.status_code < 300:
            return resp
        message = _message(resp)
        if resp.status_code == 404:
            raise NotFound(message)
        if resp.status_code in (401, 403):
            who = "no token" if "authorization" not in self._client.headers else "the token"
            hint = ""
            if resp.status_code == 401 and self._local and held is None:
                hint = (
                    "; this client takes the token the agl server on that port writes for this user, and that server "
                    "has written none it accepts: it runs with --token-file or AGL_TOKEN (give this client that "
                    f"token in {ENV_TOKEN}), or it is not an agl server of this user"
                )
            raise StoreDenied(
                f"agl server refused {method} {path} (HTTP {resp.status_code}, {who} sent): {message}{hint}"
            )
        if resp.status_code < 500:
            raise StoreError(message)
        raise StoreError(f"agl server error (HTTP {resp.status_code}) on {method} {path}: {message}")

    def _follow_local_token(self) -> bool:
        """After a 401: take the token the loopback server on this port now has for this user, if this client's
        token came from there and that one differs; whether it changed."""
        if not self._local:
            return False
        token = read_local_token(self.url)
        current = self._client.headers.get("authorization")
        if token is None or current == f"Bearer {token}":
            return False
        log.warning(
            "agl server at %s refused %s; taking the token it now has for this user (the server started after this "
            "client, or its token was rotated)",
            self.url,
            "this client's token" if current else "a request without a token",
        )
        self._client.headers["authorization"] = f"Bearer {token}"
        return True

    def _once(self, send: Callable[[], T], applied: Callable[[], T | None]) -> T:
        """Send a request that must not be applied twice; when it may have been applied (a break mid-request, a
        proxy's 502/504), look before sending again, waiting a little longer each round."""
        deadline = time.monotonic() + self.retry_for
        pause = 0.1
        while True:
            try:
                return send()
            except _Unsure as exc:
                found = applied()
                if found is not None:
                    return found
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(f"{exc} (still breaking after {self.retry_for:g}s)") from exc
                time.sleep(pause)
                pause = min(2 * pause, 2.0)

    # rollouts -------------------------------------------------------------------------------------------------
    def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Enqueue with client-chosen rollout ids, so a request resent after a broken connection is applied once."""
        named = [r if r.rollout_id else r.model_copy(update={"rollout_id": new_id("ro")}) for r in requests]
        enqueued: list[Rollout] = []
        for part in _chunks(named):
            body = b'{"requests":' + _REQUESTS.dump_json(part) + b"}"
            enqueued += _ROLLOUTS.validate_json(self._call(routes.ENQUEUE, content=body).content)
        return enqueued

    def lease(self, worker_id: str) -> tuple[Rollout, Attempt] | None:
        return self.lease_wait(worker_id, 0.0)

    def lease_wait(self, worker_id: str, timeout: float, poll: float = 0.05) -> tuple[Rollout, Attempt] | None:
        """One request: the server waits up to ``timeout`` seconds (at most ``_SERVER_WAIT_CAP``) for a rollout."""
        wait = min(max(0.0, timeout), _SERVER_WAIT_CAP)
        body: dict[str, Any] = {"worker_id": worker_id, **({"wait": wait} if wait else {})}
        data = self._call(routes.LEASE, json=body, timeout=wait + self.timeout).json()
        if data is None:
            return None
        rollout, attempt = Rollout.model_validate(data["rollout"]), Attempt.model_validate(data["attempt"])
        key = data.get("attempt_key")
        if isinstance(key, str):
            self._attempt_keys[attempt.attempt_id] = (rollout.rollout_id, key)
            while len(self._attempt_keys) > _KEPT_ATTEMPT_KEYS:
                self._attempt_keys.popitem(last=False)
        return rollout, attempt

    def attempt_key(self, attempt_id: str) -> str:
        """The gateway key the server handed out with the lease of ``attempt_id`` (``"agl"`` when none)."""
        held = self._attempt_keys.get(attempt_id)
        return held[1] if held is not None else "agl"

    def heartbeat(self, attempt_id: str) -> bool:
        return bool(self._call(routes.HEARTBEAT.bind(attempt_id=attempt_id), attempt_id=attempt_id).json()["ok"])

    def complete_attempt(
        self, attempt_id: str, status: AttemptStatus, final_reward: float | None = None, error: str | None = None
    ) -> bool:
        body = {"status": status, "final_reward": final_reward, "error": error}
        route = routes.COMPLETE.bind(attempt_id=attempt_id)
        return bool(self._call(route, json=body, attempt_id=attempt_id).json()["ok"])

    def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate_json(self._call(routes.GET_ROLLOUT.bind(rollout_id=rollout_id)).content)

    def list_rollouts(
        self, status: str | None = None, mode: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Rollout]:
        params = {"status": status, "mode": mode, "limit": limit, "offset": offset}
        return _ROLLOUTS.validate_json(self._call(routes.LIST_ROLLOUTS, params=params).content)

    def get_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        found: list[Rollout] = []
        for part in _chunks(list(rollout_ids)):
            resp = self._call(routes.GET_ROLLOUTS, json={"rollout_ids": part})
            found += _ROLLOUTS.validate_json(resp.content)
        return found

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        return _ATTEMPTS.validate_json(self._call(routes.LIST_ATTEMPTS.bind(rollout_id=rollout_id)).content)

    def cancel(self, rollout_ids: Sequence[str], reason: str | None = None) -> int:
        reason = check_cancel_reason(reason)
        cancelled = 0
        for part in _chunks(list(rollout_ids)):
            body = {"rollout_ids": part, "reason": reason}
            cancelled += int(self._call(routes.CANCEL, json=body).json()["count"])
        return cancelled

    def reap(self) -> int:
        return int(self._call(routes.REAP).json()["count"])

    def wait(self, rollout_ids: Sequence[str], timeout: float, poll: float = 0.05) -> list[Rollout]:
        if len(rollout_ids) > MAX_BODY_LIST:  # one chunk after the other, all within the one deadline
            deadline = time.monotonic() + timeout
            return [
                r
                for part in _chunks(list(rollout_ids))
                for r in self.wait(part, max(0.0, deadline - time.monotonic()), poll)
            ]
        ids = list(rollout_ids)
        deadline = time.monotonic() + timeout
        while True:
            chunk = min(max(0.0, deadline - time.monotonic()), _SERVER_WAIT_CAP)
            body = {"rollout_ids": ids, "timeout": chunk, "poll": min(max(poll, 0.001), 5.0)}
            resp = self._call(routes.WAIT, json=body, timeout=chunk + self.timeout)
            rollouts = _ROLLOUTS.validate_json(resp.content)
            if all(r.finished for r in rollouts) or time.monotonic() >= deadline:
                return rollouts

    # spans ----------------------------------------------------------------------------------------------------
    def add_spans(self, spans: Sequence[Span]) -> int:
        """Spans of an attempt this client leased go with its key, one request per such attempt; the rest with the
        token (a trainer's), in one request; each request stores its spans atomically, and holds at most
        ``MAX_BODY_LIST`` of them."""
        by_attempt: dict[str | None, list[Span]] = {}
        for span in spans:
            held = span.attempt_id if span.attempt_id in self._attempt_keys else None
            by_attempt.setdefault(held, []).append(span)
        stored = 0
        for attempt_id, batch in by_attempt.items():
            for part in _chunks(batch):
                body = _SPANS.dump_json(part)
                stored += int(self._call(routes.ADD_SPANS, content=body, attempt_id=attempt_id).json()["count"])
        return stored

    def query_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        """Pages through ``GET /api/spans`` (at most ``_SPANS_PAGE`` spans a request) until ``limit`` or the end."""
        found: list[Span] = []
        while limit is None or len(found) < limit:
            page = _SPANS_PAGE if limit is None else min(limit - len(found), _SPANS_PAGE)
            params = {"rollout_id": rollout_id, "attempt_id": attempt_id, "kind": kind, "agent": agent}
            resp = self._call(routes.QUERY_SPANS, params={**params, "limit": page, "offset": offset + len(found)})
            got = _SPANS.validate_json(resp.content)
            found += got
            if len(got) < page or "x-agl-next-offset" not in resp.headers:  # the last page (or a server without pages)
                break
        return found

    # resources ------------------------------------------------------------------------------------------------
    def publish_resources(self, resources: dict[str, Resource]) -> ResourceSet:
        body = b'{"resources":' + _RESOURCES.dump_json(resources) + b"}"

        def send() -> ResourceSet:
            return ResourceSet.model_validate_json(self._call(routes.PUBLISH, content=body, resend=False).content)

        def applied() -> ResourceSet | None:
            try:
                latest = self.get_resources()
            except NotFound:
                return None
            return latest if latest.resources == _redacted(resources) else None

        return self._once(send, applied)

    def get_resources(self, version: int | None = None) -> ResourceSet:
        route = routes.LATEST_RESOURCES if version is None else routes.GET_RESOURCES.bind(version=int(version))
        return ResourceSet.model_validate_json(self._call(route).content)

    # records --------------------------------------------------------------------------------------------------
    def add_record(self, record: Record) -> None:
        body = record.model_dump_json().encode()

        def send() -> bool:
            self._call(routes.ADD_RECORD, content=body, resend=False)
            return True

        def applied() -> bool | None:
            return True if record in self.list_records(record.kind, record.key) else None

        self._once(send, applied)

    def list_records(self, kind: str, key: str | None = None) -> list[Record]:
        return _RECORDS.validate_json(self._call(routes.LIST_RECORDS, params={"kind": kind, "key": key}).content)

    def close(self) -> None:
        self._client.close()


def _redacted(resources: dict[str, Resource]) -> dict[str, Resource]:
    """``resources`` as a server answers them: every LLM's ``api_key`` replaced by ``REDACTED``."""
    return {n: r.model_copy(update={"api_key": REDACTED}) if isinstance(r, LLM) else r for n, r in resources.items()}


def _message(resp: httpx.Response) -> str:
    """The server's ``{"error": ...}`` message, or the start of whatever body came back."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return resp.text[:500]
