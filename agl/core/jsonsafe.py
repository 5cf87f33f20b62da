"""JSON-safe copies of arbitrary objects for span attributes (stored as JSON), for the core and the integrations."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of ``value``: mappings and sequences walked, pydantic models dumped, the rest ``repr``'d."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth > 32:
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v, depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump(mode="json"), depth + 1)
        except Exception:
            return repr(value)
    return repr(value)
