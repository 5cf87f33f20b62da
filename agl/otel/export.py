"""Export stored rollouts to an OTLP receiver (Phoenix, Langfuse, MLflow, a collector) or to an OTLP JSON file.

``export_spans`` sends what is already stored (``agl export``); ``LiveExporter`` follows a store from a background
thread and sends each rollout once it finished (``agl server --otlp``). Both send one trace per attempt (see
``agl.otel.mapping``) over OTLP/HTTP protobuf with the OpenTelemetry SDK's own exporter, imported only here (extra
``otel``). A send the receiver refuses raises ``ExportFailed``: an export never reports success on partial data.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl.core.store.base import NotFound, Store
from agl.core.types import ResourceSet, Rollout
from agl.otel.mapping import OtelSpan, attempt_trace, otlp_json

log = logging.getLogger("agl.otel")

#: The ``service.name`` of exported spans (the project a receiver such as Phoenix files them under by default).
SERVICE_NAME = "agl"


class ExportFailed(RuntimeError):
    """The receiver did not take a batch of spans (unreachable, or it answered an error)."""


@dataclass
class ExportReport:
    """What one export sent: rollouts, traces (= attempts) and spans (root spans included)."""

    rollouts: int = 0
    traces: int = 0
    spans: int = 0

    def add(self, other: ExportReport) -> None:
        self.rollouts += other.rollouts
        self.traces += other.traces
        self.spans += other.spans


def _redacted_resources(store: Store, version: int, cache: dict[int, ResourceSet | None]) -> ResourceSet | None:
    """The resources version a rollout ran with, as any read of the server shows it (no API keys)."""
    from agl.core.server.auth import redact

    if version not in cache:
        try:
            cache[version] = redact(store.get_resources(version))
        except NotFound:
            cache[version] = None
    return cache[version]


def rollout_traces(
    store: Store, rollout: Rollout, cache: dict[int, ResourceSet | None] | None = None
) -> list[OtelSpan]:
    """Every attempt of ``rollout`` as OpenTelemetry spans (one trace per attempt)."""
    resources = _redacted_resources(store, rollout.resources_version, {} if cache is None else cache)
    spans: list[OtelSpan] = []
    for attempt in store.list_attempts(rollout.rollout_id):
        spans.extend(attempt_trace(rollout, attempt, store.query_spans(attempt_id=attempt.attempt_id), resources))
    return spans


def select_rollouts(
    store: Store,
    rollout_ids: Sequence[str] | None = None,
    status: str | None = None,
    mode: str | None = None,
    limit: int | None = None,
) -> Iterable[Rollout]:
    """The finished rollouts to export: those named (NotFound for an unknown id), else every finished rollout of the
    store matching ``status``/``mode``, newest first, at most ``limit``."""
    if rollout_ids:
        yield from store.get_rollouts(rollout_ids)  # NotFound names the unknown ids
        return
    page, offset, sent = 500, 0, 0
    while True:
        batch = store.list_rollouts(status=status, mode=mode, limit=page, offset=offset)
        for r in batch:
            if r.finished and (limit is None or sent < limit):
                sent += 1
                yield r
        if len(batch) < page or (limit is not None and sent >= limit):
            return
        offset += page


class OtlpSender:
    """Sends ``OtelSpan`` batches to ``{endpoint}/v1/traces`` (OTLP/HTTP protobuf) with the SDK's exporter."""

    def __init__(self, endpoint: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "agl's OpenTelemetry export needs opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http: "
                'pip install "agl[otel]"'
            ) from exc
        url = endpoint.rstrip("/")
        self.url = url if url.endswith("/v1/traces") else url + "/v1/traces"
        self._exporter = OTLPSpanExporter(endpoint=self.url, headers=headers, timeout=timeout)
        self._resource = Resource.create({"service.name": SERVICE_NAME})

    def send(self, spans: Sequence[OtelSpan]) -> None:
        """Send ``spans``; ``ExportFailed`` when the receiver did not take them (the SDK retries transient errors)."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        if not spans:
            return
        result = self._exporter.export([self._readable(s) for s in spans])
        if result is not SpanExportResult.SUCCESS:
            raise ExportFailed(f"the OTLP receiver at {self.url} did not take {len(spans)} spans (see the log above)")

    def _readable(self, s: OtelSpan) -> Any:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        def context(span_id: int) -> SpanContext:
            return SpanContext(s.trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))

        status = Status(StatusCode.ERROR, s.error) if s.error is not None else Status(StatusCode.OK)
        return ReadableSpan(
            name=s.name,
            context=context(s.span_id),
            parent=context(s.parent_span_id) if s.parent_span_id is not None else None,
            resource=self._resource,
            attributes=s.attributes,
            events=[Event(name, dict(attrs), timestamp=t) for name, t, attrs in s.events],
            kind=SpanKind.CLIENT if s.client else SpanKind.INTERNAL,
            status=status,
            start_time=s.start_ns,
            end_time=s.end_ns,
            instrumentation_scope=InstrumentationScope("agl"),
        )

    def close(self) -> None:
        self._exporter.shutdown()


def _chunks(
    store: Store, rollouts: Iterable[Rollout], batch_spans: int, cache: dict[int, ResourceSet | None]
) -> Iterator[tuple[list[Rollout], list[OtelSpan], ExportReport]]:
    """The traces of ``rollouts`` in chunks of about ``batch_spans`` spans (a rollout's traces always in one chunk),
    each with its rollouts and what it holds; read lazily, so one chunk is in memory at a time."""
    rows: list[Rollout] = []
    spans: list[OtelSpan] = []
    part = ExportReport()
    for rollout in rollouts:
        traces = rollout_traces(store, rollout, cache)
        rows.append(rollout)
        spans.extend(traces)
        part.add(ExportReport(1, sum(1 for s in traces if s.parent_span_id is None), len(traces)))
        if len(spans) >= batch_spans:
            yield rows, spans, part
            rows, spans, part = [], [], ExportReport()
    if rows:
        yield rows, spans, part


def export_spans(
    store: Store,
    endpoint: str | None = None,
    *,
    file: str | Path | None = None,
    rollout_ids: Sequence[str] | None = None,
    status: str | None = None,
    mode: str | None = None,
    limit: int | None = None,
    headers: dict[str, str] | None = None,
    batch_spans: int = 512,
) -> ExportReport:
    """Export finished rollouts of ``store`` as OpenTelemetry traces, to an OTLP/HTTP ``endpoint``
    (``http://host:port``; ``/v1/traces`` is added) and/or an OTLP JSON ``file``.

    Filters: ``rollout_ids`` (exactly those), else ``status`` / ``mode`` / ``limit`` (newest first). Spans are sent
    in batches of about ``batch_spans``, a rollout's traces always in one batch. Raises ``ExportFailed`` when the
    receiver refuses a batch (what was sent before stays sent: trace and span ids are stable, so exporting again
    sends the same spans, not copies).
    """
    if endpoint is None and file is None:
        raise ValueError("export_spans: give an OTLP endpoint, a file, or both")
    sender = OtlpSender(endpoint, headers) if endpoint is not None else None
    report = ExportReport()
    written: list[OtelSpan] = []
    try:
        for _, spans, part in _chunks(store, select_rollouts(store, rollout_ids, status, mode, limit), batch_spans, {}):
            report.add(part)
            if file is not None:
                written.extend(spans)
            if sender is not None:
                sender.send(spans)
    finally:
        if sender is not None:
            sender.close()
    if file is not None:
        Path(file).write_text(json.dumps(otlp_json(written, SERVICE_NAME), ensure_ascii=False), encoding="utf-8")
    return report


#: How far back (seconds) ``LiveExporter`` looks for new rollouts behind the newest it has seen, so writers whose
#: clocks disagree (processes, a remote database), or a rollout committed after a newer one, do not hide rollouts.
CLOCK_MARGIN = 300.0


class LiveExporter:
    """Follows a store and exports each rollout once it finished (all its attempts), from one background thread.

    Rollouts already finished when it starts are not sent (``export_spans`` does that). It notices work by polling
    the store's new and unfinished rollouts every ``interval`` seconds (and at once on this store object's ``finished``
    events), so it works beside any writer of the same store. Each poll reads only the rollouts created within
    ``clock_margin`` seconds of the newest one it has seen, and remembers the ids it sent only for that window, so a
    long run costs it no more per poll, nor memory, than its last ``clock_margin`` seconds of rollouts. It sends in
    chunks of about ``batch_spans`` spans (as ``export_spans`` does) and marks a chunk's rollouts sent once the
    receiver took it: a refused chunk is logged and sent again on the next poll, the chunks before it stay sent.

    Example::

        exporter = LiveExporter(open_store("sqlite:///runs/agl.db"), "http://127.0.0.1:6006").start()
        ...  # a Trainer or agl server writes rollouts
        exporter.close()  # sends what finished meanwhile, then stops
    """

    def __init__(
        self,
        store: Store,
        endpoint: str,
        *,
        interval: float = 1.0,
        headers: dict[str, str] | None = None,
        batch_spans: int = 512,
        clock_margin: float = CLOCK_MARGIN,
    ) -> None:
        self.store = store
        self.interval = interval
        self.batch_spans = batch_spans
        self.clock_margin = clock_margin
        self.sender = OtlpSender(endpoint, headers)
        self.report = ExportReport()
        self._watch: set[str] = set()  # rollouts to send once they finished, whatever their age
        self._sent: dict[str, float] = {}  # rollout id -> created_at, for the ones created since ``_since``
        self._since = time.time() - clock_margin
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agl-otlp-export", daemon=True)
        self._unsubscribe = store.events.subscribe(lambda event: self._wake.set() if event == "finished" else None)

    def start(self) -> LiveExporter:
        """Note the store's unfinished rollouts, then follow it from the background thread."""
        for status in ("queued", "running"):
            offset = 0
            while True:
                batch = self.store.list_rollouts(status=status, limit=500, offset=offset)
                self._watch.update(r.rollout_id for r in batch)
                if len(batch) < 500:
                    break
                offset += 500
        self._scan()
        for rollout in self.store.get_rollouts(sorted(self._watch)):
            if rollout.finished:
                self._watch.discard(rollout.rollout_id)
                self._sent[rollout.rollout_id] = rollout.created_at
        self._thread.start()
        return self

    def _scan(self) -> None:
        """Watch the rollouts created since ``_since`` that it has not sent (newest first), then move ``_since`` up
        to ``clock_margin`` before the newest seen and forget the sent ids older than that (never read again)."""
        offset = 0
        newest = self._since + self.clock_margin
        while True:
            batch = self.store.list_rollouts(limit=500, offset=offset)
            fresh = [r for r in batch if r.created_at >= self._since]
            for r in fresh:
                newest = max(newest, r.created_at)
                if r.rollout_id not in self._sent:
                    self._watch.add(r.rollout_id)
            if len(fresh) < len(batch) or len(batch) < 500:
                break
            offset += 500
        if newest - self.clock_margin > self._since:
            self._since = newest - self.clock_margin
            self._sent = {i: t for i, t in self._sent.items() if t >= self._since}

    def poll(self) -> ExportReport:
        """Export the watched rollouts that finished since the last poll; returns what this poll sent."""
        self._scan()
        sent = ExportReport()
        if not self._watch:
            return sent
        done = [r for r in self.store.get_rollouts(sorted(self._watch)) if r.finished]
        for rows, spans, part in _chunks(self.store, done, self.batch_spans, {}):
            self.sender.send(spans)  # refused: ExportFailed, and this chunk and the rest stay watched
            for r in rows:
                self._watch.discard(r.rollout_id)
                if r.created_at >= self._since:  # an older one is never scanned again
                    self._sent[r.rollout_id] = r.created_at
            sent.add(part)
            self.report.add(part)
        return sent

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            try:
                self.poll()
            except Exception as exc:  # keep following the store: the next poll sends it again
                log.warning("agl: OTLP export failed, retrying on the next poll: %s", exc)

    def close(self, timeout: float = 10.0) -> ExportReport:
        """Stop following the store after one last poll; returns everything it sent."""
        self._stop.set()
        self._wake.set()
        self._unsubscribe()
        if self._thread.is_alive():
            self._thread.join(timeout)
        try:
            self.poll()
        finally:
            self.sender.close()
        return self.report
