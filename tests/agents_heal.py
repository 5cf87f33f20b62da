"""Agents and integration hooks for the runner-healing tests (module level: runner processes import them)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

import agl


def _ask(resources: dict[str, Any], content: str) -> str:
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": content}])
    return reply.choices[0].message.content or ""


def _wait_for(path: Path, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def heal_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One agent, several behaviours, chosen by ``task["kind"]``.

    - ``calls``: two LLM calls, reward 1.
    - ``hang_once``: the first attempt writes its pid to ``task["marker"]`` after one call and hangs; later attempts
      finish.
    - ``call_after_go``: the first attempt writes ``task["ready"]``, waits for ``task["go"]`` (the test breaks the
      server in between), then calls the LLM, writing ``task["failed"]`` when that call raises; later attempts call
      at once.
    - ``big_message``: emits a message of ``task["size"]`` characters, then one LLM call.
    """
    kind = task["kind"]
    if kind == "calls":
        _ask(resources, "first call")
        _ask(resources, "second call")
        return 1.0
    if kind == "hang_once":
        marker = Path(task["marker"])
        _ask(resources, "first call")
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(600)
        _ask(resources, "second call")
        return 1.0
    if kind == "call_after_go":
        ready = Path(task["ready"])
        if not ready.exists():
            ready.write_text(str(os.getpid()))
            _wait_for(Path(task["go"]))
            try:
                _ask(resources, "after the pause")
            except Exception:
                Path(task["failed"]).write_text("the call failed")
                raise
        _ask(resources, "after the pause")
        return 1.0
    if kind == "big_message":
        agl.emit_message("x" * int(task["size"]))
        _ask(resources, "one call")
        return 1.0
    raise ValueError(f"heal_agent: unknown kind {kind!r}")


def activate_raises() -> Any:
    """An integration hook that raises when called."""
    raise RuntimeError("activate() of this integration is broken")


@contextlib.contextmanager
def activate_raises_on_enter() -> Iterator[None]:
    """An integration hook whose scope raises when entered."""
    raise RuntimeError("this integration's scope cannot be entered")
    yield
