"""Plain-OpenAI-client agents used by the end-to-end tests (module level: runners import them)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

import agl


def _client(resources: dict[str, Any]) -> tuple[openai.OpenAI, str]:
    llm = resources["main_llm"]
    return openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0), llm.model


def _ask(client: openai.OpenAI, model: str, content: str, stream: bool) -> str:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": content}]
    if not stream:
        r = client.chat.completions.create(model=model, messages=messages)
        return r.choices[0].message.content or ""
    parts = []
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def two_call_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Draft, reward the draft, then answer; streams both calls when the task says so."""
    client, model = _client(resources)
    draft = _ask(client, model, f"draft: {task['question']}", task.get("stream", False))
    agl.emit_reward(0.2, name="drafted")
    final = _ask(client, model, f"final: {task['question']} (draft was {draft})", task.get("stream", False))
    return 1.0 if task["answer"] in final else 0.0


async def async_two_call_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The same agent written with the async client."""
    llm = resources["main_llm"]
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    return await _draft_and_answer(client, llm.model, task)


async def _draft_and_answer(client: openai.AsyncOpenAI, model: str, task: dict[str, Any]) -> float:
    """Draft, reward the draft, answer: the final reward."""
    r1 = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"draft: {task['question']}"}]
    )
    agl.emit_reward(0.2, name="drafted")
    r2 = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"final: {task['question']} {r1.choices[0].message.content}"}],
    )
    return 1.0 if task["answer"] in (r2.choices[0].message.content or "") else 0.0


def bypass_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Calls the model at a hard-coded URL instead of the resource it was handed: nothing is captured."""
    client = openai.OpenAI(base_url=task["direct_url"], api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return 1.0


def crashing_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Fails on odd tasks after one LLM call; succeeds on even ones."""
    client, model = _client(resources)
    _ask(client, model, f"q{task['i']}", False)
    if task["i"] % 2:
        raise ValueError(f"bad input {task['i']}")
    return 1.0


def dies_once_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """First attempt: one LLM call, then hang until killed (the test SIGKILLs this runner). Later attempts finish."""
    client, model = _client(resources)
    marker = Path(task["marker"])
    _ask(client, model, "first call", False)
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(120)
    _ask(client, model, "second call", False)
    return 1.0


def dying_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Kills its own runner process at once, every time (a runner pool cannot be kept alive with it)."""
    os._exit(3)


async def shared_client_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """``async_two_call_agent`` with the client from ``agl.async_openai_client``, closed at the end as tidy agents
    do; reports the id of the HTTP client under it and leaves a task running (the runner must cancel it)."""
    llm = resources["main_llm"]
    async with agl.async_openai_client(llm, max_retries=0) as client:
        reward = await _draft_and_answer(client, llm.model, task)
        agl.emit_object("client", {"http_client": id(client._client), "pid": os.getpid()})
    asyncio.get_running_loop().create_task(_left_running(Path(task["marks"]) / task["id"]))
    await asyncio.sleep(0)
    return reward


async def _left_running(mark: Path) -> None:
    """A task an agent forgot: writes ``<mark>.cancelled`` when its rollout's end cancels it."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        mark.with_suffix(".cancelled").write_text("cancelled")
        raise


def shared_sync_client_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """``two_call_agent`` with the client from ``agl.openai_client``."""
    llm = resources["main_llm"]
    with agl.openai_client(llm, max_retries=0) as client:
        draft = _ask(client, llm.model, f"draft: {task['question']}", task.get("stream", False))
        agl.emit_reward(0.2, name="drafted")
        final = _ask(client, llm.model, f"final: {task['question']} (draft was {draft})", task.get("stream", False))
    return 1.0 if task["answer"] in final else 0.0
