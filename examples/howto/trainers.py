"""The trainers of the how-to pages, each a function over the two-agent LangGraph app (``two_agents``): LightningRL
with AIR, one LoRA adapter per agent, rejection-sampling fine-tuning, APO, and the vLLM backend's configuration.

Each takes the model folder (``agl.serving.prepare_model("qwen2.5-coder-0.5b")`` for a real run,
``agl.serving.make_tiny_model(...)`` to try it in seconds) and the run's sizes; tests/test_howto.py runs each on the
tiny model. ``python -m examples.howto.trainers`` runs them all on the tiny model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import agl
from agl.testing import FakeLLM, FakeReply
from examples.howto.two_agents import TASKS, agent
from examples.quickstart.agent import capital_share

# --8<-- [start:lightningrl]
from agl.trainers.rl import AirRules, UpdateConfig, tool_error, tool_ok


def lightningrl(model_dir: Path, train_tasks: list[dict[str, Any]], rounds: int = 10) -> agl.FitResult:
    cfg = agl.LightningRLConfig(
        model_dir=model_dir,
        rounds=rounds,
        group_size=4,  # GRPO: each task sampled 4 times, each call's advantage against its group
        update=UpdateConfig(lr=1e-6),
        air=AirRules(rules=[tool_ok(0.1), tool_error(-0.1)]),  # intermediate rewards for each tool call's outcome
    )
    with agl.Trainer(algorithm=agl.LightningRL(cfg), agents="writer|rewriter") as trainer:
        return trainer.fit(agent, train_tasks)


# --8<-- [end:lightningrl]


# --8<-- [start:lora]
def lora_per_agent(model_dir: Path, train_tasks: list[dict[str, Any]], rounds: int = 10) -> agl.FitResult:
    cfg = agl.LightningRLConfig(
        model_dir=model_dir,
        rounds=rounds,
        update=UpdateConfig(lr=1e-4, lora=agl.LoraConfig(r=16)),
        policies={"writer": "lora", "rewriter": "lora"},  # one adapter each over one base model
    )
    with agl.Trainer(algorithm=agl.LightningRL(cfg), agents="writer|rewriter") as trainer:
        return trainer.fit(agent, train_tasks)


# --8<-- [end:lora]


# --8<-- [start:rft]
from agl.trainers.sft import SFT, SFTConfig


def rejection_sampling(
    model_dir: Path, train_tasks: list[dict[str, Any]], rounds: int = 2, min_reward: float = 1.0
) -> agl.FitResult:
    cfg = SFTConfig(
        model_dir=model_dir,
        rft_rounds=rounds,  # each round samples from the newest weights; retrain_from_start=True for ReST-EM
        samples_per_task=8,
        min_reward=min_reward,  # keep rollouts that reached it ...
        top_k_per_task=2,  # ... at most two per task
    )
    with agl.Trainer(algorithm=SFT(cfg), n_runners=4, agents="writer|rewriter") as trainer:
        return trainer.fit(agent, train_tasks)


# --8<-- [end:rft]


# --8<-- [start:apo-agent]
def prompted_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One call whose system prompt is the ``system_prompt`` resource APO edits."""
    llm = resources["main_llm"]
    system = resources["system_prompt"].format(prompt=task["prompt"])
    with agl.openai_client(llm) as client:
        reply = client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": task["prompt"]}],
        )
    return capital_share(reply.choices[0].message.content or "")


# --8<-- [end:apo-agent]


# --8<-- [start:apo]
from agl.trainers.apo import APO, APOConfig


def prompt_optimization(
    base_url: str, optimizer_url: str, train_tasks: list[dict[str, Any]], rollout_budget: int = 300
) -> agl.FitResult:
    resources: dict[str, Any] = {
        "main_llm": agl.LLM(base_url=base_url, model="agent-model"),
        "optimizer_llm": agl.LLM(base_url=optimizer_url, model="optimizer-model"),  # any OpenAI-compatible model
        "system_prompt": agl.PromptTemplate(template="Answer briefly: {prompt}"),
    }
    cfg = APOConfig(
        prompts=["system_prompt"],
        optimizer_llm="optimizer_llm",
        beam_width=4,
        branch_factor=2,
        minibatch_size=8,
        rollout_budget=rollout_budget,
    )
    with agl.Trainer(algorithm=APO(cfg), resources=resources, report_to="tensorboard") as trainer:
        return trainer.fit(prompted_agent, train_tasks)


# --8<-- [end:apo]


def vllm_config(model_dir: Path) -> agl.LightningRLConfig:
    """LightningRL served by vLLM on a GPU (needs a GPU and vLLM in its own environment: not run by the tests)."""
    # --8<-- [start:vllm]
    from agl.serving import VllmConfig

    return agl.LightningRLConfig(model_dir=model_dir, backend="vllm", vllm=VllmConfig(python=".venv-vllm/bin/python"))
    # --8<-- [end:vllm]


def scripted_apo_models(body: dict[str, Any]) -> FakeReply:
    """One scripted endpoint for APO: the agent's model answers in Title Case only when its prompt asks for it; the
    optimizer's critiques, then proposes that prompt."""
    text = str(body["messages"][-1]["content"])
    if body["model"] == "optimizer-model":
        if "Title Case" in text:  # the edit request quotes the critique
            return FakeReply(content='<prompt name="system_prompt">Answer in Title Case: {prompt}</prompt>')
        return FakeReply(content="The replies are lower case; ask for Title Case.")
    system = str(body["messages"][0]["content"])
    return FakeReply(content="Paris Is The Capital" if "Title Case" in system else "paris is the capital")


def main() -> None:
    from agl.serving import make_tiny_model

    out = Path(tempfile.mkdtemp(prefix="agl-howto-"))
    tiny = make_tiny_model(out / "tiny", seed=0)
    print("lightningrl", lightningrl(tiny, TASKS, rounds=1).metrics)
    print("lora", lora_per_agent(tiny, TASKS, rounds=1).metrics)
    print("rft", rejection_sampling(tiny, TASKS, rounds=1, min_reward=0.0).metrics)
    with FakeLLM(scripted_apo_models) as fake:
        print("apo", prompt_optimization(fake.base_url, fake.base_url, TASKS, rollout_budget=8).metrics)


if __name__ == "__main__":
    main()
