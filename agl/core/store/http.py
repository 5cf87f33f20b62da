"""HTTP store: the ``Store`` contract spoken to an ``agl server`` (``agl.core.server``) over its ``/api`` routes.

Concurrency model: one ``httpx.Client`` (a thread-safe connection pool) per store object; every method is one blocking
request (``wait`` loops over the server's capped wait). Errors come back as ``NotFound`` (404) or ``StoreError``
(other 4xx) carrying the server's message. Connection failures and 502/503 are retried with backoff for up to
``retry_for`` seconds so a runner survives a server restart; a request that may already have been applied
(the connection broke after it was sent) is retried only when the method is idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from agl.core.store.base import NotFound, Store, StoreError, StoreSettings
from agl.core.types import Attempt, AttemptStatus, Record, Resource, ResourceSet, Rollout, RolloutRequest, Span

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


class HttpStore(Store):
    """A ``Store`` backed by a remote ``agl server``.

    Example::

        store = HttpStore("http://127.0.0.1:4747")
        [ro] = store.enqueue([RolloutRequest(task={"q": "2+2"})])
    """

    def __init__(self, url: str, timeout: float = 60.0, retry_for: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry_for = retry_for
        self._client = httpx.Client(base_url=self.url, timeout=timeout)
        self._settings: StoreSettings | None = None

    @property
    def settings(self) -> StoreSettings:
        """The server store's timing rules (fetched once); the defaults when the server does not say."""
        if self._settings is None:
            try:
                data = self._call("GET", "/api/settings").json()
                self._settings = StoreSettings(
                    heartbeat_timeout=float(data["heartbeat_timeout"]), attempt_timeout=float(data["attempt_timeout"])
                )
            except (StoreError, KeyError, TypeError, ValueError):
                self._settings = StoreSettings()
        return self._settings

    @settings.setter
    def settings(self, value: StoreSettings) -> None:
        self._settings = value

    # transport ------------------------------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        idempotent: bool = True,
        timeout: float | None = None,
    ) -> httpx.Response:
        """One request with retries; returns a 2xx response or raises NotFound / StoreError."""
        headers = {"content-type": "application/json"} if content is not None else None
        if params is not None:
            params = {k: v for k, v in params.items() if v is not None}
        deadline = time.monotonic() + self.retry_for
        delay = 0.05
        while True:
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
                if not (idempotent or isinstance(exc, _NOT_SENT)):
                    raise StoreError(
                        f"{method} {self.url}{path}: connection broke after the request was sent "
                        f"({type(exc).__name__}: {exc}); not retried because it may have been applied"
                    ) from exc
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code not in (502, 503):
                    break
                problem = f"HTTP {resp.status_code}: {_message(resp)}"
            if time.monotonic() + delay > deadline:
                raise StoreError(
                    f"{method} {self.url}{path}: agl server unavailable for {self.retry_for:g}s ({problem}); "
                    "is `agl server` running?"
                )
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        if resp.status_code < 300:
            return resp
        message = _message(resp)
        if resp.status_code == 404:
            raise NotFound(message)
        if resp.status_code < 500:
            raise StoreError(message)
        raise StoreError(f"agl server error (HTTP {resp.status_code}) on {method} {path}: {message}")

    # rollouts -------------------------------------------------------------------------------------------------
    def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        body = b'{"requests":' + _REQUESTS.dump_json(list(requests)) + b"}"
        return _ROLLOUTS.validate_json(
            self._call("POST", "/api/rollouts/enqueue", content=body, idempotent=False).content
        )

    def lease(self, worker_id: str) -> tuple[Rollout, Attempt] | None:
        data = self._call("POST", "/api/lease", json={"worker_id": worker_id}, idempotent=False).json()
        if data is None:
            return None
        return Rollout.model_validate(data["rollout"]), Attempt.model_validate(data["attempt"])

    def heartbeat(self, attempt_id: str) -> bool:
        return bool(self._call("POST", f"/api/attempts/{quote(attempt_id, safe='')}/heartbeat").json()["ok"])

    def complete_attempt(
        self, attempt_id: str, status: AttemptStatus, final_reward: float | None = None, error: str | None = None
    ) -> bool:
        body = {"status": status, "final_reward": final_reward, "error": error}
        return bool(
            self._call(
                "POST", f"/api/attempts/{quote(attempt_id, safe='')}/complete", json=body, idempotent=False
            ).json()["ok"]
        )

    def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate_json(self._call("GET", f"/api/rollouts/{quote(rollout_id, safe='')}").content)

    def list_rollouts(
        self, status: str | None = None, mode: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Rollout]:
        params = {"status": status, "mode": mode, "limit": limit, "offset": offset}
        return _ROLLOUTS.validate_json(self._call("GET", "/api/rollouts", params=params).content)

    def get_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        resp = self._call("POST", "/api/rollouts/get", json={"rollout_ids": list(rollout_ids)})
        return _ROLLOUTS.validate_json(resp.content)

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        return _ATTEMPTS.validate_json(
            self._call("GET", f"/api/rollouts/{quote(rollout_id, safe='')}/attempts").content
        )

    def cancel(self, rollout_ids: Sequence[str]) -> int:
        return int(self._call("POST", "/api/rollouts/cancel", json={"rollout_ids": list(rollout_ids)}).json()["count"])

    def reap(self) -> int:
        return int(self._call("POST", "/api/reap").json()["count"])

    def wait(self, rollout_ids: Sequence[str], timeout: float, poll: float = 0.05) -> list[Rollout]:
        ids = list(rollout_ids)
        deadline = time.monotonic() + timeout
        while True:
            chunk = min(max(0.0, deadline - time.monotonic()), _SERVER_WAIT_CAP)
            body = {"rollout_ids": ids, "timeout": chunk, "poll": min(max(poll, 0.001), 5.0)}
            resp = self._call("POST", "/api/rollouts/wait", json=body, timeout=chunk + self.timeout)
            rollouts = _ROLLOUTS.validate_json(resp.content)
            if all(r.finished for r in rollouts) or time.monotonic() >= deadline:
                return rollouts

    # spans ----------------------------------------------------------------------------------------------------
    def add_spans(self, spans: Sequence[Span]) -> int:
        if not spans:
            return 0
        return int(self._call("POST", "/api/spans", content=_SPANS.dump_json(list(spans))).json()["count"])

    def query_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
    ) -> list[Span]:
        params = {"rollout_id": rollout_id, "attempt_id": attempt_id, "kind": kind, "agent": agent, "limit": limit}
        return _SPANS.validate_json(self._call("GET", "/api/spans", params=params).content)

    # resources ------------------------------------------------------------------------------------------------
    def publish_resources(self, resources: dict[str, Resource]) -> ResourceSet:
        body = b'{"resources":' + _RESOURCES.dump_json(resources) + b"}"
        return ResourceSet.model_validate_json(
            self._call("POST", "/api/resources", content=body, idempotent=False).content
        )

    def get_resources(self, version: int | None = None) -> ResourceSet:
        path = "/api/resources/latest" if version is None else f"/api/resources/{int(version)}"
        return ResourceSet.model_validate_json(self._call("GET", path).content)

    # records --------------------------------------------------------------------------------------------------
    def add_record(self, record: Record) -> None:
        self._call("POST", "/api/records", content=record.model_dump_json().encode(), idempotent=False)

    def list_records(self, kind: str, key: str | None = None) -> list[Record]:
        return _RECORDS.validate_json(self._call("GET", "/api/records", params={"kind": kind, "key": key}).content)

    def close(self) -> None:
        self._client.close()


def _message(resp: httpx.Response) -> str:
    """The server's ``{"error": ...}`` message, or the start of whatever body came back."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return resp.text[:500]
