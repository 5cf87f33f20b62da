"""The algorithms of the tutorial "Write your own algorithm": each implements ``agl.Algorithm.fit`` and works through
the ``agl.TrainContext`` it is given.

    python -m examples.howto.own_algorithm      # both, on a scripted model
"""

from __future__ import annotations

from typing import Any

from agl.testing import FakeLLM, FakeReply
from examples.quickstart.agent import capital_share

# --8<-- [start:mean-reward]
import agl


class MeanReward(agl.Algorithm):
    """Runs the training tasks once with the current resources and reports their mean reward."""

    def fit(self, ctx, train_tasks, val_tasks):
        batch = ctx.rollouts(train_tasks, mode="train")
        ctx.log_metrics(0, batch.summary)  # kept in the store, in run_dir/metrics.jsonl and the dashboard's curves
        return batch.summary


# --8<-- [end:mean-reward]


# --8<-- [start:best-of-prompts]
class BestOfPrompts(agl.Algorithm):
    """Tries each candidate prompt on the training tasks and keeps the best."""

    def __init__(self, candidates: list[str]) -> None:
        self.candidates = candidates

    def fit(self, ctx, train_tasks, val_tasks):
        scores = {}
        for i, template in enumerate(self.candidates):
            version = ctx.publish_changes({"prompt": agl.PromptTemplate(template=template)}).version
            batch = ctx.rollouts(train_tasks, resources_version=version, desc=f"candidate {i}")
            scores[template] = batch.summary["mean_reward"]
            ctx.log_metrics(i, {"mean_reward": scores[template]})
        best = max(scores, key=scores.__getitem__)
        ctx.publish_changes({"prompt": agl.PromptTemplate(template=best)})
        return {"best_mean_reward": scores[best]}


# --8<-- [end:best-of-prompts]


def prompted(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """An agent whose system prompt is the ``prompt`` resource."""
    llm = resources["main_llm"]
    messages: list[Any] = [
        {"role": "system", "content": resources["prompt"].template},
        {"role": "user", "content": task["prompt"]},
    ]
    with agl.openai_client(llm) as client:
        reply = client.chat.completions.create(model=llm.model, messages=messages)
    return capital_share(reply.choices[0].message.content or "")


def echo_the_prompt(body: dict[str, Any]) -> FakeReply:
    """The scripted model: answers with its system prompt's words."""
    return FakeReply(content=str(body["messages"][0]["content"]))


def main(store: str = "sqlite:///runs/own-algorithm.db") -> tuple[Any, Any]:
    tasks = [{"id": "t1", "prompt": "Hello"}, {"id": "t2", "prompt": "Name a city"}]
    with FakeLLM(echo_the_prompt) as fake:
        resources: dict[str, Any] = {
            "main_llm": agl.LLM(base_url=fake.base_url, model="scripted"),
            "prompt": agl.PromptTemplate(template="answer in lower case"),
        }
        with agl.Trainer(algorithm=MeanReward(), store=store, resources=resources) as trainer:
            measured = trainer.fit(prompted, tasks).metrics
        candidates = ["answer in lower case", "Answer In Title Case"]
        with agl.Trainer(algorithm=BestOfPrompts(candidates), store=store, resources=resources) as trainer:
            best = trainer.fit(prompted, tasks).metrics
    print("MeanReward:", measured)
    print("BestOfPrompts:", best)
    return measured, best


if __name__ == "__main__":
    main()
