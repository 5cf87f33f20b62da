"""Capture an agent that calls a plain OpenAI client: agl records the call through its gateway, no handler needed.

python -m examples.howto.plain_openai        # against a scripted model; point base_url at yours instead
"""

# --8<-- [start:agent]
import openai

import agl


def agent(task, resources):  # any sync or async callable at module level: runners import it
    llm = resources["main_llm"]  # agl.LLM: base_url (agl's gateway in a rollout), model, api_key
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    r = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    agl.emit_reward(0.2)  # an intermediate reward (a no-op outside agl)
    return 1.0 if task["answer"] in (r.choices[0].message.content or "") else 0.0  # the final reward


def main(base_url, store="sqlite:///runs/agl.db"):
    tasks = [{"id": "t1", "question": "2+2?", "answer": "4"}]
    trainer = agl.Trainer(n_runners=2, store=store, resources={"main_llm": agl.LLM(base_url=base_url, model="m")})
    with trainer:
        result = trainer.evaluate(agent, tasks)  # or trainer.fit(agent, train_tasks, val_tasks)
    print(result.summary)  # mean_reward, success_rate, capture_failures, mean_transitions
    for traj in result.trajectories:
        print([(t.agent, len(t.response_ids), t.reward) for t in traj.transitions])
    return result


# --8<-- [end:agent]


if __name__ == "__main__":  # runners are processes: keep the guard
    from agl.testing import FakeLLM, FakeReply

    with FakeLLM(lambda body: FakeReply(content="2+2 is 4")) as fake:  # your model: main("http://host:port/v1")
        main(fake.base_url)
