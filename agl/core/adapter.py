"""Spans → Trajectories: one Transition per LLM call of the selected agents, rewards attached where they landed.

Pure functions over data already fetched from the store; no I/O. Capture problems (nothing recorded, calls without
token ids, calls recorded by only one of the framework and the gateway) are returned as ``CaptureFailure`` values so
the caller decides whether they are errors.

Order without clocks: the runner, the gateway and the store may run on different hosts whose clocks disagree, so no
decision here compares ``start_time`` values. The runner numbers every span it records (``RolloutContext``'s
sequence) and sends its next number with every gateway request, which the gateway stores as its ``llm`` span's
``sequence``; within one attempt those numbers are the order things happened. Spans without a runner number keep
their place in the order the store received them (see ``call_order``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agl.core.jsonsafe import one_line
from agl.core.types import (
    ATTR_CALL_ID,
    ATTR_ERROR_MESSAGE,
    ATTR_HTTP_STATUS,
    ATTR_INPUT_MESSAGES,
    ATTR_LOGPROBS,
    ATTR_OUTPUT_MESSAGES,
    ATTR_POLICY,
    ATTR_PROMPT_IDS,
    ATTR_RESPONSE_IDS,
    ATTR_REWARD,
    ATTR_TEMPERATURE,
    ATTR_TOOL_ARGUMENTS,
    ATTR_TOOL_RESULT,
    ATTR_VIA_GATEWAY,
    ATTR_WEIGHTS_VERSION,
    HEADER_SEQUENCE,
    Rollout,
    Span,
    Trajectory,
    Transition,
    agent_with_parents,
)

AgentSelector = Callable[[str | None], bool]

#: The name of a reward span that is a tie-break score, not a reward: ``agl.emit_reward(f1, name=TIE_BREAK_REWARD)``
#: right after the call that wrote an answer. It lands on that call's ``Transition.tie_break`` (placed as intermediate
#: rewards are), never on ``Transition.reward`` or ``Trajectory.rewards``, so credit assignment never sees it; GRPO
#: uses it only to break ties within a group whose returns are all equal (``GRPOConfig.tie_break``).
TIE_BREAK_REWARD = "tie_break"


def is_tie_break(span: Span) -> bool:
    """Whether ``span`` is a tie-break score (``TIE_BREAK_REWARD``): never a reward, wherever rewards are summed."""
    return span.kind == "reward" and span.name == TIE_BREAK_REWARD


def span_summary(span: Span, width: int = 160) -> str:
    """What a span holds, on one line (the reply, the tool's arguments and result, the reward, the error), for the
    dashboard and ``agl show`` alike."""
    a = span.attributes
    if span.kind == "reward":
        return f"{'tie-break score' if is_tie_break(span) else 'reward'} {a.get(ATTR_REWARD)}"
    if span.kind == "exception":
        return one_line(f"{a.get('exception.type')}: {a.get('exception.message')}", width)
    if span.kind == "llm":
        if span.status == "error":
            return one_line(f"HTTP {a.get(ATTR_HTTP_STATUS)}: {a.get(ATTR_ERROR_MESSAGE)}", width)
        out = a.get(ATTR_OUTPUT_MESSAGES) or [{}]
        msg = out[-1] if isinstance(out, list) and out and isinstance(out[-1], dict) else {}
        return one_line(msg.get("content") or msg.get("tool_calls") or "", width)
    if span.kind == "tool":
        result = a.get(ATTR_TOOL_RESULT, a.get(ATTR_ERROR_MESSAGE, ""))
        return one_line(f"{a.get(ATTR_TOOL_ARGUMENTS, '')} → {result}", width)
    if span.kind == "message":
        return one_line(a.get("agl.message", ""), width)
    return ""


#: Automatic intermediate rewards: a reward for a span (a tool call that ran, a query that executed), or None.
AirFn = Callable[[Span], float | None]


def select_agents(agents: str | Sequence[str] | None) -> AgentSelector:
    """Which agents' LLM calls become transitions: None = all; a list = those names; a string = a regex (full match).

    Regexes run on RE2 (``google-re2``), whose matching takes time linear in the name: a pattern arrives from
    dashboard readers (``?agents=``) and configs, and a backtracking engine would let ``(\\w|\\w)*!`` hold the server
    for seconds. RE2 has no backreferences or lookaround; such a pattern is refused with the reason.

    Names are paths for nested agents (``"solver/critic"``: node ``critic`` of subgraph ``solver``); selecting an
    agent selects everything nested in it, so ``["solver"]`` (or the regex ``"solver"``) takes all of ``solver/*``.

    >>> select_agents("sql_(writer|rewriter)")("sql_writer")
    True
    >>> select_agents(["solver"])("solver/critic")
    True
    """
    if agents is None:
        return lambda name: True
    if isinstance(agents, str):
        import re2

        options = re2.Options()
        options.log_errors = False
        try:
            pattern = re2.compile(agents, options)
        except re2.error as exc:
            reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise ValueError(f"agents: {agents!r} is not a regular expression RE2 accepts ({reason})") from None
        return lambda name: name is not None and any(pattern.fullmatch(n) for n in agent_with_parents(name))
    names = set(agents)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"agents: expected names (str), got {sorted(map(repr, names))}")
    return lambda name: name is not None and any(n in names for n in agent_with_parents(name))


@dataclass(frozen=True)
class CaptureFailure:
    """A finished rollout whose recording cannot be trained or evaluated as the user expects."""

    rollout_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rollout_id}: {self.reason}"


def _transition(span: Span, step: int) -> Transition:
    a = span.attributes
    out = a.get(ATTR_OUTPUT_MESSAGES) or [{}]
    return Transition(
        span_id=span.span_id,
        agent=span.agent,
        step=step,
        prompt_ids=list(a.get(ATTR_PROMPT_IDS) or []),
        response_ids=list(a.get(ATTR_RESPONSE_IDS) or []),
        response_logprobs=[float(x) for x in a.get(ATTR_LOGPROBS) or []],
        weights_version=a.get(ATTR_WEIGHTS_VERSION),
        policy=a.get(ATTR_POLICY),
        temperature=_number(a.get(ATTR_TEMPERATURE)),
        request_messages=list(a.get(ATTR_INPUT_MESSAGES) or []),
        response_message=dict(out[-1]) if isinstance(out, list) and out else {},
    )


def _number(value: object) -> float | None:
    """A numeric attribute as a float; None when absent or not a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def call_order(spans: Sequence[Span]) -> list[Span]:
    """The spans in the order things happened, decided by the runner's sequence numbers, never by wall clocks.

    ``spans`` come in the order the store received them (``Store.query_spans``). Within each attempt, the spans the
    runner numbered (everything it recorded, and the gateway ``llm`` spans of the requests it sent) are put in the
    order of their numbers; a span with ``sequence`` 0 (no runner number, e.g. a gateway call sent by an HTTP client
    agl does not tag) keeps its place in arrival order. Attempts follow each other in the order their first span
    arrived.
    """
    by_attempt: dict[str, list[Span]] = {}
    for span in spans:
        by_attempt.setdefault(span.attempt_id, []).append(span)
    ordered: list[Span] = []
    for group in by_attempt.values():
        numbered = iter(sorted((s for s in group if s.sequence > 0), key=lambda s: s.sequence))
        ordered.extend(next(numbered) if s.sequence > 0 else s for s in group)
    return ordered


def _tool_errors(spans: Sequence[Span]) -> set[str]:
    """Ids of the ``exception`` spans that record the error of a failed ``tool`` span (their parent).

    A failing tool leaves both spans (every integration records the exception under the tool's span); they are one
    event, so AIR judges only the tool span.
    """
    failed_tools = {s.span_id for s in spans if s.kind == "tool" and s.status == "error"}
    return {s.span_id for s in spans if s.kind == "exception" and s.parent_id in failed_tools}


def _reward(span: Span, air: AirFn | None, skip: set[str]) -> float | None:
    """The intermediate reward a span carries: an emitted ``reward`` span's value, or AIR's verdict on it."""
    if span.kind == "reward":
        return float(span.attributes.get(ATTR_REWARD, 0.0))
    if air is None or span.span_id in skip:
        return None
    value = air(span)
    return None if value is None else float(value)


def build_trajectory(
    rollout: Rollout,
    spans: Sequence[Span],
    selector: AgentSelector,
    attempt_id: str | None = None,
    air: AirFn | None = None,
) -> Trajectory:
    """Turn the spans of one attempt (in arrival order, as the store returns them) into a Trajectory.

    Transitions are the successful ``llm`` spans of selected agents in call order (``call_order``). Each
    intermediate reward (an emitted ``reward`` span, or the ``air`` rules' verdict on a span, which the runner
    numbers when the span ends) attaches to the last selected call before it in that order (to the first call if
    it came earlier). A failed tool call is judged by AIR once: its ``exception`` span is not judged on its own.
    A reward span named ``TIE_BREAK_REWARD`` is placed the same way but adds to the call's ``tie_break`` instead of
    its reward, and is not one of the trajectory's ``rewards``.
    """
    ordered = call_order(spans)
    skip = _tool_errors(ordered) if air is not None else set()
    calls: list[Span] = []
    landed: list[float] = []
    ties: list[float | None] = []
    early = 0.0
    early_tie: float | None = None
    rewards: list[float] = []
    for span in ordered:
        if span.kind == "llm" and span.status == "ok" and selector(span.agent):
            calls.append(span)
            landed.append(0.0)
            ties.append(None)
        if is_tie_break(span):
            tie = float(span.attributes.get(ATTR_REWARD, 0.0))
            if ties:
                ties[-1] = (ties[-1] or 0.0) + tie
            else:
                early_tie = (early_tie or 0.0) + tie
            continue
        value = _reward(span, air, skip)
        if value is None:
            continue
        rewards.append(value)
        if landed:
            landed[-1] += value
        else:
            early += value
    transitions = [_transition(s, i) for i, s in enumerate(calls)]
    for transition, value, score in zip(transitions, landed, ties, strict=True):
        transition.reward = value
        transition.tie_break = score
    if transitions:
        transitions[0].reward += early
        if early_tie is not None:
            transitions[0].tie_break = (transitions[0].tie_break or 0.0) + early_tie
    return Trajectory(
        rollout_id=rollout.rollout_id,
        attempt_id=attempt_id,
        task_id=rollout.task_id,
        task=rollout.task,
        mode=rollout.mode,
        resources_version=rollout.resources_version,
        status=rollout.status,
        final_reward=rollout.final_reward,
        transitions=transitions,
        rewards=rewards,
        error=rollout.error,
        metadata=rollout.metadata,
    )


def _unmatched_calls(spans: Sequence[Span]) -> str | None:
    """Calls seen by only one of the framework and the gateway, described; None when every call has both records.

    The framework's record of a call (a ``custom`` span, or an ``llm`` span when the call bypassed the gateway)
    carries its call id and ``agl.via_gateway``; the gateway's ``llm`` span carries the same call id (header
    ``x-agl-call-id``) and no ``agl.via_gateway``. An answered call that went through the gateway needs both; a
    gateway call without a call id (sent by a client agl could not tag) may stand for one framework record.
    """
    framework: dict[tuple[str, str], Span] = {}
    gateway: dict[tuple[str, str], Span] = {}
    anonymous: dict[str, int] = {}
    for s in spans:
        call_id = s.attributes.get(ATTR_CALL_ID)
        if ATTR_VIA_GATEWAY in s.attributes:
            if isinstance(call_id, str):
                framework[(s.attempt_id, call_id)] = s
        elif s.kind == "llm":
            if isinstance(call_id, str):
                gateway[(s.attempt_id, call_id)] = s
            else:
                anonymous[s.attempt_id] = anonymous.get(s.attempt_id, 0) + 1
    unrecorded = [
        (key, s)
        for key, s in framework.items()
        if s.attributes[ATTR_VIA_GATEWAY] is True and s.status == "ok" and key not in gateway
    ]
    lost_by_gateway: list[str] = []
    for attempt_id in dict.fromkeys(key[0] for key, _ in unrecorded):
        calls = [(key, s) for key, s in unrecorded if key[0] == attempt_id]
        if len(calls) > anonymous.get(attempt_id, 0):
            lost_by_gateway.extend(f"call {key[1]} of agent {s.agent or '<unnamed>'}" for key, s in calls)
    lost_by_runner = [
        f"call {key[1]} of agent {s.agent or '<unnamed>'}" for key, s in gateway.items() if key not in framework
    ]
    problems: list[str] = []
    if lost_by_gateway:
        problems.append(
            f"{len(lost_by_gateway)} answered LLM call(s) have no gateway llm span (lost before it was stored): "
            + _first(lost_by_gateway)
        )
    if lost_by_runner:
        problems.append(
            f"{len(lost_by_runner)} LLM call(s) recorded by the gateway are missing from the framework's record "
            "(the runner's spans were not all stored): " + _first(lost_by_runner)
        )
    return "; ".join(problems) or None


def _first(items: Sequence[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def check_capture(trajectory: Trajectory, spans: Sequence[Span], require_token_ids: bool) -> CaptureFailure | None:
    """Why a succeeded rollout's recording is unusable, or None when it is fine.

    ``spans`` are those the trajectory was built from. Partial loss (a call the framework recorded that the gateway
    has no ``llm`` span of, or the reverse) is a failure naming the calls; so are no captured call at all, no call
    of a selected agent, (with ``require_token_ids``) selected calls without token ids, and intermediate rewards or
    tie-break scores among several calls some of which carry no runner sequence number (their place, hence the
    rewards', is unknown).
    """
    if trajectory.status != "succeeded":
        return None
    unmatched = _unmatched_calls(spans)
    if unmatched is not None:
        return CaptureFailure(trajectory.rollout_id, f"the rollout succeeded but its recording is partial: {unmatched}")
    llm = [s for s in spans if s.kind == "llm"]
    if not llm:
        return CaptureFailure(
            trajectory.rollout_id,
            "the rollout succeeded but no LLM call was captured: the agent must call the model through the base_url "
            "of the LLM resource it was handed (agl's gateway)",
        )
    if not trajectory.transitions:
        seen = sorted({s.agent or "<unnamed>" for s in llm})
        return CaptureFailure(
            trajectory.rollout_id, f"none of the {len(llm)} LLM calls came from the selected agents (seen: {seen})"
        )
    placed = "intermediate rewards" if trajectory.rewards else None
    if any(t.tie_break is not None for t in trajectory.transitions):
        placed = "intermediate rewards and tie-break scores" if placed else "tie-break scores"
    if placed and len(trajectory.transitions) > 1:
        numbers = {s.span_id: s.sequence for s in spans}
        untagged = [t.step for t in trajectory.transitions if numbers.get(t.span_id) == 0]
        if untagged:
            return CaptureFailure(
                trajectory.rollout_id,
                f"{len(untagged)} of {len(trajectory.transitions)} selected LLM calls (steps {untagged[:5]}) reached "
                f"the gateway without agl's {HEADER_SEQUENCE} header (sent by an HTTP client agl does not tag), so "
                f"the {placed} cannot be placed on the right calls: call the model with the openai client or httpx",
            )
    if require_token_ids:
        missing = [t.step for t in trajectory.transitions if not t.has_token_ids]
        if missing:
            return CaptureFailure(
                trajectory.rollout_id,
                f"{len(missing)} of {len(trajectory.transitions)} selected LLM calls have no token ids (steps "
                f"{missing[:5]}): the backend must return them (vLLM or agl.serving with return_token_ids)",
            )
    return None
