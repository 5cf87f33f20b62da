"""Span ingest over HTTP on loopback: 4 KB spans in batches of 500 through ``HttpStore.add_spans`` into an
``AglServer`` over a temporary SQLite file. Prints ``http_ingest_spans_per_s=<number>``."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from agl.core.server import AglServer
from agl.core.store.http import HttpStore
from agl.core.store.sqlite import SqliteStore
from agl.core.types import Span

BATCH = 500
SPAN_BYTES = 4096


def make_spans(n: int, prefix: str = "bench") -> list[Span]:
    """``n`` spans of about ``SPAN_BYTES`` bytes of JSON each, spread over 100 rollouts."""
    probe = Span(rollout_id="ro-bench-000", attempt_id="at-bench-000", kind="llm", name="chat.completions")
    pad = "x" * max(0, SPAN_BYTES - len(probe.model_dump_json()) - 40)
    return [
        Span(
            rollout_id=f"ro-{prefix}-{i % 100:03d}",
            attempt_id=f"at-{prefix}-{i % 100:03d}",
            kind="llm",
            name="chat.completions",
            sequence=i,
            attributes={"gen_ai.output.messages": pad},
        )
        for i in range(n)
    ]


def run(n_spans: int = 20000) -> float:
    """Spans per second stored through HTTP (client serialisation, transfer, validation and commit included)."""
    spans = make_spans(n_spans)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        with AglServer(store) as server:
            client = HttpStore(server.url)
            client.add_spans(make_spans(BATCH, "warmup"))  # warm up the connection and code paths
            start = time.perf_counter()
            for i in range(0, n_spans, BATCH):
                client.add_spans(spans[i : i + BATCH])
            elapsed = time.perf_counter() - start
            client.close()
        stored = len(store.query_spans(rollout_id="ro-bench-000"))
        store.close()
    if stored != -(-n_spans // 100):
        raise RuntimeError(f"benchmark stored {stored} spans of rollout ro-bench-000, expected {-(-n_spans // 100)}")
    return n_spans / elapsed


if __name__ == "__main__":
    print(f"http_ingest_spans_per_s={run():.0f}")
