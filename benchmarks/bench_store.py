"""Spans/s into the embedded SQLite store: 4 KB spans, batches of 500 (the runner's and gateway's write path)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from agl.core.store.sqlite import SqliteStore
from agl.core.types import Span


def make_spans(n: int, rollout_id: str = "ro-bench", payload: int = 4096) -> list[Span]:
    """``n`` spans of about ``payload`` bytes each, shaped like real llm spans."""
    text = "x" * (payload - 300)
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id="at-bench",
            sequence=i,
            kind="llm",
            name="chat.completions",
            agent="writer",
            attributes={"gen_ai.output.messages": [{"role": "assistant", "content": text}], "i": i},
        )
        for i in range(n)
    ]


def run(n_spans: int = 50_000, batch: int = 500) -> float:
    spans = make_spans(n_spans)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        start = time.perf_counter()
        for i in range(0, n_spans, batch):
            store.add_spans(spans[i : i + batch])
        elapsed = time.perf_counter() - start
        store.close()
    return n_spans / elapsed


if __name__ == "__main__":
    print(f"sqlite_ingest_spans_per_s={run():.0f}")
