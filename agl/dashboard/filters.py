"""Jinja2 filters the dashboard's templates format values with."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any


def when(ts: float | None) -> str:
    """A timestamp as local date and time; ``-`` for none."""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def seconds(value: float | None) -> str:
    """A duration, short: ``840 ms``, ``12.3 s``, ``4m 05s``; ``-`` for none."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    return f"{int(value // 60)}m {int(value % 60):02d}s"


def number(value: Any) -> str:
    """A reward or score with 4 significant digits; ``-`` for none."""
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


FILTERS: dict[str, Callable[..., str]] = {"when": when, "seconds": seconds, "number": number}
