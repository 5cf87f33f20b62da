"""``LiveExporter`` over a long run, against a real OTLP/HTTP receiver on 127.0.0.1 (a plain HTTP server that decodes
the OTLP protobuf requests the OpenTelemetry SDK's exporter sends, and refuses what the test tells it to): every
rollout reaches the receiver exactly once, in chunks, a refused chunk is sent again on the next poll, and what the
exporter remembers stays bounded however many rollouts it sent."""

from __future__ import annotations

import gzip
import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agl.core.store.sqlite import SqliteStore
from agl.core.types import PromptTemplate, RolloutRequest, Span
from agl.otel.export import ExportFailed, LiveExporter, export_spans
from agl.otel.mapping import ATTR_ROLLOUT_ID


class Receiver:
    """What the OTLP receiver took (root spans per rollout, spans per request) and what it refuses: requests of
    more than ``max_spans`` spans (413), and one request (400) once ``refuse_after`` more requests were taken."""

    def __init__(self, max_spans: int) -> None:
        self.max_spans = max_spans
        self.refuse_after: int | None = None
        self.roots: Counter[str] = Counter()
        self.requests: list[int] = []
        self.refused: list[int] = []
        self.lock = threading.Lock()

    def take(self, body: bytes) -> int:
        """The HTTP status for one OTLP request ``body``; keeps its spans when it answers 200."""
        request = ExportTraceServiceRequest.FromString(body)
        spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        with self.lock:
            if len(spans) > self.max_spans:
                self.refused.append(len(spans))
                return 413
            if self.refuse_after is not None:
                self.refuse_after -= 1
                if self.refuse_after < 0:
                    self.refuse_after = None
                    self.refused.append(len(spans))
                    return 400
            self.requests.append(len(spans))
            for span in spans:
                if not span.parent_span_id:
                    attrs = {kv.key: kv.value.string_value for kv in span.attributes}
                    self.roots[attrs[ATTR_ROLLOUT_ID]] += 1
            return 200


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    """A receiver taking at most 8 spans per request, served on a free port of 127.0.0.1."""
    got = Receiver(max_spans=8)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            status = got.take(body) if self.path == "/v1/traces" else 404
            self.send_response(status)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(5)


def _finish(store: SqliteStore, n: int) -> list[str]:
    """Enqueue ``n`` rollouts and run each to the end as a runner does: one attempt, two spans (3 OTel spans with
    the attempt's root)."""
    ids = [r.rollout_id for r in store.enqueue([RolloutRequest(task=i) for i in range(n)])]
    for _ in range(n):
        leased = store.lease("w")
        assert leased is not None
        rollout, attempt = leased
        store.add_spans(
            [
                Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, kind="tool", name=f"s{i}")
                for i in (1, 2)
            ]
        )
        store.complete_attempt(attempt.attempt_id, "succeeded", final_reward=1.0)
    return ids


def test_live_export_sends_each_rollout_once_in_chunks_retries_a_refused_chunk_and_forgets_old_ids(
    tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    got, url = receiver
    path = tmp_path / "agl.db"
    writer = SqliteStore(path)  # another writer of the store: the exporter learns of its rollouts only by polling
    writer.publish_resources({"p": PromptTemplate(template="{q}")})
    before = _finish(writer, 2)
    store = SqliteStore(path)
    # clock_margin 0: ids older than the newest rollout seen are forgotten at once (300 s in use)
    exporter = LiveExporter(store, url, interval=3600, batch_spans=6, clock_margin=0.0).start()
    try:
        sent: list[str] = []
        for round_ in range(6):
            ids = _finish(writer, 5)  # 15 spans: more than the receiver takes in one request
            expect = 5
            if round_ == 1:
                got.refuse_after = 1  # the receiver takes this round's first chunk, refuses the second once
                with pytest.raises(ExportFailed):
                    exporter.poll()
                assert got.refused == [6]
                taken = [i for i in ids if got.roots[i]]
                assert len(taken) == 2, "the chunk taken before the refusal stays sent"
                sent += taken
                expect = 3
            report = exporter.poll()
            assert report.rollouts == expect and report.spans == 3 * expect, (round_, report)
            sent += [i for i in ids if i not in sent]
            assert {i: got.roots[i] for i in sent} == {i: 1 for i in sent}, "every rollout once"
            assert len(exporter._sent) <= 5, f"remembers the last round's ids only, not all {len(sent)}"
        assert exporter.poll().rollouts == 0
        assert not any(got.roots[i] for i in before), "finished before the exporter started: not its to send"
        assert max(got.requests) <= 8 and len(got.refused) == 1
    finally:
        exporter.close()
        store.close()
        writer.close()


def test_export_spans_sends_chunks_the_receiver_takes_and_writes_every_span_to_the_file(
    tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    got, url = receiver
    store = SqliteStore(tmp_path / "agl.db")
    store.publish_resources({"p": PromptTemplate(template="{q}")})
    ids = _finish(store, 7)
    report = export_spans(store, url, file=tmp_path / "out.json", batch_spans=6)
    assert (report.rollouts, report.traces, report.spans) == (7, 7, 21)
    assert dict(got.roots) == {i: 1 for i in ids} and got.requests == [6, 6, 6, 3] and not got.refused
    written = json.loads((tmp_path / "out.json").read_text())
    assert sum(len(ss["spans"]) for rs in written["resourceSpans"] for ss in rs["scopeSpans"]) == 21
    store.close()
