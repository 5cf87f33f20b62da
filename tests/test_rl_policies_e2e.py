"""Per-agent policies end to end: Trainer + runners + gateway routing + the local policy server's LoRA adapters +
LightningRL training one adapter per agent, on a tiny model (CPU).

The agent makes three calls per rollout with the plain OpenAI client: one as ``writer``, one as ``rewriter`` (each
inside ``agl.agent_scope``) and one with no agent identity. The first two are routed to their own adapters, the last
to the base model, all through the one ``main_llm`` resource the agent was handed.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

import agl

pytestmark = pytest.mark.slow  # trains two adapters with LightningRL

AGENTS = ["writer", "rewriter"]


def _ask(llm: Any, prompt: str) -> list[str]:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": prompt}], logprobs=True
    )
    logprobs = reply.choices[0].logprobs
    return [e.token for e in (logprobs.content or [])] if logprobs else []


def two_agent_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Writer, rewriter, then an untagged call; the reward is the share of capitalised tokens the two agents wrote."""
    llm = resources["main_llm"]
    with agl.agent_scope("writer"):
        written = _ask(llm, task["prompt"])
    with agl.agent_scope("rewriter"):
        rewritten = _ask(llm, f"Rewrite: {task['prompt']}")
    _ask(llm, "Check it.")
    tokens = written + rewritten
    return sum(t.strip()[:1].isupper() for t in tokens) / len(tokens) if tokens else 0.0


TASKS = [{"id": f"t{i}", "prompt": p} for i, p in enumerate(["Hello", "Say words", "Go", "Name"])]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from agl.serving.models import make_tiny_model
    from agl.trainers.config import LoraConfig, ServingConfig
    from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig

    root = tmp_path_factory.mktemp("rl-policies")
    cfg = LightningRLConfig(
        model_dir=make_tiny_model(root / "tiny", seed=0),
        policies=dict.fromkeys(AGENTS, "lora"),
        rounds=2,
        group_size=4,
        serving=ServingConfig(max_tokens=4, temperature=0.5),
        update=UpdateConfig(lr=1e-2, lora=LoraConfig(r=4, alpha=8), device="cpu", measure_kl_ref=False),
        seed=0,
        checkpoint_dir=root / "ckpt",
    )
    store = f"sqlite:///{root / 'agl.db'}"
    trainer = agl.Trainer(algorithm=LightningRL(cfg), n_runners=1, store=store, progress=False)
    result = trainer.fit(two_agent_agent, TASKS)
    return {"result": result, "store": store, "root": root}


def test_each_call_went_to_its_agents_adapter_and_its_transition_says_so(run: dict[str, Any]) -> None:
    from agl.core.adapter import build_trajectory, select_agents
    from agl.core.store import open_store

    store = open_store(run["store"])
    try:
        train = store.list_rollouts(mode="train", limit=1000)
        assert len(train) == 2 * len(TASKS) * 4 and all(r.status == "succeeded" for r in train)
        for ro in train:
            spans = store.query_spans(rollout_id=ro.rollout_id)
            llm = sorted((s for s in spans if s.kind == "llm"), key=lambda s: s.sequence)
            routed = [(s.agent, s.attributes["agl.policy"], s.attributes["agl.policy_route"]) for s in llm]
            assert routed == [
                ("writer", "policy/writer", "agent"),
                ("rewriter", "policy/rewriter", "agent"),
                (None, "policy", "no_agent"),
            ]
            resources = store.get_resources(ro.resources_version).resources["main_llm"]
            assert isinstance(resources, agl.LLM)
            for span in llm[:2]:  # each adapter call ran on the version of that adapter the rollout was given
                assert span.attributes["agl.weights_version"] == resources.routes[span.agent or ""].weights_version
            traj = build_trajectory(ro, spans, select_agents(None))
            assert [(t.agent, t.policy) for t in traj.transitions] == [
                ("writer", "policy/writer"),
                ("rewriter", "policy/rewriter"),
                (None, "policy"),
            ]
    finally:
        store.close()


def test_each_adapter_trained_on_its_own_agents_calls_and_the_rest_was_counted(run: dict[str, Any]) -> None:
    rows = [r for r in json.loads((run["root"] / "rl_metrics.json").read_text()) if r["round"] > 0]
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        for agent in AGENTS:  # one call of each agent per rollout: 4 tasks x 4 rollouts
            assert row[f"policy/{agent}/transitions"] == 16
        assert row["base_transitions"] == 16, "the untagged calls were served by the base and not trained"
    first = rows[0]
    assert any(first[f"policy/{agent}/trained_transitions"] for agent in AGENTS)
    for agent in AGENTS:
        assert rows[1][f"policy/{agent}/weights_version"] == (
            "v1" if first[f"policy/{agent}/trained_transitions"] else "v0"
        )


def test_each_adapter_is_saved_as_a_peft_folder_listed_in_the_manifest(run: dict[str, Any]) -> None:
    from peft import PeftConfig

    folders = sorted((run["root"] / "ckpt").glob("round-*/policies"))
    assert folders, "checkpoints were written"
    adapters = json.loads((folders[-1] / "manifest.json").read_text())["adapters"]
    assert sorted(adapters) == sorted(AGENTS)
    for agent in AGENTS:
        assert adapters[agent]["model"] == f"policy/{agent}"
        peft = PeftConfig.from_pretrained(str(folders[-1] / adapters[agent]["folder"]))
        assert peft.peft_type == "LORA"
