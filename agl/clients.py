"""OpenAI clients for an attempt's LLM resource that cost nothing to make: the HTTP client under them is shared.

An agent handed an ``LLM`` resource per rollout (its gateway URL and per-attempt key) naturally builds an OpenAI
client per rollout, and each new client builds an HTTP client with a TLS context of its own: about 20-25 ms of CPU,
a third of what a five-call rollout costs agl's runner (``benchmarks/bench_rollouts.py``). These helpers make the
OpenAI client per rollout, so its base URL and key are always the attempt's, over one HTTP client per process
(sync) or per event loop (async; agl's runner keeps one loop per runner process), whose connections are reused::

    async def agent(task, resources):
        client = agl.async_openai_client(resources["main_llm"])
        reply = await client.chat.completions.create(model=resources["main_llm"].model, messages=...)

Closing such a client (``with`` / ``close()``) leaves the shared HTTP client open for the next rollout. Other
keyword arguments (``max_retries``, ``timeout``, ...) go to the OpenAI client.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from agl.core.types import LLM

if TYPE_CHECKING:
    import openai

_lock = threading.Lock()
_sync: tuple[int, Any] | None = None
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, Any]] = weakref.WeakKeyDictionary()


@functools.cache
def _shared_classes() -> tuple[type, type]:
    """The OpenAI SDK's own HTTP client classes (its timeouts, limits and HTTP library), made so that an OpenAI
    client closing one leaves it open: it outlives every rollout."""
    import openai

    class SharedClient(openai.DefaultHttpxClient):
        def close(self) -> None:
            return None

    class SharedAsyncClient(openai.DefaultAsyncHttpxClient):
        async def aclose(self) -> None:
            return None

    return SharedClient, SharedAsyncClient


def _shared_sync() -> Any:
    global _sync
    with _lock:
        if _sync is None or _sync[0] != os.getpid():  # a forked child makes its own
            _sync = (os.getpid(), _shared_classes()[0]())
        return _sync[1]


def _shared_async() -> Any:
    loop = asyncio.get_running_loop()
    with _lock:
        held = _async.get(loop)
        if held is None or held[0] != os.getpid():
            held = (os.getpid(), _shared_classes()[1]())
            _async[loop] = held
        return held[1]


def _check(llm: Any) -> LLM:
    if not isinstance(llm, LLM):
        raise TypeError(f"expected the agl.LLM resource the agent was handed, got {type(llm).__name__}")
    return llm


def openai_client(llm: LLM, **kwargs: Any) -> openai.OpenAI:
    """A sync ``openai.OpenAI`` for ``llm`` (base URL and key), over this process's shared HTTP client."""
    import openai

    llm = _check(llm)
    return openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=_shared_sync(), **kwargs)


def async_openai_client(llm: LLM, **kwargs: Any) -> openai.AsyncOpenAI:
    """An ``openai.AsyncOpenAI`` for ``llm`` (base URL and key), over the running event loop's shared HTTP client;
    call it inside the loop that will use it (in the async agent)."""
    import openai

    llm = _check(llm)
    return openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=_shared_async(), **kwargs)
