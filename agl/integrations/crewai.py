"""CrewAI capture: crews, tasks, agents, model calls, tools and errors of a rollout, with no change to agent code.

What is recorded (only while an agl rollout is current; outside one every hook returns after one check):

- ``custom`` span ``crewai.crew`` per crew kickoff and ``crewai.task`` per task run (the task's under its crew's).
- ``agent`` span per agent execution of a task (``Agent.execute_task``), name = the agent's role, under its task's
  span (under the calling tool's span for delegated work): ``gen_ai.agent.name``, ``gen_ai.agent.id``, the task
  prompt and the tools it was given. Status ``error`` when the execution raised.
- one span per model call, named ``crewai.llm_call``: model, provider, ``agl.call_id``, the response as an OpenAI
  assistant message (a ReAct ``Action:``/``Action Input:`` reply also as ``tool_calls``), ``crewai.call_type``,
  usage when the provider reported it, ``agl.stream``. When the call went through agl's gateway, the gateway's own
  ``llm`` span (exact token ids) is THE record of the call, so this span is kind ``custom``, joined to the gateway
  span by ``agl.call_id`` and by being its parent. When it did not (another provider, a hard-coded URL), this span
  is kind ``llm`` and also holds the request messages and the tool definitions offered, so capture still sees the
  call and training reports its missing token ids as a capture failure.
- ``tool`` span per tool run: ``gen_ai.tool.name``, ``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``,
  ``crewai.from_cache``; status ``error`` (``error.type`` / ``error.message``) when the tool raised. CrewAI feeds a
  tool's error back to the agent as its observation and retries the tool, so each failed try is one span and the
  rollout goes on. An action naming a tool that does not exist runs no tool and records none (the model call's
  response shows the action; CrewAI answers it with an error observation).
- ``exception`` span for each exception raised by a tool or out of an agent execution (once per exception object).
  An agent error CrewAI gives up on fails the task, the crew and so the rollout, with the exception's message.

Agent naming rule: the agent of every span above, of the gateway's ``llm`` span (``x-agl-agent``) and of
``agl.emit_reward`` calls inside an agent's tools is the CrewAI agent's ``role`` (as interpolated for the run, as
CrewAI's own events report it). ``Trainer(agents=["Researcher"])`` selects a role; as everywhere in agl a ``/`` in a
name separates nesting levels.

How events are observed. CrewAI's event bus runs ordinary listeners later, in a thread pool, in no set order, and in
crewai 1.6 its events carry no call or parent ids; a model call's HTTP request may be sent before any listener has
run. So agl taps the bus itself: it wraps ``CrewAIEventsBus.emit`` once per process and handles each event inline,
in the emitting thread and context, before the bus dispatches it as usual. Nothing needs flushing at rollout end.
``Agent.execute_task`` is wrapped to open the agent's span and set ``agl.agent_scope(role)`` around its work, and
``BaseLLM._track_token_usage_internal`` to read the usage of the call it reports.

Joining with the gateway. ``LLMCallStartedEvent`` is emitted by the model call itself, in the thread and context that
then sends the request: handling it pushes the call onto a ContextVar; agl wraps ``httpx``/``httpx2`` ``send`` once
per process (:mod:`agl.integrations._http`), and a request to the CURRENT rollout's gateway route made in that
context takes the innermost open call and gets ``x-agl-agent`` (the role), ``x-agl-call-id`` and
``x-agl-parent-span`` headers. The completion / failure event of the call, emitted in the same context, pops it.

Concurrency model: the recorder is one process-wide object; its tables (open crews, tasks and agent executions, keyed
by CrewAI's ids) are guarded by one lock, so events from any thread are safe. Which call an HTTP request belongs to
never comes from shared state: it comes from the request's own context. CrewAI runs async tasks in their own threads
and ``kickoff_async`` in a worker thread; every model call sends its request from the thread that emitted its start
event (crewai's native providers use the blocking OpenAI/httpx client), so two agents working at the same time
cannot see each other's call. Parents are found from CrewAI's own ids (task id, agent id), so they are right even in
threads that did not inherit the caller's context (``max_execution_time`` runs the agent in a bare thread pool).
Errors inside the integration are logged, never raised into the agent.

Telemetry: CrewAI's anonymous telemetry (to telemetry.crewai.com, with its own OpenTelemetry tracer provider as the
global one) is off in runner processes (``CREWAI_DISABLE_TELEMETRY``, set before the agent is imported) and
:func:`install` switches it off if it was on; ``AGL_KEEP_FRAMEWORK_TELEMETRY=1`` keeps it. CrewAI's trace upload is
opt-in (``CREWAI_TRACING_ENABLED``) and left as the user set it. See :mod:`agl.core.telemetry`.

Zero config: runners enter :func:`activate` around each rollout of an agent that uses CrewAI (imports ``crewai``);
it calls :func:`install` (idempotent).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from crewai.agent.core import Agent
from crewai.agents.parser import AgentAction, OutputParserError
from crewai.agents.parser import parse as parse_react
from crewai.events import (
    AgentExecutionStartedEvent,
    CrewKickoffCompletedEvent,
    CrewKickoffFailedEvent,
    CrewKickoffStartedEvent,
    LLMCallCompletedEvent,
    LLMCallFailedEvent,
    LLMCallStartedEvent,
    TaskCompletedEvent,
    TaskFailedEvent,
    TaskStartedEvent,
    ToolUsageErrorEvent,
    ToolUsageFinishedEvent,
    ToolUsageStartedEvent,
)
from crewai.events.event_bus import CrewAIEventsBus
from crewai.llms.base_llm import BaseLLM
from crewai.telemetry import Telemetry
from opentelemetry import trace

from agl.core.emit import RolloutContext, agent_scope, current_agent, current_rollout, current_scope
from agl.core.jsonsafe import jsonable
from agl.core.telemetry import keep_framework_telemetry
from agl.core.types import (
    ATTR_AGENT_ID,
    ATTR_AGENT_NAME,
    ATTR_CALL_ID,
    ATTR_ERROR_MESSAGE,
    ATTR_ERROR_TYPE,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROVIDER,
    ATTR_STREAM,
    ATTR_TOOL_RESULT,
    ATTR_TOOLS,
)
from agl.integrations._capture import Integration, OpenCall, OpenSpan, SpanTable
from agl.integrations._http import CallTag, gateway_marker
from agl.integrations._patch import Patches, Verified

__all__ = ["LLM_SPAN_NAME", "activate", "install"]

log = logging.getLogger("agl.integrations.crewai")

LLM_SPAN_NAME = "crewai.llm_call"
CREW_SPAN_NAME = "crewai.crew"
TASK_SPAN_NAME = "crewai.task"


# --------------------------------------------------------------------------------------------------- records


@dataclass(eq=False, kw_only=True)
class _Call(OpenCall):
    """An open model call, as the HTTP hook and the completion event see it."""

    source: Any = None
    messages: Any = None
    tools: Any = None
    usage: dict[str, Any] | None = None


#: Agent executions, model calls and tool runs open in this context, innermost last (tuples: contexts copy safely).
_frames: contextvars.ContextVar[tuple[OpenSpan, ...]] = contextvars.ContextVar("agl_crewai_frames", default=())
_calls: contextvars.ContextVar[tuple[_Call, ...]] = contextvars.ContextVar("agl_crewai_calls", default=())
_tools: contextvars.ContextVar[tuple[OpenSpan, ...]] = contextvars.ContextVar("agl_crewai_tools", default=())

_S = TypeVar("_S", bound=OpenSpan)


def _innermost(stack: tuple[_S, ...], ctx: RolloutContext) -> _S | None:
    return stack[-1] if stack and stack[-1].ctx is ctx else None


class _Recorder:
    """Turns CrewAI events into spans of the current rollout. One per process."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._crews: SpanTable[str, OpenSpan] = SpanTable(self._lock)  # crew id → open crew span
        self._task_crew: SpanTable[str, OpenSpan] = SpanTable(self._lock)  # task id → open span of its crew
        self._tasks: SpanTable[str, OpenSpan] = SpanTable(self._lock)  # task id → open task span
        self._agents: dict[tuple[str, str], list[OpenSpan]] = {}  # (agent id, task id) → open executions

    def discard(self, ctx: RolloutContext) -> None:
        """Forget what a finished rollout left open (a crew abandoned mid-run, a killed thread)."""
        with self._lock:
            for table in (self._crews, self._task_crew, self._tasks):
                table.discard(ctx)
            for pair, frames in list(self._agents.items()):
                frames[:] = [f for f in frames if f.ctx is not ctx]
                if not frames:
                    del self._agents[pair]

    def _execution(self, ctx: RolloutContext, agent_id: str | None, task_id: str | None) -> OpenSpan | None:
        """The open execution of this agent on this task (found by CrewAI's ids, whatever the thread)."""
        if agent_id is None or task_id is None:
            return None
        with self._lock:
            frames = self._agents.get((agent_id, task_id))
            return frames[-1] if frames and frames[-1].ctx is ctx else None

    def _parent(self, ctx: RolloutContext, agent_id: str | None, task_id: str | None) -> tuple[str | None, str | None]:
        """(agent, parent span) of a model call or tool run: the agent execution it reports, else the tool or agent
        execution open in this context (a model call made by a tool's own code), else the current scope."""
        rec = self._execution(ctx, agent_id, task_id) or _innermost(_tools.get(), ctx) or _innermost(_frames.get(), ctx)
        return (rec.agent, rec.span_id) if rec is not None else current_scope()

    # crews and tasks -------------------------------------------------------------------------------------------
    def crew_started(self, ctx: RolloutContext, crew: Any, event: CrewKickoffStartedEvent) -> None:
        rec = OpenSpan(ctx=ctx, name=CREW_SPAN_NAME, agent=current_agent(), parent=current_scope()[1])
        rec.attrs.update(
            {
                "crewai.crew.name": event.crew_name,
                "crewai.crew.id": str(crew.id),
                "crewai.process": str(getattr(crew.process, "value", crew.process)),
                "crewai.inputs": jsonable(event.inputs),
            }
        )
        with self._lock:
            self._crews.add(str(crew.id), rec, replace=True)
            for task in crew.tasks:
                self._task_crew.add(str(task.id), rec, replace=True)

    def crew_ended(self, crew: Any, output: Any = None, error: str | None = None) -> None:
        with self._lock:
            rec = self._crews.pop(str(crew.id))
            for task in crew.tasks:
                self._task_crew.pop(str(task.id))
        _ended(rec, output, error)

    def task_started(self, ctx: RolloutContext, task: Any) -> None:
        task_id = str(task.id)
        crew = self._task_crew.get(task_id)
        parent = crew.span_id if crew is not None and crew.ctx is ctx else current_scope()[1]
        rec = OpenSpan(ctx=ctx, name=TASK_SPAN_NAME, agent=getattr(task.agent, "role", None), parent=parent)
        rec.attrs.update(
            {
                "crewai.task.id": task_id,
                "crewai.task.name": task.name or task.description,
                "crewai.task.description": task.description,
                "crewai.task.expected_output": task.expected_output,
                "crewai.task.async_execution": bool(task.async_execution),
            }
        )
        self._tasks.add(task_id, rec, replace=True)

    def task_ended(self, task: Any, output: Any = None, error: str | None = None) -> None:
        _ended(self._tasks.pop(str(task.id)), output, error)

    # agent executions ------------------------------------------------------------------------------------------
    def agent_started(self, ctx: RolloutContext, agent: Any, task: Any) -> OpenSpan:
        task_id = str(getattr(task, "id", ""))
        task_rec = self._tasks.get(task_id)
        # no task span: delegated work (the delegation tool makes up a task) or a task run outside a crew
        parent = task_rec.span_id if task_rec is not None and task_rec.ctx is ctx else self._parent(ctx, None, None)[1]
        rec = OpenSpan(ctx=ctx, name=str(agent.role), agent=str(agent.role), parent=parent)
        rec.attrs.update(
            {
                ATTR_OPERATION: "invoke_agent",
                ATTR_AGENT_NAME: str(agent.role),
                ATTR_AGENT_ID: str(agent.id),
                "crewai.task.id": task_id,
            }
        )
        with self._lock:
            self._agents.setdefault((str(agent.id), task_id), []).append(rec)
        return rec

    def agent_described(self, ctx: RolloutContext, event: AgentExecutionStartedEvent) -> None:
        frame = self._execution(ctx, str(event.agent.id), str(getattr(event.task, "id", "")))
        if frame is None:
            return
        frame.attrs["crewai.task_prompt"] = event.task_prompt
        frame.attrs["crewai.tools"] = [getattr(t, "name", str(t)) for t in event.tools or []]

    def agent_ended(self, rec: OpenSpan, agent: Any, task: Any, error: BaseException | None) -> None:
        with self._lock:
            key = (str(agent.id), str(getattr(task, "id", "")))
            frames = self._agents.get(key, [])
            if rec in frames:
                frames.remove(rec)
            if not frames:
                self._agents.pop(key, None)
        if error is None:
            rec.finish("agent")
            return
        rec.fail(error)
        rec.finish("agent", "error")

    # model calls -----------------------------------------------------------------------------------------------
    def llm_started(self, ctx: RolloutContext, source: Any, event: LLMCallStartedEvent) -> None:
        agent, parent = self._parent(ctx, event.agent_id, event.task_id)
        agent = event.agent_role or agent
        call = _Call(
            ctx=ctx,
            name=LLM_SPAN_NAME,
            agent=agent,
            parent=parent,
            source=source,
            messages=event.messages,
            tools=event.tools,
        )
        call.call_id = call.span_id
        base_url = getattr(source, "base_url", None) or getattr(source, "api_base", None)
        call.gateway_url = isinstance(base_url, str) and gateway_marker(ctx) in base_url
        call.attrs.update(
            {
                ATTR_OPERATION: "chat",
                ATTR_CALL_ID: call.call_id,
                ATTR_MODEL: event.model,
                ATTR_STREAM: bool(getattr(source, "stream", False)),
            }
        )
        provider = getattr(source, "provider", None)
        if isinstance(provider, str):
            call.attrs[ATTR_PROVIDER] = provider
        if agent is not None:
            call.attrs[ATTR_AGENT_NAME] = agent
        if event.task_name is not None:
            call.attrs["crewai.task.name"] = event.task_name
        _calls.set((*(c for c in _calls.get() if c.ctx is ctx), call))  # drops what an earlier rollout left here

    def _pop_call(self, ctx: RolloutContext, source: Any) -> _Call | None:
        """Take the innermost open call of ``source`` in this context (None when its start was not seen)."""
        calls = _calls.get()
        for i in range(len(calls) - 1, -1, -1):
            call = calls[i]
            if call.source is source and call.ctx is ctx:
                _calls.set(calls[:i] + calls[i + 1 :])
                return call
        return None

    def llm_ended(self, ctx: RolloutContext, source: Any, event: LLMCallCompletedEvent | LLMCallFailedEvent) -> None:
        call = self._pop_call(ctx, source)
        if call is None:  # a provider reports a failure twice: the first report closed the call
            return
        kind = call.gateway_kind()
        attrs = call.attrs
        if call.usage:
            attrs[ATTR_INPUT_TOKENS] = call.usage.get("prompt_tokens")
            attrs[ATTR_OUTPUT_TOKENS] = call.usage.get("completion_tokens")
        messages = call.messages
        if isinstance(event, LLMCallFailedEvent):
            attrs[ATTR_ERROR_MESSAGE] = event.error
        else:
            messages = event.messages if event.messages is not None else messages
            attrs["crewai.call_type"] = event.call_type.value
            attrs[ATTR_OUTPUT_MESSAGES] = [_assistant_message(event.response)]
        if kind == "llm":
            attrs[ATTR_INPUT_MESSAGES] = _messages(messages)
            if call.tools:
                attrs[ATTR_TOOLS] = jsonable(call.tools)
        call.finish(kind, "error" if isinstance(event, LLMCallFailedEvent) else "ok")

    def tag(self, ctx: RolloutContext) -> CallTag | None:
        """The tag of the innermost open model call of THIS context, which a gateway request being sent belongs to
        (marked as sent)."""
        call = _innermost(_calls.get(), ctx)
        return call.take() if call is not None else None

    def usage(self, source: Any, usage: Any) -> None:
        """Usage a provider reported for the innermost open call of ``source`` in this context."""
        calls = _calls.get()
        if calls and calls[-1].source is source and isinstance(usage, dict):
            calls[-1].usage = dict(usage)

    # tools ----------------------------------------------------------------------------------------------------
    def _tool_agent_id(self, event: Any) -> str | None:
        agent = getattr(event, "agent", None)
        return str(agent.id) if agent is not None and hasattr(agent, "id") else event.agent_id

    def tool_started(self, ctx: RolloutContext, event: ToolUsageStartedEvent) -> None:
        agent, parent = self._parent(ctx, self._tool_agent_id(event), event.task_id)
        rec = self._new_tool(ctx, event, event.agent_role or agent, parent)
        _tools.set((*(t for t in _tools.get() if t.ctx is ctx), rec))

    def _new_tool(self, ctx: RolloutContext, event: Any, agent: str | None, parent: str | None) -> OpenSpan:
        rec = OpenSpan(ctx=ctx, name=event.tool_name, agent=agent, parent=parent)
        rec.describe_tool(event.tool_name, event.tool_args)
        if agent is not None:
            rec.attrs[ATTR_AGENT_NAME] = agent
        return rec

    def _pop_tool(self, ctx: RolloutContext, event: Any) -> OpenSpan:
        """The run this end event closes (the innermost open one of this context: runs nest); a fresh record when
        its start was not reported (CrewAI reports none for a tool used without an agent)."""
        tools = _tools.get()
        rec = _innermost(tools, ctx)
        if rec is None:
            agent, parent = self._parent(ctx, self._tool_agent_id(event), event.task_id)
            return self._new_tool(ctx, event, event.agent_role or agent, parent)
        _tools.set(tools[:-1])
        # the start reported the name and input as the model wrote them; the end reports the tool and parsed input
        rec.name = event.tool_name
        rec.describe_tool(event.tool_name, event.tool_args)
        return rec

    def tool_finished(self, ctx: RolloutContext, event: ToolUsageFinishedEvent) -> None:
        rec = self._pop_tool(ctx, event)
        rec.attrs[ATTR_TOOL_RESULT] = jsonable(event.output)
        rec.attrs["crewai.from_cache"] = event.from_cache
        rec.finish("tool", start=_timestamp(event.started_at, rec.start))

    def tool_failed(self, ctx: RolloutContext, event: ToolUsageErrorEvent) -> None:
        rec = self._pop_tool(ctx, event)
        error = event.error
        if isinstance(error, BaseException):
            rec.fail(error)
        else:
            rec.attrs[ATTR_ERROR_TYPE] = "ToolError"
            rec.attrs[ATTR_ERROR_MESSAGE] = str(error)
        rec.finish("tool", "error")


