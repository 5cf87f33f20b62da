"""The quickstart: a LangGraph agent evaluated against a scripted model, then trained with LightningRL on a tiny
local model. About a minute on two CPU cores; nothing is downloaded.

    python -m examples.quickstart.train --out runs/quickstart
    agl runs --store sqlite:///runs/quickstart/train.db          # the rollouts, newest first
    agl show ROLLOUT --store sqlite:///runs/quickstart/train.db  # one of them: attempts, span tree, transitions
    agl dashboard --store sqlite:///runs/quickstart/train.db     # all of it in a browser, with the reward curve

1. ``evaluate``: ``agl.testing.FakeLLM``, a real OpenAI-compatible server on loopback, answers every call; agl runs
   the agent in two runner processes, captures the graph's calls and returns the rollouts with their trajectories.
2. ``train``: ``agl.LightningRL`` serves a tiny random model (``agl.serving.make_tiny_model``) on this machine and
   improves it for four rounds with GRPO: the mean reward rises from the share of capitalised words a random model
   writes (about a third) towards 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import agl
from agl.testing import FakeLLM, FakeReply
from agl.trainers.rl import UpdateConfig
from examples.quickstart.agent import TASKS, answer_in_capitals


def evaluate(out: Path) -> agl.RolloutBatch:
    """The agent against a scripted model: what agl captured, with no model to download."""
    with FakeLLM(lambda body: FakeReply(content="Paris is The Capital")) as fake:
        trainer = agl.Trainer(
            n_runners=2,
            store=f"sqlite:///{out}/evaluate.db",
            agents="answer",  # whose calls become transitions: the graph's node names, or a regex of them
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="scripted")},
        )
        with trainer:
            return trainer.evaluate(answer_in_capitals, TASKS)


def train(out: Path) -> list[float]:
    """LightningRL on a tiny local model; returns the mean reward of each round's rollouts."""
    from agl.serving import make_tiny_model

    config = agl.LightningRLConfig(
        model_dir=make_tiny_model(out / "tiny-model", seed=0),
        rounds=4,
        group_size=4,  # GRPO: each task sampled 4 times, each answer scored against its group
        serving=agl.ServingConfig(max_tokens=4, temperature=0.25),
        update=UpdateConfig(lr=1e-2),  # a tiny random model takes a large step; a real one 1e-6 to 1e-4
        seed=0,
    )
    trainer = agl.Trainer(
        algorithm=agl.LightningRL(config), n_runners=2, store=f"sqlite:///{out}/train.db", agents="answer"
    )
    with trainer:
        trainer.fit(answer_in_capitals, TASKS)
    store = agl.open_store(f"sqlite:///{out}/train.db")
    rows = [r.data for r in store.list_records("metrics")]
    return [float(row["mean_reward"]) for row in sorted(rows, key=lambda r: r["step"]) if row["step"] > 0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/quickstart"), help="run folder (default runs/quickstart)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    batch = evaluate(args.out)
    print(f"evaluated: {batch.summary}")
    for rollout, trajectory in zip(batch.rollouts, batch.trajectories, strict=True):
        calls = [(t.agent, len(t.prompt_ids), len(t.response_ids)) for t in trajectory.transitions]
        print(f"  {rollout.task_id}: reward {rollout.final_reward}, calls (agent, prompt ids, response ids) {calls}")
    rewards = train(args.out)
    print("trained: mean reward per round " + " → ".join(f"{r:.2f}" for r in rewards))
    print(f"see the rollouts: agl runs --store sqlite:///{args.out}/train.db, then agl show ROLLOUT --store ...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
