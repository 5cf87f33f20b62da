"""Waiting on what a test can observe, instead of sleeping for a while and hoping it happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], limit: float, what: str, pause: float = 0.02) -> T:
    """Call ``predicate`` until it returns something true, and return that; AssertionError naming ``what`` after
    ``limit`` seconds. The limit only stops a hang: a test waits on an event that is certain to come, so the
    test's outcome never depends on how long it took."""
    deadline = time.monotonic() + limit
    while not (got := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:g}s waiting for {what}")
        time.sleep(pause)
    return got
