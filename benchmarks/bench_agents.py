"""Agents the benchmarks run (module level, so runner processes can import them)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai

import agl

#: Words of the prompt text; the fake LLM adds its two role markers, so each call has 512 prompt token ids.
PROMPT_WORDS = 510
#: Words (= token ids) of every fake completion.
COMPLETION_WORDS = 128
#: Sequential LLM calls per rollout.
CALLS = 5


def completion_text(_body: dict[str, Any] | None = None) -> str:
    """The fake LLM's reply to every call: ``COMPLETION_WORDS`` tokens."""
    return " ".join(f"out{i}" for i in range(COMPLETION_WORDS))


def prompt_text(task: int, step: int) -> str:
    """A prompt of ``PROMPT_WORDS`` words, different for every call."""
    return " ".join([f"t{task}s{step}", *(f"w{i}" for i in range(PROMPT_WORDS - 1))])


def five_call_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Five sequential chat calls and one emitted reward (sync)."""
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    for step in range(CALLS):
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"{task['i']}-{step}"}])
    agl.emit_reward(0.1)
    return 1.0


async def rollout_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The rollout benchmark's agent: async, ``CALLS`` sequential calls (512 prompt + 128 completion token ids each),
    one reward.

    With ``task["probe"]`` (a folder) it also calls the backend directly (``task["backend"]``) after each gateway
    call, with the body the gateway forwards, and writes both latency lists to ``<probe>/<i>.json``. The OpenAI
    client is made per rollout as most agents do (``task["client"] == "new"``, the default) or with
    ``agl.async_openai_client`` (``"shared"``: its HTTP client is shared); ``task["calls"] == 0`` makes no call at all
    (what agl's runner costs a rollout by itself).
    """
    llm = resources["main_llm"]
    if task.get("calls", CALLS) == 0:
        agl.emit_reward(1.0)
        return 1.0
    if task.get("client", "new") == "shared":
        client = agl.async_openai_client(llm, max_retries=0)
    else:
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    probe = task.get("probe")
    direct = openai.AsyncOpenAI(base_url=task["backend"], api_key="x", max_retries=0) if probe else None
    via_gateway: list[float] = []
    straight: list[float] = []
    try:
        for step in range(CALLS):
            messages = [{"role": "user", "content": prompt_text(task["i"], step)}]
            start = time.perf_counter()
            await client.chat.completions.create(model=llm.model, messages=messages)  # type: ignore[arg-type]
            via_gateway.append(time.perf_counter() - start)
            if direct is not None:
                start = time.perf_counter()
                await direct.chat.completions.create(
                    model=llm.model,
                    messages=messages,  # type: ignore[arg-type]
                    logprobs=True,
                    extra_body={"return_token_ids": True},
                )
                straight.append(time.perf_counter() - start)
    finally:
        await client.close()
        if direct is not None:
            await direct.close()
    if probe:
        Path(probe, f"{task['i']}.json").write_text(json.dumps({"gateway": via_gateway, "direct": straight}))
    agl.emit_reward(1.0)
    return 1.0
