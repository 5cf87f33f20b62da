"""The Store contract: the one durable place where rollouts, attempts, spans, resources and records live.

Every implementation (SQLite embedded, HTTP client, PostgreSQL) passes the same test suite. Methods are synchronous
and thread-safe; callers in async code run them in a thread.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from agl.core.types import (
    Attempt,
    AttemptStatus,
    Record,
    Resource,
    ResourceSet,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    Span,
)


class StoreError(Exception):
    """A request the store refuses (unknown id, bad state); the message says what and why."""


class NotFound(StoreError):
    """The id asked for does not exist."""


class StoreUnavailable(StoreError):
    """A remote store stayed unreachable (or answered 502/503/504) for its whole retry window."""


class StoreDenied(StoreError):
    """The server refused the client's token (HTTP 401) or its role (403): asking again cannot help."""


#: What a store object tells its subscribers: ``queued`` (a rollout may have become leasable: enqueued, or requeued
#: after a lost attempt), ``finished`` (a rollout may have finished or an attempt ended).
StoreEvent = Literal["queued", "finished"]


class LiveAttempt(NamedTuple):
    """What the gateway checks on every call (``Store.live_attempt``): the rollout's status, its resources version
    and the id of its live (running) attempt, None when it has none."""

    status: RolloutStatus
    resources_version: int
    attempt_id: str | None


class StoreEvents:
    """Change notifications of one store object: counters per event, a condition to wait on, and listeners.

    Only writes made through this object are seen (another process writing the same database is not): waiters keep
    polling the store, at a slower pace, for those.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counts: dict[str, int] = {"queued": 0, "finished": 0}
        self._listeners: list[Callable[[StoreEvent], None]] = []

    def count(self, event: StoreEvent) -> int:
        return self._counts[event]

    def notify(self, *events: StoreEvent) -> None:
        with self._cond:
            for event in events:
                self._counts[event] += 1
            self._cond.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            for event in events:
                listener(event)

    def wait(self, event: StoreEvent, seen: int, timeout: float) -> int:
        """Block until ``event``'s counter passes ``seen`` or ``timeout`` seconds passed; returns the counter."""
        with self._cond:
            self._cond.wait_for(lambda: self._counts[event] != seen, max(0.0, timeout))
            return self._counts[event]

    def subscribe(self, listener: Callable[[StoreEvent], None]) -> Callable[[], None]:
        """Call ``listener(event)`` from the writing thread after each notified write (keep it quick: set a flag,
        schedule a callback); returns the function that unsubscribes it."""
        with self._cond:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._cond, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe


_EVENTS_LOCK = threading.Lock()

#: The longest ``reason`` ``Store.cancel`` keeps (a one-line cause, not a log).
MAX_CANCEL_REASON = 1000


def check_cancel_reason(reason: str | None) -> str | None:
    """``reason`` as ``Store.cancel`` takes it: None, or 1 to ``MAX_CANCEL_REASON`` characters (ValueError else)."""
    if reason is not None and not (isinstance(reason, str) and 0 < len(reason) <= MAX_CANCEL_REASON):
        raise ValueError(f"cancel: reason must be a string of 1 to {MAX_CANCEL_REASON} characters or None")
    return reason


def _after(
    method: Callable[..., Any], events_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], tuple[str, ...]]
) -> Any:
    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        events = events_of(result, args, kwargs)
        if events:
            self.events.notify(*events)  # type: ignore[arg-type]
        return result

    wrapper.__dict__["_agl_notifies"] = True
    return wrapper


