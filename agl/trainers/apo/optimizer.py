"""The optimizer LLM: critique a candidate from its failures, then ask for edited prompts. One synchronous client.

The endpoint is any OpenAI-compatible server named by an ``LLM`` resource; it is called directly (no gateway, no
spans, no rollouts). The resource's ``sampling`` params are sent as defaults; ``temperature``/``max_tokens`` from the
config override them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agl.core.types import LLM, PromptTemplate, Trajectory
from agl.trainers.apo.config import APOConfig
from agl.trainers.apo.edits import parse_edits
from agl.trainers.apo.feedback import render_failures
from agl.trainers.apo.prompts import format_instructions, placeholder_note, render_prompts


@dataclass
class Proposal:
    """What one parent produced: the critique, the parsed versions (target name → text, not yet checked) and the
    optimizer's raw edit reply (shown to the user when no version could be parsed from it)."""

    critique: str
    edits: list[dict[str, str]]
    reply: str


class OptimizerLLM:
    """Asks the optimizer endpoint for a critique and for ``n`` edited versions of the target prompts."""

    def __init__(self, llm: LLM, config: APOConfig) -> None:
        import openai

        self.llm = llm
        self.config = config
        self.client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=2)
        self.calls = 0

    def complete(self, prompt: str) -> str:
        """One chat completion with a single user message; returns the answer's text."""
        cfg = self.config
        body: dict[str, Any] = dict(self.llm.sampling)
        body["temperature"] = cfg.temperature
        if cfg.max_tokens is not None:
            body["max_tokens"] = cfg.max_tokens
        body.setdefault("seed", cfg.seed)
        reply = self.client.chat.completions.create(
            model=self.llm.model, messages=[{"role": "user", "content": prompt}], extra_body=body
        )
        self.calls += 1
        if not reply.choices:
            return ""
        return reply.choices[0].message.content or ""

    def propose(
        self,
        prompts: Mapping[str, str],
        templates: Mapping[str, PromptTemplate],
        targets: Sequence[str],
        failures: Sequence[tuple[Trajectory, float]],
        n_rollouts: int,
        mean_reward: float,
        n: int,
    ) -> Proposal:
        """Critique ``prompts`` from ``failures`` (the textual gradient), then ask for ``n`` edited versions of
        ``targets``. ``templates`` are the starting templates, whose placeholders the versions must keep."""
        cfg = self.config
        shown = sorted(range(len(failures)), key=lambda i: (failures[i][1], i))[: cfg.max_failures_shown]
        rendered = render_failures([failures[i] for i in shown], cfg.max_chars_per_failure)
        fields = {
            "prompts": render_prompts(prompts),
            "targets": ", ".join(targets),
            "failures": rendered,
            "n_failures": len(failures),
            "n_rollouts": n_rollouts,
            "mean_reward": f"{mean_reward:.2f}",
        }
        critique = self.complete(cfg.critique_prompt.format(**fields)).strip()
        edit_request = cfg.edit_prompt.format(
            **fields,
            critique=critique,
            n=n,
            placeholders=placeholder_note({t: templates[t].placeholders for t in targets}),
            output_format=format_instructions(targets, n),
        )
        reply = self.complete(edit_request)
        return Proposal(critique, parse_edits(reply, targets, cfg.untagged_edits)[:n], reply)
