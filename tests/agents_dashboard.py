"""The agent of the dashboard's browser test (module level: runners import it): two named agents, a tool span and
an intermediate reward per rollout, scored on whether its prompt asks to think carefully."""

from __future__ import annotations

import json
from typing import Any

import openai

import agl


def prompt_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    llm, prompt = resources["main_llm"], resources["system_prompt"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    with agl.agent_scope("solver"):
        reply = client.chat.completions.create(
            model=llm.model,
            messages=[
                {"role": "system", "content": prompt.format(question=task["question"])},
                {"role": "user", "content": task["question"]},
            ],
        )
        answer = reply.choices[0].message.content or ""
        with agl.span_scope(
            "tool", "calculator", {"gen_ai.tool.call.arguments": json.dumps({"q": task["question"]})}
        ) as a:
            a["gen_ai.tool.call.result"] = str(len(answer))
        agl.emit_reward(0.25, name="tool_ok")
    with agl.agent_scope("checker"):
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"check: {answer}"}])
    return 1.0 if "carefully" in prompt.template else 0.0
