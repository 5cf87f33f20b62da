"""Improve an agent from traces it left in production, without running it: import OpenTelemetry traces (here an
OTLP JSON file, as an OpenInference-instrumented app writes one), then let APO critique and edit the prompt, and SFT
fine-tune on the calls rendered with the model's chat template.

    python -m examples.howto.production_traces   # on a small traces file, a scripted optimizer and the tiny model
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import agl
import agl.otel
from agl.otel import import_traces, read_otlp_json
from agl.testing import FakeLLM, FakeReply

# --8<-- [start:offline]
from agl.trainers.apo import APO, APOConfig
from agl.trainers.sft import SFT, SFTConfig, sft_on_trajectories


def improve_offline(store: Any, resources: dict[str, Any], model_dir: Path) -> tuple[str, Path]:
    # refused (NotTrainable) with algorithm=LightningRL(...): RL trains only on the ids a policy sampled
    trajectories = agl.otel.stored_trajectories(store, agents=["solver"])
    proposal = APO(APOConfig(prompts=["system_prompt"])).fit_offline(resources, trajectories)
    print(proposal.prompts["system_prompt"])  # edited from the failures' critique, unscored

    cfg = SFTConfig(model_dir=model_dir, successful_only=False, min_reward=None)  # no reward: keep every trace
    weights = sft_on_trajectories(agl.otel.stored_trajectories(store, algorithm=SFT(cfg)), cfg)  # text-derived
    return proposal.prompts["system_prompt"], weights


# --8<-- [end:offline]


#: What the production agent was asked and answered (no reward was recorded).
CALLS = [("What is 2 + 3?", "6"), ("What is 4 + 4?", "8")]


def write_traces(path: Path, calls: list[tuple[str, str]] = CALLS, agent: str | None = "solver") -> Path:
    """An OTLP JSON file of one trace per (question, answer) of ``calls``: an LLM span (of ``agent``, when given) as an
    OpenInference-instrumented app writes it, text only, no token ids."""
    spans = []
    for i, (question, answer) in enumerate(calls):
        attrs = {
            "openinference.span.kind": "LLM",
            **({"agent.name": agent} if agent else {}),
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": question,
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": answer,
        }
        spans.append(
            {
                "traceId": f"{i + 1:032x}",
                "spanId": f"{i + 1:016x}",
                "name": "ChatOpenAI",
                "startTimeUnixNano": str(1_700_000_000_000_000_000 + i),
                "endTimeUnixNano": str(1_700_000_001_000_000_000 + i),
                "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
            }
        )
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    return path


def optimizer(body: dict[str, Any]) -> FakeReply:
    """A scripted optimizer: a critique, then the edited prompt."""
    if "Check the sum" in str(body["messages"][-1]["content"]):  # the edit request quotes the critique
        edited = "Add the numbers, then check the sum: {question}"
        return FakeReply(content=f'<prompt name="system_prompt">{edited}</prompt>')
    return FakeReply(content="Check the sum before answering.")


def main(out: Path) -> tuple[str, Path]:
    from agl.serving import make_tiny_model

    store = agl.open_store(f"sqlite:///{out}/imported.db")
    import_traces(store, read_otlp_json(write_traces(out / "traces.json")), source="prod")
    with FakeLLM(optimizer) as fake:
        resources: dict[str, Any] = {
            "system_prompt": agl.PromptTemplate(template="Add the numbers: {question}", agent="solver"),
            "optimizer_llm": agl.LLM(base_url=fake.base_url, model="optimizer"),
        }
        return improve_offline(store, resources, make_tiny_model(out / "tiny", seed=0))


if __name__ == "__main__":
    print(main(Path(tempfile.mkdtemp(prefix="agl-traces-"))))
