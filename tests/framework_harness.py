"""Scaffolding shared by the framework capture tests (tests/test_langgraph.py, test_openai_agents.py, test_autogen.py,
test_crewai.py): one ``evaluate`` batch of a multi-agent app on two runner processes against FakeLLM, queries over
what it recorded, and the checks every framework must pass on it.

Each app's requests say who sent them and for which task; :func:`system_role` and :func:`user_task_id` read the
convention the LangGraph, OpenAI Agents and AutoGen apps share (system prompt ``ROLE <role>``, user message
``[<task id>] ...``); an app with another convention passes its own readers to :func:`evaluate`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agl
from agl.core.adapter import check_capture
from agl.core.emit import RolloutContext, SpanSink, rollout_scope
from agl.core.runner import AgentFn
from agl.core.store.sqlite import SqliteStore
from agl.core.types import Rollout, Span, Trajectory
from agl.testing import FakeLLM, RecordedRequest, ServedReply, fake_token_ids
from agl.testing.fake_llm import render_messages

Messages = list[dict[str, Any]]


def system_role(messages: Messages) -> str:
    """The role a request came from: the last word of its system prompt (``ROLE <role>``)."""
    return str(messages[0]["content"]).split()[-1]


def user_task_id(messages: Messages) -> str:
    """The task a request is for: its user message starts with ``[<task id>]``."""
    user = next(m["content"] for m in messages if m["role"] == "user")
    return str(user)[1:].split("]", 1)[0]


@dataclass
class Run:
    """One finished ``evaluate`` batch, the FakeLLM that served it, and its store."""

    batch: agl.RolloutBatch
    fake: FakeLLM
    store: SqliteStore
    role_of: Callable[[Messages], str]
    task_id_of: Callable[[Messages], str]

    def rollout(self, task_id: str) -> Rollout:
        [ro] = [r for r in self.batch.rollouts if r.task_id == task_id]
        return ro

    def trajectory(self, task_id: str) -> Trajectory:
        [traj] = [t for t in self.batch.trajectories if t.task_id == task_id]
        return traj

    def spans(self, task_id: str, kind: str | None = None) -> list[Span]:
        return self.store.query_spans(rollout_id=self.rollout(task_id).rollout_id, kind=kind)

    def served(self, messages: Messages) -> ServedReply:
        """The reply FakeLLM gave to exactly this conversation (prompt ids are a function of the messages)."""
        prompt = fake_token_ids(render_messages(messages))
        [reply] = [r for r in self.fake.replies if r.prompt_token_ids == prompt]
        return reply

    def requests(self, task_id: str) -> list[RecordedRequest]:
        return [r for r in self.fake.requests if self.task_id_of(r["messages"]) == task_id]


def evaluate(
    tmp: Path,
    fake: FakeLLM,
    agent: AgentFn,
    tasks: list[dict[str, Any]],
    *,
    selected: list[str],
    role_of: Callable[[Messages], str] = system_role,
    task_id_of: Callable[[Messages], str] = user_task_id,
    routed: Sequence[str] = (),
) -> Run:
    """Run ``tasks`` once on two runner processes, the model served by ``fake``, transitions for ``selected`` agents;
    the calls of each ``routed`` agent go to a policy of its own (model ``policy/<agent>``, see :func:`policy_of`)."""
    routes = {agent: agl.PolicyRoute(model=policy_of(agent)) for agent in routed}
    trainer = agl.Trainer(
        n_runners=2,
        store=f"sqlite:///{tmp}/agl.db",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake", routes=routes)},
        agents=selected,
        progress=False,
    )
    batch = trainer.evaluate(agent, tasks)
    return Run(batch, fake, SqliteStore(tmp / "agl.db"), role_of, task_id_of)


def policy_of(agent: str) -> str:
    """The model name a routed agent's calls are served by in these tests."""
    return f"policy/{agent}"