def _ended(rec: OpenSpan | None, output: Any, error: str | None) -> None:
    """Record a crew's or task's span at its end, with its output or the error CrewAI reported."""
    if rec is None:
        return
    if error is not None:
        rec.attrs[ATTR_ERROR_MESSAGE] = error
        rec.finish("custom", "error")
        return
    rec.attrs["crewai.output"] = jsonable(getattr(output, "raw", output))
    rec.finish("custom")


_RECORDER = _Recorder()


# --------------------------------------------------------------------------------------------------- helpers


def _timestamp(value: Any, default: float) -> float:
    return value.timestamp() if isinstance(value, datetime) else default


def _messages(messages: Any) -> list[dict[str, Any]]:
    """Request messages in OpenAI chat format (CrewAI passes a plain string for one user message)."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [m if isinstance(m, dict) else {"role": "user", "content": str(m)} for m in jsonable(messages or [])]


def _assistant_message(response: Any) -> dict[str, Any]:
    """The response as an OpenAI assistant message; a ReAct tool request also becomes ``tool_calls``."""
    if not isinstance(response, str):
        return {"role": "assistant", "content": jsonable(response)}
    message: dict[str, Any] = {"role": "assistant", "content": response}
    if "Action:" in response and "Final Answer:" not in response:
        try:
            parsed = parse_react(response)
        except OutputParserError:
            return message
        if isinstance(parsed, AgentAction):
            message["tool_calls"] = [
                {"type": "function", "function": {"name": parsed.tool, "arguments": parsed.tool_input}}
            ]
    return message


# ----------------------------------------------------------------------------------------------------- hooks

_Handler = Callable[[RolloutContext, Any, Any], None]

_HANDLERS: dict[type, _Handler] = {
    CrewKickoffStartedEvent: lambda ctx, src, ev: _RECORDER.crew_started(ctx, src, ev),
    CrewKickoffCompletedEvent: lambda ctx, src, ev: _RECORDER.crew_ended(src, output=ev.output),
    CrewKickoffFailedEvent: lambda ctx, src, ev: _RECORDER.crew_ended(src, error=ev.error),
    TaskStartedEvent: lambda ctx, src, ev: _RECORDER.task_started(ctx, src),
    TaskCompletedEvent: lambda ctx, src, ev: _RECORDER.task_ended(src, output=ev.output),
    TaskFailedEvent: lambda ctx, src, ev: _RECORDER.task_ended(src, error=ev.error),
    AgentExecutionStartedEvent: lambda ctx, src, ev: _RECORDER.agent_described(ctx, ev),
    LLMCallStartedEvent: _RECORDER.llm_started,
    LLMCallCompletedEvent: _RECORDER.llm_ended,
    LLMCallFailedEvent: _RECORDER.llm_ended,
    ToolUsageStartedEvent: lambda ctx, src, ev: _RECORDER.tool_started(ctx, ev),
    ToolUsageFinishedEvent: lambda ctx, src, ev: _RECORDER.tool_finished(ctx, ev),
    ToolUsageErrorEvent: lambda ctx, src, ev: _RECORDER.tool_failed(ctx, ev),
}


def _observe(source: Any, event: Any) -> None:
    """Handle one CrewAI event inline (in the emitter's thread and context); never raises."""
    ctx = current_rollout()
    if ctx is None:
        return
    handler = _HANDLERS.get(type(event))
    if handler is None:
        return
    try:
        handler(ctx, source, event)
    except Exception:
        log.warning("agl CrewAI capture failed on %s", type(event).__name__, exc_info=True)


def _wrap_emit(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def emit(self: Any, source: Any, event: Any) -> Any:
        _observe(source, event)
        return original(self, source, event)

    return emit


def _wrap_execute_task(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def execute_task(self: Any, task: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = current_rollout()
        if ctx is None:
            return original(self, task, *args, **kwargs)
        try:
            frame = _RECORDER.agent_started(ctx, self, task)
        except Exception:
            log.warning("agl CrewAI capture failed to open an agent span", exc_info=True)
            return original(self, task, *args, **kwargs)
        tokens = (_frames.set((*_frames.get(), frame)), _calls.set(()), _tools.set(()))
        error: BaseException | None = None
        try:
            with agent_scope(str(self.role)):
                return original(self, task, *args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            _tools.reset(tokens[2])
            _calls.reset(tokens[1])
            _frames.reset(tokens[0])
            try:
                _RECORDER.agent_ended(frame, self, task, error)
            except Exception:
                log.warning("agl CrewAI capture failed to close an agent span", exc_info=True)

    return execute_task


def _wrap_track_usage(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def track(self: Any, usage: Any, *args: Any, **kwargs: Any) -> Any:
        if current_rollout() is not None:
            _RECORDER.usage(self, usage)
        return original(self, usage, *args, **kwargs)

    return track


def _framework_scope() -> tuple[str | None, str | None]:
    """(agent, parent span) of the tool or agent execution whose code is running here, for ``agl.emit_*``."""
    ctx = current_rollout()
    if ctx is None:
        return None, None
    rec = _innermost(_tools.get(), ctx) or _innermost(_frames.get(), ctx)
    return (rec.agent, rec.span_id) if rec is not None else (None, None)


_PATCHES = Patches("crewai")


#: CrewAI's own switch for its telemetry (see ``agl.core.telemetry``).
TELEMETRY_SWITCH = "CREWAI_DISABLE_TELEMETRY"


def _quiet_telemetry() -> None:
    """Switch off CrewAI's anonymous telemetry in this process, unless it is kept (``AGL_KEEP_FRAMEWORK_TELEMETRY``,
    or ``CREWAI_DISABLE_TELEMETRY`` set to anything but true).

    Runner processes set ``CREWAI_DISABLE_TELEMETRY`` before crewai is imported, and crewai then builds nothing. When
    crewai was imported before (a runner re-imports the trainer script's ``__main__``; ``install()`` in a program of
    one's own), its ``Telemetry`` is marked not ready, which it checks before every operation, and its tracer
    provider, if it became OpenTelemetry's global one, is shut down (in a thread: spans it already holds would be
    sent on the way) so no other library's spans go to CrewAI either. A provider the program installed is left as is.
    """
    if keep_framework_telemetry() or os.environ.get(TELEMETRY_SWITCH, "true").strip().lower() != "true":
        return
    telemetry = Telemetry()
    if not telemetry.ready:
        return
    telemetry.ready = False
    provider = getattr(telemetry, "provider", None)
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None and provider is trace.get_tracer_provider():
        threading.Thread(target=shutdown, name="agl-crewai-telemetry-off", daemon=True).start()
    log.info("CrewAI's telemetry was on in this process (crewai was imported before agl could switch it off); now off")


def _hook() -> None:
    _quiet_telemetry()
    _PATCHES.wrap(CrewAIEventsBus, "emit", _wrap_emit)
    _PATCHES.wrap(Agent, "execute_task", _wrap_execute_task)
    _PATCHES.wrap(BaseLLM, "_track_token_usage_internal", _wrap_track_usage)


_INTEGRATION = Integration(
    verified=Verified("crewai", "1.6", "1.7"),
    hook=_hook,
    scope_resolver=_framework_scope,
    tagger=_RECORDER.tag,
    forget=_RECORDER.discard,
)


def install() -> None:
    """Capture every crew, task, agent, model call and tool run while a rollout is current. Idempotent.

    Taps the event bus, wraps ``Agent.execute_task`` and the usage report of ``BaseLLM``, and registers the
    ``agl.emit_*`` scope resolver and the gateway headers on httpx clients. Switches CrewAI's own telemetry off in
    this process unless ``AGL_KEEP_FRAMEWORK_TELEMETRY`` keeps it (see ``agl.core.telemetry``).
    """
    _INTEGRATION.install()


def activate() -> AbstractContextManager[None]:
    """Capture CrewAI for the rollout current when entered; what runners wrap each agent call in.

    Enter it inside ``rollout_scope``; on exit, crews, tasks and agent executions of that rollout that never ended
    are forgotten.
    """
    return _INTEGRATION.activate()
