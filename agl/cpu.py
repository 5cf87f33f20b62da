"""CPU cores and torch's intra-op threads: one home for how many threads this process's torch work uses.

torch's intra-op thread count set from the main thread is the process's default (threads started later inherit it).
A local policy server sets it to half the usable cores (``agl.serving``): while it decodes, the runners, the gateway
and the store need the rest. Training phases that run while nothing else of the run computes (an RL update between
rounds, a warm start) take every core for their duration with ``all_cores``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@contextmanager
def all_cores() -> Iterator[None]:
    """Run the block's torch work with one intra-op thread per usable core, then restore the previous count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(usable_cores())
    try:
        yield
    finally:
        torch.set_num_threads(before)
