"""JSON data that round-trips: the check every stored value passes, and JSON-safe copies of arbitrary objects.

agl stores spans, tasks and records as JSON and must be able to read back whatever it accepted. ``check_json`` is the
rule (plain JSON types only, finite floats, integers in the signed 64-bit range, text that is valid Unicode, nesting
at most ``MAX_JSON_DEPTH`` levels); the types, the server and the emit API all use it. ``jsonable`` turns anything
into a value that passes it, for places that record what they were handed (integrations, ``emit_object``).
``one_line`` shows any value on one line, for the CLI and the dashboard.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Mapping
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: The deepest nesting of objects and arrays a stored JSON value may have.
MAX_JSON_DEPTH = 64
#: ``jsonable`` stops walking here (a ``repr`` stands in below), well inside ``MAX_JSON_DEPTH``.
_JSONABLE_DEPTH = 32


class UnsafeJson(ValueError):
    """A value that is not JSON data agl can store and read back: ``path`` says where, ``problem`` what is wrong.

    ``path`` is relative to the value checked (``["gen_ai.input.messages"][0].content``; empty for the value itself);
    ``too_deep`` marks the nesting limit, which the server answers with 400 rather than 422.
    """

    def __init__(self, problem: str, path: str = "", *, too_deep: bool = False) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.problem = problem
        self.path = path
        self.too_deep = too_deep


class _Unsafe(Exception):
    """Raised inside the walk; each level adds its key on the way out, so paths cost nothing unless one is built."""

    def __init__(self, problem: str, too_deep: bool = False) -> None:
        self.problem = problem
        self.too_deep = too_deep
        self.parts: list[str] = []


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ``UnsafeJson`` at the first part of ``value`` that would not survive a store-and-read-back as JSON.

    Allowed: dict (string keys), list, tuple, str (no lone surrogates), bool, None, int within 64 bits, finite float,
    nested at most ``max_depth`` levels. Lists of plain numbers or ASCII strings are checked at C speed, so the token
    id and logprob lists of an ``llm`` span cost little.
    """
    try:
        _check(value, max_depth)
    except _Unsafe as exc:
        parts = exc.parts[::-1]
        path = "".join(parts) if len(parts) <= 12 else "".join(parts[:8]) + "…" + "".join(parts[-2:])
        raise UnsafeJson(exc.problem, path, too_deep=exc.too_deep) from None


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> UnsafeJson | None:
    """What ``check_json`` would raise for ``value``, or None when it is safe."""
    try:
        check_json(value, max_depth)
    except UnsafeJson as exc:
        return exc
    return None


def _key(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{json.dumps(key)}]"


def _check(value: Any, room: int) -> None:
    kind = type(value)
    if kind is str:
        if not value.isascii():
            _check_text(value)
    elif kind is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise _Unsafe(f"an integer of {value.bit_length()} bits is outside the signed 64-bit range")
    elif kind is float:
        if not math.isfinite(value):
            raise _Unsafe(f"{value} is not a finite number (JSON has no NaN or Infinity)")
    elif value is None or kind is bool:
        return
    elif kind is dict or isinstance(value, dict):
        if room <= 0:
            raise _Unsafe(f"nested deeper than {MAX_JSON_DEPTH} levels", too_deep=True)
        for key, item in value.items():
            if type(key) is not str:
                raise _Unsafe(f"key {key!r} is of type {type(key).__name__}, not a string")
            try:
                if not key.isascii():
                    _check_text(key)
                _check(item, room - 1)
            except _Unsafe as exc:
                exc.parts.append(_key(key))
                raise
    elif kind is list or kind is tuple or isinstance(value, list | tuple):
        if room <= 0:
            raise _Unsafe(f"nested deeper than {MAX_JSON_DEPTH} levels", too_deep=True)
        if _flat_and_safe(value):
            return
        for index, item in enumerate(value):
            try:
                _check(item, room - 1)
            except _Unsafe as exc:
                exc.parts.append(f"[{index}]")
                raise
    elif isinstance(value, str | int | float):  # subclasses (enums): checked as their base type
        _check(_base(value), room)
    else:
        raise _Unsafe(f"a value of type {type(value).__name__} is not JSON data")


def _base(value: str | int | float) -> str | int | float:
    if isinstance(value, str):
        return str.__str__(value)
    return int(value) if isinstance(value, int) else float(value)


def _flat_and_safe(items: list[Any] | tuple[Any, ...]) -> bool:
    """True when C-speed checks prove ``items`` plain, safe scalars of one kind; False means: check one by one."""
    if not items:
        return True
    kind = type(items[0])
    try:
        if kind is int:
            array("q", items)  # every item an integer that fits in 64 bits, or TypeError / OverflowError
            return True
        if kind is str:
            return all(map(str.isascii, items))  # TypeError at the first item that is not text
        if kind is float:
            return set(map(type, items)) == {float} and math.isfinite(sum(items))  # NaN and ±inf propagate
    except (TypeError, OverflowError):
        return False
    return False


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = f"a lone surrogate {text[exc.start]!r} at position {exc.start}"
        raise _Unsafe(f"text has {where}: not valid Unicode") from None


def jsonable(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` that passes ``check_json``: mappings and sequences walked, pydantic models dumped, numbers
    JSON cannot hold (NaN, ±inf, integers beyond 64 bits) and anything else written as text."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = str.__str__(value)
        return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, int):
        number = int(value)
        return number if INT64_MIN <= number <= INT64_MAX else _int_text(number)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if depth >= _JSONABLE_DEPTH:
        return jsonable(repr(value))
    if isinstance(value, Mapping):
        return {jsonable(str(k)): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v, depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump(mode="json"), depth + 1)
        except Exception:
            return jsonable(repr(value))
    return jsonable(repr(value))


def _int_text(number: int) -> str:
    try:
        return str(number)
    except ValueError:  # more digits than Python converts to text
        return f"<integer of {number.bit_length()} bits>"


def parsed_or_text(value: Any) -> Any:
    """A JSON text parsed (tool arguments, attributes traced as JSON strings); anything else, or a text that does not
    parse, as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def one_line(value: Any, width: int = 160) -> str:
    """``value`` (text, or anything JSON can show) on one line of at most ``width`` characters (cut with "…")."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