def _completed(result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
    status = kwargs.get("status", args[1] if len(args) > 1 else None)
    if not result:
        return ()
    return ("queued", "finished") if status == "lost" else ("finished",)


#: The writes after which a store object notifies its subscribers, and which events each one sends.
_NOTIFYING: dict[str, Callable[[Any, tuple[Any, ...], dict[str, Any]], tuple[str, ...]]] = {
    "enqueue": lambda result, args, kwargs: ("queued",) if result else (),
    "complete_attempt": _completed,
    "cancel": lambda result, args, kwargs: ("finished",) if result else (),
    "reap": lambda result, args, kwargs: ("queued", "finished") if result else (),
}


@dataclass(frozen=True)
class StoreSettings:
    """Timing rules the store enforces when it reaps attempts.

    heartbeat_timeout: an attempt whose last heartbeat is older than this is ``lost`` (its worker died).
    attempt_timeout: an attempt running longer than this is ``timed_out`` (the agent hangs).
    """

    heartbeat_timeout: float = 30.0
    attempt_timeout: float = 1800.0


class Store(abc.ABC):
    """Durable queue + span log + resource registry.

    Contract:
    - ``enqueue`` creates queued rollouts; ``lease`` hands the oldest queued one to a worker as a new running Attempt.
    - Workers ``heartbeat`` while they run; a stale heartbeat or an over-long attempt is reaped as lost/timed_out and
      the rollout goes back to the queue until ``max_attempts`` tries were used, then it fails.
    - ``complete_attempt`` is accepted only for the rollout's current running attempt (a late report from a reaped
      worker is ignored and returns False). A worker reports ``"lost"`` for an attempt that failed only because
      agl's own infrastructure (its gateway or store) was unreachable: the attempt is settled exactly as the reaper
      settles a lost one, so the rollout is retried while it has tries left.
    - ``add_spans`` is idempotent on ``span_id``: re-sending a batch never duplicates spans.
    - ``query_spans`` returns spans in the order the store received them. A stored span that can no longer be read
      (written before values were checked) is skipped and logged; it never fails the whole read.
    - Published resource sets are immutable and numbered 1, 2, 3, ...

    Example::

        store = SqliteStore("runs/agl.db")
        store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:8000/v1", model="m")})
        [ro] = store.enqueue([RolloutRequest(task={"q": "2+2"})])
        rollout, attempt = store.lease("worker-1")
        store.add_spans([Span(rollout_id=ro.rollout_id, attempt_id=attempt.attempt_id, kind="reward", name="r")])
        store.complete_attempt(attempt.attempt_id, "succeeded", final_reward=1.0)
    """

    settings: StoreSettings

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every store notifies its ``events`` after ``enqueue``, ``complete_attempt``, ``cancel`` and ``reap``
        changed something, without each implementation having to (their methods are wrapped here)."""
        super().__init_subclass__(**kwargs)
        for name, events_of in _NOTIFYING.items():
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_agl_notifies", False):
                setattr(cls, name, _after(method, events_of))

    @property
    def events(self) -> StoreEvents:
        """Change notifications of this store object (see ``StoreEvents``)."""
        found = self.__dict__.get("_agl_events")
        if found is None:
            with _EVENTS_LOCK:
                found = self.__dict__.setdefault("_agl_events", StoreEvents())
        return found

    # rollouts -------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]: ...

    @abc.abstractmethod
    def lease(self, worker_id: str) -> tuple[Rollout, Attempt] | None:
        """Start the next attempt of the oldest queued rollout for ``worker_id``; None when the queue is empty."""

    def lease_wait(self, worker_id: str, timeout: float, poll: float = 0.05) -> tuple[Rollout, Attempt] | None:
        """``lease``, waiting up to ``timeout`` seconds for a rollout to be queued (None when none came).

        The default leases again as soon as this store object was given work (``events``) and every ``poll``
        seconds for work queued by other processes. ``HttpStore`` asks its server to wait (one request).
        """
        deadline = time.monotonic() + timeout
        while True:
            seen = self.events.count("queued")
            got = self.lease(worker_id)
            left = deadline - time.monotonic()
            if got is not None or left <= 0:
                return got
            self.events.wait("queued", seen, min(poll, left))

    def live_attempt(self, rollout_id: str) -> LiveAttempt:
        """The rollout's status, resources version and live (running) attempt: what the gateway checks on every
        call. NotFound for an unknown rollout. The default reads ``get_rollout`` (and ``list_attempts`` while it
        runs); a store that keeps the live attempt on the rollout answers from one indexed row."""
        rollout = self.get_rollout(rollout_id)
        live = None
        if rollout.status == "running":
            attempts = self.list_attempts(rollout_id)
            live = next((a.attempt_id for a in reversed(attempts) if a.status == "running"), None)
        return LiveAttempt(rollout.status, rollout.resources_version, live)

    def live_attempt_now(self, rollout_id: str) -> LiveAttempt | None:
        """``live_attempt`` answered at once, without waiting on a lock, a disk or a network, so that an event loop
        may call it in place; None when this store cannot promise that now (the caller then reads ``live_attempt``
        off its loop). The default never can."""
        return None

    def attempt_key(self, attempt_id: str) -> str:
        """The key the agent of a leased attempt sends to the gateway (the ``api_key`` of the LLMs it is handed).

        An agl server with tokens hands it out with the lease (``HttpStore`` keeps it); a gateway without tokens
        takes any key, so a store without a server in front answers ``"agl"``.
        """
        return "agl"

    @abc.abstractmethod
    def heartbeat(self, attempt_id: str) -> bool:
        """Record liveness; False when the attempt is no longer running (reaped or finished): the worker should stop."""

    @abc.abstractmethod
    def complete_attempt(
        self, attempt_id: str, status: AttemptStatus, final_reward: float | None = None, error: str | None = None
    ) -> bool:
        """Finish the rollout's running attempt; False when it is no longer running (reaped or finished).

        ``succeeded`` / ``failed`` settle the rollout the same way: an agent that raised is not retried (it would
        raise again). ``lost`` (the worker could not reach agl's gateway or store, so the agent never had a fair
        run) ends the attempt as lost with ``error``; the rollout goes back to the queue while it has attempts left,
        else it fails with ``error`` and "no attempts left", the rule the reaper applies to a lost attempt.
        """

    @abc.abstractmethod
    def get_rollout(self, rollout_id: str) -> Rollout: ...

    @abc.abstractmethod
    def list_rollouts(
        self, status: str | None = None, mode: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Rollout]:
        """Newest first."""

    @abc.abstractmethod
    def get_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        """The rollouts with these ids, in the order asked."""

    @abc.abstractmethod
    def list_attempts(self, rollout_id: str) -> list[Attempt]: ...

    @abc.abstractmethod
    def cancel(self, rollout_ids: Sequence[str], reason: str | None = None) -> int:
        """Cancel rollouts that have not finished; returns how many changed. ``reason`` (why, e.g. the batch was
        interrupted; see ``check_cancel_reason``) is kept as the rollout's ``error`` and its running attempt's
        (which is ``cancelled`` without one), so the failure taxonomy reports the real cause."""

    @abc.abstractmethod
    def reap(self) -> int:
        """Mark stale attempts lost / over-long ones timed_out and requeue or fail their rollouts; returns count."""

    @abc.abstractmethod
    def wait(self, rollout_ids: Sequence[str], timeout: float, poll: float = 0.05) -> list[Rollout]:
        """Block until all these rollouts finished or ``timeout`` seconds passed; returns their current state."""

    def _wait_counting(
        self, rollout_ids: Sequence[str], timeout: float, poll: float, unfinished: Callable[[list[str]], int]
    ) -> list[Rollout]:
        """``wait`` for a store that can count unfinished rollouts cheaply (``unfinished(ids)``): wakes at once
        when a rollout finishes through this store object (``events``), else checks every ``poll`` seconds (another
        process may finish them); each check reaps and counts, and only the answer reads the rollouts whole."""
        ids = list(rollout_ids)
        deadline = time.monotonic() + timeout
        while True:
            seen = self.events.count("finished")
            self.reap()
            if not unfinished(ids):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.events.wait("finished", seen, min(poll, left))
        return self.get_rollouts(ids)

    # spans ----------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def add_spans(self, spans: Sequence[Span]) -> int:
        """Store spans atomically; spans whose id is already stored are skipped. Returns how many were new."""

    @abc.abstractmethod
    def query_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        """Spans matching every given filter, in the order the store received them (arrival order), skipping the
        first ``offset`` of them. Spans are only appended, so pages by ``offset`` read each span exactly once.

        Arrival order is the one order all spans of a rollout share without comparing the clocks of different hosts;
        ``agl.core.adapter.call_order`` refines it with the runner's sequence numbers.
        """

    # resources ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def publish_resources(self, resources: dict[str, Resource]) -> ResourceSet:
        """Publish a new immutable version (previous version + 1)."""

    @abc.abstractmethod
    def get_resources(self, version: int | None = None) -> ResourceSet:
        """A published version, or the latest when ``version`` is None. NotFound when there is none."""

    # records --------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def add_record(self, record: Record) -> None: ...

    @abc.abstractmethod
    def list_records(self, kind: str, key: str | None = None) -> list[Record]:
        """Records of a kind (optionally one key), oldest first."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default has nothing to release."""
