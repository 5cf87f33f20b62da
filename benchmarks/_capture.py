"""Timing scaffolding shared by the capture-overhead benchmarks (``bench_capture_*.py``).

A benchmark times blocks of calls to a framework app, each one LLM call against the fake LLM (instant replies), with
capture on and with it off. :func:`compare` alternates the two arms round by round, the order swapped every round so
drift hits both alike; the overhead is the difference of the median per-call times. The headline figure,
``<name>_overhead_ms_per_call``, is CPU time of the calling thread (the framework and agl's capture run there; the
fake LLM answers from other threads), which stays stable on a loaded machine; wall-clock figures are reported too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agl.core.emit import RolloutContext, SpanSink
from agl.core.types import Span

Sample = tuple[float, float]
"""(wall seconds, CPU seconds of the calling thread) per call, over one block of calls."""


class SpanCounter:
    """The rollout a benchmark's calls run in: its spans go through a sink to here, where they are only counted."""

    def __init__(self) -> None:
        self.spans = 0
        self.sink = SpanSink(self)
        self.context = RolloutContext("ro-bench", "at-bench", self.sink)

    def add_spans(self, spans: list[Span]) -> int:
        self.spans += len(spans)
        return len(spans)

    def close(self) -> int:
        """Flush and close the sink; how many spans were recorded in all."""
        self.sink.close()
        return self.spans


def time_calls(call: Callable[[int], object], n: int) -> Sample:
    """Per-call times of ``call(0)`` … ``call(n - 1)``."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(n):
        call(i)
    return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


async def time_async_calls(call: Callable[[int], Awaitable[object]], n: int) -> Sample:
    """Per-call times of awaiting ``call(0)`` … ``call(n - 1)`` (the event loop runs in the calling thread)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(n):
        await call(i)
    return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


def compare(
    block: Callable[[bool, int], Sample], rounds: int, calls_per_block: int, warmup: int
) -> tuple[list[Sample], list[Sample]]:
    """Samples with capture on and with it off: ``block(capture, n)`` times ``n`` calls. One untimed block of
    ``warmup`` calls per arm, then ``rounds`` rounds of one block per arm, the order swapped every round."""
    for capture in (True, False):
        block(capture, warmup)
    samples: dict[bool, list[Sample]] = {True: [], False: []}
    for r in range(rounds):
        for capture in (True, False) if r % 2 == 0 else (False, True):
            samples[capture].append(block(capture, calls_per_block))
    return samples[True], samples[False]


def report(name: str, samples: tuple[list[Sample], list[Sample]], spans: int) -> dict[str, Any]:
    """What a benchmark's ``run()`` returns, from :func:`compare`'s samples and the spans recorded."""
    with_capture, without = samples

    def median_ms(arm: list[Sample], k: int) -> float:
        return statistics.median(s[k] for s in arm) * 1e3

    return {
        f"{name}_overhead_ms_per_call": median_ms(with_capture, 1) - median_ms(without, 1),
        f"{name}_overhead_wall_ms_per_call": median_ms(with_capture, 0) - median_ms(without, 0),
        f"{name}_call_cpu_ms_with_capture": median_ms(with_capture, 1),
        f"{name}_call_cpu_ms_without_capture": median_ms(without, 1),
        f"{name}_spans_recorded": spans,
    }


def print_report(results: dict[str, Any]) -> None:
    """``key=value`` lines, as a benchmark run as a script prints them."""
    for key, value in results.items():
        print(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")
