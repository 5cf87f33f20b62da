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
from collections.abc import Iterable, Sequence
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
    pending: list[OtelSpan] = []
    written: list[OtelSpan] = []
    cache: dict[int, ResourceSet | None] = {}
    try:
        for rollout in select_rollouts(store, rollout_ids, status, mode, limit):
            spans = rollout_traces(store, rollout, cache)
            report.rollouts += 1
            report.traces += sum(1 for s in spans if s.parent_span_id is None)
            report.spans += len(spans)
            pending.extend(spans)
            if file is not None:
                written.extend(spans)
            if sender is not None and len(pending) >= batch_spans:
                sender.send(pending)
                pending = []
        if sender is not None:
            sender.send(pending)
    finally:
        if sender is not None:
            sender.close()
    if file is not None:
        Path(file).write_text(json.dumps(otlp_json(written, SERVICE_NAME), ensure_ascii=False), encoding="utf-8")
    return report


#: How far back (seconds) ``LiveExporter`` looks for new rollouts, so a store whose clock runs behind ours (a remote
#: database) does not hide rollouts from it.
CLOCK_MARGIN = 300.0


class LiveExporter:
    """Follows a store and exports each rollout once it finished (all its attempts), from one background thread.

    Rollouts already finished when it starts are not sent (``export_spans`` does that). It notices work by polling
    the store's new and unfinished rollouts every ``interval`` seconds (and at once on this store object's ``finished``
    events), so it works beside any writer of the same store. A failed send is logged and retried on the next poll.

    Example::

        exporter = LiveExporter(open_store("sqlite:///runs/agl.db"), "http://127.0.0.1:6006").start()
        ...  # a Trainer or agl server writes rollouts
        exporter.close()  # sends what finished meanwhile, then stops
    """

    def __init__(
        self, store: Store, endpoint: str, *, interval: float = 1.0, headers: dict[str, str] | None = None
    ) -> None:
        self.store = store
        self.interval = interval
        self.sender = OtlpSender(endpoint, headers)
        self.report = ExportReport()
        self._watch: set[str] = set()
        self._sent: set[str] = set()
        self._since = time.time() - CLOCK_MARGIN
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
        self._sent.update(r.rollout_id for r in self.store.get_rollouts(sorted(self._watch)) if r.finished)
        self._watch.difference_update(self._sent)
        self._thread.start()
        return self

    def _scan(self) -> None:
        """Watch every rollout created since the exporter started that it has not sent yet (newest first)."""
        offset = 0
        while True:
            batch = self.store.list_rollouts(limit=500, offset=offset)
            fresh = [r.rollout_id for r in batch if r.created_at >= self._since]
            self._watch.update(i for i in fresh if i not in self._sent)
            if len(fresh) < len(batch) or len(batch) < 500:
                return
            offset += 500

    def poll(self) -> ExportReport:
        """Export the watched rollouts that finished since the last poll; returns what this poll sent."""
        self._scan()
        sent = ExportReport()
        if not self._watch:
            return sent
        cache: dict[int, ResourceSet | None] = {}
        done = [r for r in self.store.get_rollouts(sorted(self._watch)) if r.finished]
        spans: list[OtelSpan] = []
        for rollout in done:
            traces = rollout_traces(self.store, rollout, cache)
            spans.extend(traces)
            sent.rollouts += 1
            sent.traces += sum(1 for s in traces if s.parent_span_id is None)
            sent.spans += len(traces)
        self.sender.send(spans)
        self._watch.difference_update(r.rollout_id for r in done)
        self._sent.update(r.rollout_id for r in done)
        self.report.add(sent)
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
