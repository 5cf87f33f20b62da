"""Agents the benchmarks run (module level, so runner processes can import them)."""

from __future__ import annotations

from typing import Any

import openai

import agl


def five_call_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Five sequential chat calls and one emitted reward."""
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    for step in range(5):
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"{task['i']}-{step}"}])
    agl.emit_reward(0.1)
    return 1.0
