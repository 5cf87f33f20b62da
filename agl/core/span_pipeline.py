"""The one road every span takes to the store: the runner's ``SpanSink`` and the server's gateway both use it.

Concurrency model: producers call ``put`` from any thread (or an event loop: ``put`` never waits on the store); one
daemon thread per pipeline takes what is pending and writes it to the target (a ``Store``, or anything with
``add_spans``), one batch at a time, oldest first. What a producer may rely on:

- **Bounded.** At most ``max_pending`` spans (and ``max_pending_bytes`` of their JSON) wait. When full, ``put``
  blocks the producer up to ``block`` seconds for room, then drops the span and counts it (``block=0``: drop at once).
- **Batches fit.** A batch holds at most ``max_batch`` spans and ``max_batch_bytes`` of JSON, so it never exceeds a
  server's body limit; a single span over that limit is refused by ``put``.
- **On time.** A span waits at most ``interval`` seconds before its batch is written; ``interval=0`` is group commit:
  the thread writes whatever is pending as soon as anything is, and spans put during a write share the next one.
- **Retried, then counted.** A failed write is retried with exponential backoff, unless the target raised a
  ``StoreError``: a store retries what can be retried itself (``HttpStore`` for ``retry_for`` seconds, SQLite for its
  busy timeout), so its error is final and not retried again on top. A batch that still fails is dropped, its spans
  counted in ``dropped`` and the error kept in ``last_error``. Nothing is dropped silently.
- **Acknowledged means stored.** ``put`` returns a future that completes when the span is stored, or fails with
  ``SpansNotStored`` (``add`` queues without one); ``flush`` waits until every span queued before it is settled.
- **JSON-safe at the call.** ``put`` serialises the span (types already refuse NaN, ±inf, out-of-range integers and
  non-JSON attribute values), so a bad value raises in the code that made it and never poisons a batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError
from tenacity import Retrying, retry_if_not_exception_type, stop_after_attempt, wait_exponential

from agl.core.store.base import StoreError
from agl.core.types import Span

log = logging.getLogger(__name__)

_SPAN = TypeAdapter(Span)


class SpanTarget(Protocol):
    """Where a pipeline writes its batches (every ``Store`` is one)."""

    def add_spans(self, spans: list[Span]) -> int: ...


class SpansNotStored(Exception):
    """Spans that could not be stored: ``dropped`` of them, the last failure in ``cause``."""

    def __init__(self, dropped: int, cause: BaseException | None) -> None:
        why = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"{dropped} span{'s' if dropped != 1 else ''} could not be stored{why}")
        self.dropped = dropped
        self.cause = cause


class PipelineFull(Exception):
    """The pipeline had no room for a span within the time ``put`` may block."""


@dataclass(slots=True)
class _Entry:
    span: Span
    size: int
    arrived: float
    done: Future[None] | None  # only for producers that wait for the write (``put``)

    def settle(self, failure: BaseException | None = None) -> None:
        if self.done is not None:
            if failure is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(failure)


class SpanPipeline:
    """Batches spans to a target from one background thread; see the module docstring for the guarantees.

    ``attempts`` writes of a batch are tried (one when the target raises ``StoreError``), ``backoff`` seconds apart
    at first and doubling; ``name`` names the thread.
    """

    def __init__(
        self,
        target: SpanTarget,
        *,
        interval: float = 0.2,
        max_batch: int = 256,
        max_batch_bytes: int = 16 * 2**20,
        max_pending: int = 10_000,
        max_pending_bytes: int = 256 * 2**20,
        block: float = 5.0,
        attempts: int = 4,
        backoff: float = 0.1,
        name: str = "agl-span-pipeline",
    ) -> None:
        if interval < 0 or block < 0 or backoff < 0:
            raise ValueError("SpanPipeline: interval, block and backoff must be >= 0")
        if min(max_batch, max_pending, attempts) < 1 or max_batch_bytes < 64 or max_pending_bytes < max_batch_bytes:
            raise ValueError(
                "SpanPipeline: max_batch, max_pending and attempts must be >= 1, max_batch_bytes >= 64 and "
                "max_pending_bytes >= max_batch_bytes"
            )
        self._target = target
        self._interval = interval
        self._max_batch = max_batch
        self._max_batch_bytes = max_batch_bytes
        self._max_pending = max_pending
        self._max_pending_bytes = max_pending_bytes
        self._block = block
        self._attempts = attempts
        self._backoff = backoff
        lock = threading.Lock()
        self._work = threading.Condition(lock)  # the writer waits here for spans
        self._room = threading.Condition(lock)  # producers wait here for room
        self._settle = threading.Condition(lock)  # flushes wait here for writes to settle
        self._queue: deque[_Entry] = deque()
        self._queued_bytes = 0
        self._enqueued = 0  # spans ever queued ...
        self._settled = 0  # ... and how many of them, oldest first, were stored or dropped
        self._flush_to = 0  # a flush waits for the first this-many queued spans: write them without lingering
        self._dropped = 0
        self._last_error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # producers --------------------------------------------------------------------------------------------------
    def put(self, span: Span) -> Future[None]:
        """Queue ``span``; the returned future completes once it is stored (or fails with ``SpansNotStored``).

        Raises ``TypeError`` when the span cannot be written as JSON and ``ValueError`` when it alone is over the
        batch size limit: the caller made a span that can never be stored.
        """
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()  # a waiter giving up must not cancel the write
        self._enqueue(span, done)
        return done

    def add(self, span: Span) -> None:
        """Queue ``span`` like ``put``, for a producer that does not wait for each write (``flush`` waits for all)."""
        self._enqueue(span, None)

    def _enqueue(self, span: Span, done: Future[None] | None) -> None:
        try:
            size = len(_SPAN.dump_json(span))
        except PydanticSerializationError as exc:
            raise TypeError(f"span {span.name!r} ({span.kind}) cannot be written as JSON: {exc}") from None
        if size + 2 > self._max_batch_bytes:
            raise ValueError(
                f"span {span.name!r} ({span.kind}) is {size} bytes as JSON, over the batch limit of "
                f"{self._max_batch_bytes} bytes; store large payloads elsewhere and reference them"
            )
        entry = _Entry(span, size + 1, time.monotonic(), done)  # +1: the comma between spans of a batch
        with self._work:
            if not self._closed and not self._has_room(entry.size):
                self._room.wait_for(lambda: self._closed or self._has_room(entry.size), self._block)
            if not self._closed:
                if not self._has_room(entry.size):
                    self._count_drop(1, PipelineFull(f"{len(self._queue)} spans were already waiting to be stored"))
                    entry.settle(SpansNotStored(1, self._last_error))
                    return
                self._queue.append(entry)
                self._queued_bytes += entry.size
                self._enqueued += 1
                if len(self._queue) == 1 or self._batch_ready():
                    self._work.notify()
                return
        self._write([entry])  # queued after close: written through, so a straggler is not lost

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every span put so far is stored or dropped; False when ``timeout`` seconds passed first."""
        with self._work:
            target = self._enqueued
            if self._settled >= target:
                return True
            self._flush_to = max(self._flush_to, target)
            self._work.notify()
            return self._settle.wait_for(lambda: self._settled >= target, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Write what is pending, then stop the thread; False when it had not finished after ``timeout`` seconds."""
        with self._work:
            self._closed = True
            self._work.notify()
            self._room.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def dropped(self) -> int:
        """How many spans could not be stored (refused for lack of room, or their batch failed every attempt)."""
        return self._dropped

    @property
    def last_error(self) -> BaseException | None:
        """Why the most recent span was dropped."""
        return self._last_error

    @property
    def pending(self) -> int:
        """Spans waiting to be written."""
        return len(self._queue)

    # the writer thread ------------------------------------------------------------------------------------------
    def _has_room(self, size: int) -> bool:
        return len(self._queue) < self._max_pending and self._queued_bytes + size <= self._max_pending_bytes

    def _batch_ready(self) -> bool:
        return len(self._queue) >= self._max_batch or self._queued_bytes >= self._max_batch_bytes

    def _due(self) -> float:
        """Seconds until the oldest pending span must be written (0: now)."""
        if self._closed or self._flush_to > self._settled or self._batch_ready():
            return 0.0
        return self._queue[0].arrived + self._interval - time.monotonic()

    def _take(self) -> list[_Entry]:
        batch = [self._queue.popleft()]
        size = batch[0].size + 1
        while self._queue and len(batch) < self._max_batch and size + self._queue[0].size <= self._max_batch_bytes:
            entry = self._queue.popleft()
            batch.append(entry)
            size += entry.size
        self._queued_bytes -= size - 1
        self._room.notify_all()
        return batch

    def _run(self) -> None:
        while True:
            with self._work:
                while True:
                    if self._queue:
                        due = self._due()
                        if due <= 0:
                            break
                        self._work.wait(due)
                    elif self._closed:
                        return
                    else:
                        self._work.wait()
                batch = self._take()
            self._write(batch)
            with self._work:
                self._settled += len(batch)
                self._settle.notify_all()

    def _write(self, batch: list[_Entry]) -> None:
        spans = [entry.span for entry in batch]
        try:
            for attempt in Retrying(
                retry=retry_if_not_exception_type(StoreError),
                stop=stop_after_attempt(self._attempts),
                wait=wait_exponential(multiplier=self._backoff, max=5.0),
                reraise=True,
            ):
                with attempt:
                    self._target.add_spans(spans)
        except Exception as exc:
            log.error("agl: %d spans could not be stored: %s", len(batch), exc)
            with self._work:
                self._count_drop(len(batch), exc)
            failure = SpansNotStored(len(batch), exc)
            for entry in batch:
                entry.settle(failure)
            return
        for entry in batch:
            entry.settle()

    def _count_drop(self, count: int, error: BaseException) -> None:
        """Record dropped spans (called with the lock held)."""
        self._dropped += count
        self._last_error = error
