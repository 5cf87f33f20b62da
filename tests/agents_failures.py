"""One agent that fails in the way its task names (module level: runners import it); for the failure taxonomy."""

from __future__ import annotations

import os
import time
from typing import Any

import openai

import agl


def failing_agent(task: dict[str, Any], resources: dict[str, Any]) -> float | None:
    """One LLM call through the gateway (the prompt names the kind: the fake LLM answers 500 to ``llm_error``),
    then succeed, raise, hang, die or return no reward as ``task["kind"]`` says."""
    kind = task["kind"]
    llm = resources["main_llm"]
    if kind == "capture_failure":  # calls the model directly, bypassing agl's gateway: nothing captured
        direct = openai.OpenAI(base_url=task["direct_url"], api_key="x", max_retries=0)
        direct.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        return 1.0
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"task {kind}"}])
    agl.emit_reward(0.5, name="step")
    if kind == "tool_error":
        with agl.span_scope("tool", "lookup", {"gen_ai.tool.call.arguments": '{"row": 7}'}):
            raise KeyError("no row 7")
    if kind == "agent_exception":
        raise ValueError("could not parse the answer")
    if kind in ("timeout", "cancelled"):  # ``cancelled``: hangs until the test interrupts its batch
        time.sleep(120)
    if kind == "lost_worker":
        os._exit(3)
    if kind == "missing_reward":
        return None
    return 1.0
