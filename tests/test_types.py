"""Core types round-trip through JSON unchanged and reject bad input with the field named: values JSON cannot hold are
refused (naming where inside a free-form field), and ``jsonable`` makes anything storable."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from agl.core.jsonsafe import check_json, json_problem, jsonable
from agl.core.types import (
    LLM,
    ModelWeights,
    PromptTemplate,
    Record,
    Resource,
    ResourceSet,
    Rollout,
    RolloutRequest,
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


# --------------------------------------------------------------------------------------------------- JSON safety


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("attributes", "where", "problem"),
    [
        ({"x": math.nan}, ".x", "nan is not a finite number"),
        ({"gen_ai.usage": {"t": [1.0, math.inf]}}, '["gen_ai.usage"].t[1]', "inf is not a finite number"),
        ({"ids": [1, 2, 2**63]}, ".ids[2]", "an integer of 64 bits is outside the signed 64-bit range"),
        ({"ids": (-(2**63) - 1,)}, ".ids[0]", "outside the signed 64-bit range"),
        ({"o": object()}, ".o", "a value of type object is not JSON data"),
        ({"s": ["ok", "bad \ud800"]}, ".s[1]", "lone surrogate"),
        ({"k": {1: "v"}}, ".k", "key 1 is of type int, not a string"),
        ({"deep": _nested(64)}, ".deep" + "[0]" * 7 + "…[0][0]", "nested deeper than 64 levels"),
    ],
)
def test_span_attributes_refuse_what_json_cannot_hold_naming_where(attributes: Any, where: str, problem: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Span(rollout_id="r", attempt_id="a", kind="custom", name="x", attributes=attributes)
    [error] = refused.value.errors()
    assert error["loc"] == ("attributes",)
    assert error["ctx"]["path"] == where
    assert problem in error["msg"]


def test_span_fields_refuse_non_finite_times_and_out_of_range_sequence() -> None:
    for field, value in (("start_time", math.nan), ("end_time", math.inf), ("sequence", 2**63), ("sequence", -1)):
        with pytest.raises(ValidationError, match=field):
            Span.model_validate({"rollout_id": "r", "attempt_id": "a", "kind": "llm", "name": "x", field: value})


def test_free_form_fields_of_stored_types_refuse_what_json_cannot_hold() -> None:
    with pytest.raises(ValidationError, match="task"):
        RolloutRequest(task={"q": math.nan})
    with pytest.raises(ValidationError, match="metadata"):
        RolloutRequest(task=1, metadata={"n": 2**64})
    with pytest.raises(ValidationError, match="data"):
        Record.model_validate_json('{"kind": "k", "data": {"x": -Infinity}}')
    assert Record(kind="k", data={"x": -math.inf, "y": [math.nan, 1.0]}).data == {"x": None, "y": [None, 1.0]}, (
        "a metric that is NaN in-process (a mean over nothing) is kept as null"
    )
    with pytest.raises(ValidationError, match="sampling"):
        LLM(base_url="u", model="m", sampling={"t": math.nan})
    with pytest.raises(ValidationError, match="final_reward"):
        Rollout(rollout_id="r", task=1, resources_version=1, created_at=1.0, final_reward=math.nan)


def test_the_extremes_json_can_hold_round_trip() -> None:
    attributes = {
        "ints": [-(2**63), 2**63 - 1, 0],
        "floats": [1e308, -1e-308, 0.0],
        "mixed": [1, 1.5, "é", None, True, {"a": []}],
        "deep": _nested(63),
        "emoji": "😀",
    }
    span = Span(rollout_id="r", attempt_id="a", kind="custom", name="x", sequence=2**63 - 1, attributes=attributes)
    assert Span.model_validate_json(span.model_dump_json()) == span


def test_check_json_fast_paths_find_the_one_bad_item() -> None:
    for items, index in (
        ([1] * 999 + [2**63], 999),
        ([0.5] * 500 + [math.nan] + [0.5] * 10, 500),
        (["a", "\udc00"], 1),
    ):
        problem = json_problem({"v": items})
        assert problem is not None and problem.path == f".v[{index}]", problem
    assert json_problem({"v": [1e308, 1e308]}) is None, "a sum that overflows is checked item by item, not refused"


anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary()
    | st.builds(object)
    | st.decimals(allow_nan=True),
    lambda children: (
        st.lists(children)
        | st.sets(st.integers())
        | st.tuples(children, children)
        | st.dictionaries(st.text() | st.integers() | st.booleans(), children)
    ),
    max_leaves=30,
)


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(value=anything)
def test_jsonable_makes_anything_storable(value: Any) -> None:
    safe = jsonable(value)
    check_json(safe)
    span = Span(rollout_id="r", attempt_id="a", kind="custom", name="x", attributes={"v": safe})
    assert Span.model_validate_json(span.model_dump_json()) == span


def test_jsonable_text_with_lone_surrogates_and_deep_values() -> None:
    assert jsonable("a\ud800b") == "a?b"
    assert jsonable({"\udfff": 1}) == {"?": 1}
    check_json(jsonable(_nested(500)))