def assert_each_agents_calls_went_to_its_policy(
    run: Run, routed: Sequence[str], *, agent_of_role: Mapping[str, str] | None = None
) -> None:
    """Every request FakeLLM got carried the model of its agent's policy (a nested agent takes its parent's), every
    other agent's the shared model; each gateway span and transition records the policy that served it."""

    def expected(role: str) -> str:
        agent = _agent(role, agent_of_role)
        owners = [a for a in routed if agent == a or agent.startswith(f"{a}/")]
        return policy_of(owners[0]) if owners else "fake"

    models = Counter(str(q["model"]) for q in run.fake.requests)
    assert all(models[policy_of(a)] for a in routed) and models["fake"], f"both kinds of calls were made: {models}"
    for q in run.fake.requests:
        assert q["model"] == expected(run.role_of(q["messages"])), q["messages"][0]
    for ro in run.batch.rollouts:
        for span in run.store.query_spans(rollout_id=ro.rollout_id, kind="llm"):
            policy = expected(run.role_of(span.attributes["gen_ai.input.messages"]))
            assert span.attributes["agl.policy"] == policy
            assert span.attributes["agl.policy_route"] == ("default" if policy == "fake" else "agent")
    for traj in run.batch.trajectories:
        assert traj.transitions and all(t.policy == expected(run.role_of(t.request_messages)) for t in traj.transitions)


def assert_all_succeeded_on_both_runners(run: Run, n_tasks: int) -> None:
    assert [r.status for r in run.batch.rollouts] == ["succeeded"] * n_tasks
    assert [t.final_reward for t in run.batch.trajectories] == [1.0] * n_tasks
    workers = {a.worker_id for r in run.batch.rollouts for a in run.store.list_attempts(r.rollout_id)}
    assert len(workers) == 2


def assert_transitions_are_the_selected_calls(
    run: Run,
    roles: list[str],
    *,
    selected: Callable[[str], bool],
    agent_of_role: Mapping[str, str] | None = None,
) -> None:
    """Every trajectory's transitions come from ``roles`` (sorted) and its own task, each tagged with its agent
    (``agent_of_role``, or the role itself) and carrying exactly the prompt and response token ids and logprobs
    FakeLLM served for that conversation; over the batch there is one transition per call of a ``selected`` role."""
    for traj in run.batch.trajectories:
        assert sorted(run.role_of(t.request_messages) for t in traj.transitions) == roles, "only the selected agents"
        for t in traj.transitions:
            role = run.role_of(t.request_messages)
            assert run.task_id_of(t.request_messages) == traj.task_id
            assert t.agent == _agent(role, agent_of_role)
            served = run.served(t.request_messages)
            assert t.prompt_ids == served.prompt_token_ids and t.prompt_ids
            assert t.response_ids == served.token_ids and t.response_ids
            assert t.response_logprobs == served.logprobs
    captured = sorted(tuple(t.response_ids) for traj in run.batch.trajectories for t in traj.transitions)
    prompts = {
        tuple(fake_token_ids(render_messages(q["messages"])))
        for q in run.fake.requests
        if selected(run.role_of(q["messages"]))
    }
    expected = sorted(tuple(r.token_ids or []) for r in run.fake.replies if tuple(r.prompt_token_ids or []) in prompts)
    assert captured == expected, "one transition per selected call, no duplicates"


def assert_direct_calls_lack_token_ids(
    run: Run, task_id: str, agents: list[str], *, agent_of_role: Mapping[str, str] | None = None
) -> None:
    """Rollout ``task_id``, whose model calls bypassed the gateway, succeeded; each call's ``llm`` span (the
    framework's record) is tagged with its agent and has no token ids; its trajectory still has the selected calls'
    transitions (``agents``, sorted), which :func:`check_capture` refuses for lacking token ids."""
    ro = run.rollout(task_id)
    assert ro.status == "succeeded" and ro.final_reward == 1.0
    for span in run.spans(task_id, "llm"):
        assert span.agent == _agent(run.role_of(span.attributes["gen_ai.input.messages"]), agent_of_role)
        assert span.attributes["agl.via_gateway"] is False and "agl.response_token_ids" not in span.attributes
    traj = run.trajectory(task_id)
    assert sorted(t.agent or "" for t in traj.transitions) == agents
    failure = check_capture(traj, run.spans(task_id), require_token_ids=True)
    assert failure is not None and "have no token ids" in failure.reason


def _agent(role: str, agent_of_role: Mapping[str, str] | None) -> str:
    return agent_of_role[role] if agent_of_role is not None else role


class SpanList:
    """A span store for a :class:`~agl.core.emit.SpanSink` that keeps what it is given, for in-process tests."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    def add_spans(self, spans: list[Span]) -> int:
        self.spans.extend(spans)
        return len(spans)


@contextmanager
def local_rollout() -> Iterator[SpanList]:
    """A rollout current in this process, its spans kept in the :class:`SpanList` yielded (all of them once the
    block has ended)."""
    memory = SpanList()
    sink = SpanSink(memory)
    with rollout_scope(RolloutContext("ro-local", "at-local", sink)):
        yield memory
    sink.close()
