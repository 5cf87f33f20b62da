"""Core types round-trip through JSON unchanged and reject bad input with the field named."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from agl.core.types import (
    LLM,
    ModelWeights,
    PromptTemplate,
    Record,
    Resource,
    ResourceSet,
    Rollout,
    Span,
    Trajectory,
    Transition,
)


def test_span_round_trips_with_nested_attributes() -> None:
    span = Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        kind="llm",
        name="chat",
        agent="writer",
        attributes={"agl.prompt_token_ids": [1, 2, 3], "gen_ai.input.messages": [{"role": "user", "content": "hé"}]},
    )
    assert Span.model_validate_json(span.model_dump_json()) == span


def test_trajectory_round_trips() -> None:
    traj = Trajectory(
        rollout_id="ro-1",
        attempt_id="at-1",
        task_id="t",
        task={"q": 1},
        resources_version=2,
        status="succeeded",
        final_reward=1.0,
        transitions=[
            Transition(
                span_id="sp", agent="a", step=0, prompt_ids=[1], response_ids=[2, 3], response_logprobs=[-0.5, -1]
            )
        ],
        rewards=[0.2],
    )
    assert Trajectory.model_validate_json(traj.model_dump_json()) == traj
    assert traj.transitions[0].has_token_ids


def test_resource_set_round_trips_each_resource_kind() -> None:
    rs = ResourceSet(
        version=3,
        resources={
            "main_llm": LLM(base_url="http://x/v1", model="m", sampling={"temperature": 0.7}),
            "prompt": PromptTemplate(template="Q: {question}", agent="writer"),
            "policy": ModelWeights(path="/ckpt/v3", version="v3", base_model="smol", adapter=True),
        },
    )
    back = ResourceSet.model_validate_json(rs.model_dump_json())
    assert back == rs
    assert isinstance(back.resources["prompt"], PromptTemplate)
    assert back.resources["prompt"].format(question="2+2") == "Q: 2+2"
    assert back.resources["prompt"].placeholders == {"question"}


def test_unknown_resource_kind_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="kind"):
        TypeAdapter(Resource).validate_python({"kind": "banana", "path": "x"})


def test_span_rejects_unknown_kind_and_extra_fields() -> None:
    with pytest.raises(ValidationError, match="kind"):
        Span(rollout_id="r", attempt_id="a", kind="bogus", name="x")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="colour"):
        Span.model_validate({"rollout_id": "r", "attempt_id": "a", "kind": "llm", "name": "x", "colour": 1})


def test_rollout_and_record_round_trip() -> None:
    ro = Rollout(rollout_id="ro", task=[1, "a"], resources_version=1, created_at=1.0, metadata={"k": "v"})
    assert Rollout.model_validate_json(ro.model_dump_json()) == ro
    rec = Record(kind="metrics", key="0", data={"reward": 0.5})
    assert Record.model_validate_json(rec.model_dump_json()) == rec
