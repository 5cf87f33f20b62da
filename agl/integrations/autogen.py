"""AutoGen (autogen-agentchat / autogen-core 0.7) capture: agents, tools, model calls and errors, agent code unchanged.

What is recorded (only while an agl rollout is current; outside one every hook hands straight through to AutoGen):

- ``agent`` span per agent invocation: ``agent.run`` / ``run_stream`` and every turn an agent takes in a team
  (``RoundRobinGroupChat``, ``SelectorGroupChat``, ``Swarm``, ...): name = the agent's name, ``gen_ai.agent.name``,
  ``gen_ai.agent.id`` (the runtime's ``AgentId`` inside a team), ``gen_ai.agent.description``; parent of everything
  the agent does (model calls, tools, nested agents such as an ``AgentTool``). Status ``error`` when the agent raised.
- one span per model call (``ChatCompletionClient.create`` / ``create_stream``, any client), named
  ``autogen.chat_completion``, with ``agl.call_id``, ``agl.stream``, the response message (text or tool calls, in
  OpenAI format), finish reason and usage. When the call went through agl's gateway, the gateway's own ``llm`` span
  (exact token ids) is THE record of the call, so this span is kind ``custom``, joined to it by ``agl.call_id`` and
  by being its parent. When the call did not reach the gateway (another provider, a hard-coded URL, a cache hit),
  this span is kind ``llm`` with the request messages and tool definitions too, so capture still sees the call and
  training reports its missing token ids as a capture failure.
- ``tool`` span per tool run (``BaseTool.run_json`` / ``run_json_stream``, which AutoGen's workbench calls):
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``; status
  ``error`` (with ``error.type`` / ``error.message``) when the tool raised. AutoGen catches a tool's error and hands its
  text to the model as the tool result, so a failing tool does not fail the rollout by itself.
- ``exception`` span for each error raised in a model call, tool or agent (once per exception object, where it was
  first seen). An agent's error ends a team run with AutoGen's ``RuntimeError``, which fails the rollout.

Agent naming rule (the ``agent`` of every span above, and the ``x-agl-agent`` the gateway stores on its span):

1. an explicit ``agl.agent_scope(name)`` around the code wins;
2. else the name of the AutoGen agent being invoked (innermost, for nested agents);
3. else, inside an AutoGen runtime message handler, its ``AgentId`` type without the team-id suffix
   (``SelectorGroupChatManager`` for a selector's speaker-choice calls).

``Trainer(agents=["solver"])`` selects the model calls of the agent named ``solver``.

Hooks. AutoGen's event logger (``autogen_core.EVENT_LOGGER_NAME``) is not used: its events are emitted at INFO and
reach a handler only if that logger is enabled, which would also send them to the application's own handlers; a
failing tool or model call logs nothing; and a non-streaming call logs only after it returned, too late to tag its
HTTP request. Instead :func:`install` wraps, once per process, the native seams every agent goes through:
``trace_invoke_agent_span`` (the helper AutoGen itself calls around each agent invocation), ``create`` /
``create_stream`` of every ``ChatCompletionClient`` implementation (present and future subclasses), and the tool
entry points. :func:`uninstall` puts AutoGen's own functions back.

Joining with the gateway. A model call pushes itself onto a ContextVar before it starts; agl wraps ``httpx`` /
``httpx2`` ``send`` once per process (:mod:`agl.integrations._http`), and a request to the CURRENT rollout's
gateway route made in that context takes the open call and gets ``x-agl-agent``, ``x-agl-call-id`` and
``x-agl-parent-span`` headers. No token is ever re-computed.

Concurrency model: nothing about "the current agent" or "the current call" is shared state. The agent invocation,
the tool run and the open model call live in ContextVars of the asyncio task doing the work. AutoGen runs each
team turn in its own task, ``asyncio.gather`` gives each agent its own task, and the OpenAI client sends each
request from a task created (``ensure_future``) inside the model call, i.e. from a copy of the call's context, so
two agents running concurrently in one rollout can never see each other's call. Synchronous function tools run in a
thread pool, which does not carry ContextVars: inside a rollout agl runs them in a copy of the caller's context, so
``agl.emit_reward`` in a tool carries that tool's agent (and parent span). Errors inside the integration are logged,
never raised into the agent.

Telemetry: AutoGen exports nothing itself. Its own OpenTelemetry spans (agents, tools) go to OpenTelemetry's global
tracer provider: the program's, when it installed one (left as is), else nowhere. Runners import no other framework
for an AutoGen agent, so no other framework's provider (CrewAI installs one of its own) can collect them. See
:mod:`agl.core.telemetry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import importlib
import inspect
import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from typing import Any

import autogen_core
from autogen_core import FunctionCall, MessageHandlerContext
from autogen_core.models import (
    AssistantMessage,
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResultMessage,
    SystemMessage,
    UserMessage,
)
from autogen_core.tools import BaseStreamTool, BaseTool, FunctionTool

from agl.core.emit import RolloutContext, current_agent, current_rollout, current_scope
from agl.core.jsonsafe import jsonable
from agl.core.types import (
    ATTR_AGENT_ID,
    ATTR_AGENT_NAME,
    ATTR_CALL_ID,
    ATTR_FINISH_REASONS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_STREAM,
    ATTR_TOOL_RESULT,
    ATTR_TOOLS,
    SpanKind,
    new_id,
)
from agl.integrations._capture import CallStack, Integration, OpenCall, OpenSpan
from agl.integrations._http import CallTag
from agl.integrations._patch import Patches, Verified

__all__ = ["CALL_SPAN_NAME", "activate", "install", "uninstall"]

log = logging.getLogger("agl.integrations.autogen")

ATTR_AGENT_DESCRIPTION = "gen_ai.agent.description"
ATTR_AGENT_TYPE = "autogen.agent.type"
ATTR_CLIENT = "autogen.model_client"
ATTR_CACHED = "autogen.cached"
ATTR_THOUGHT = "autogen.thought"
ATTR_CLOSED_EARLY = "autogen.stream_closed_early"

CALL_SPAN_NAME = "autogen.chat_completion"


# ------------------------------------------------------------------------------------------------------ scopes


@dataclass(eq=False)
class _Scope:
    """The AutoGen agent invocation or tool run whose code is running in this context."""

    ctx: RolloutContext
    agent: str | None
    agent_id: str | None
    span_id: str | None


@dataclass(eq=False, kw_only=True)
class _Call(OpenCall):
    """An open model call as the HTTP hook sees it."""

    call_id: str | None = field(default_factory=lambda: new_id("ag"))
    messages: Sequence[Any]
    tools: Any
    stream: bool


_scope: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("agl_autogen_scope", default=None)
#: Model calls started in this context.
_calls: CallStack[_Call] = CallStack("agl_autogen_calls")


def _runtime_agent() -> tuple[str | None, str | None, str | None]:
    """(name, id, type) of the AutoGen runtime agent whose message handler runs here; Nones outside one.

    Teams register each participant as type ``<name>_<team id>`` with key ``<team id>``: the name is the type
    without that suffix.
    """
    try:
        agent_id = MessageHandlerContext.agent_id()
    except RuntimeError:
        return None, None, None
    suffix = f"_{agent_id.key}"
    name = agent_id.type[: -len(suffix)] if agent_id.type.endswith(suffix) else agent_id.type
    return name or None, str(agent_id), agent_id.type


def _here(ctx: RolloutContext) -> tuple[str | None, str | None, str | None]:
    """(agent name, agent id, parent span) for a span starting here, by the naming rule of the module docs."""
    scope = _scope.get()
    explicit = current_agent()
    if scope is not None and scope.ctx is ctx:
        return explicit or scope.agent, scope.agent_id, scope.span_id
    name, agent_id, _ = _runtime_agent()
    return explicit or name, agent_id, current_scope()[1]


def _autogen_scope() -> tuple[str | None, str | None]:
    """(agent, parent span) of the AutoGen agent or tool whose code is running here, for ``agl.emit_*``."""
    scope = _scope.get()
    if scope is not None and scope.ctx is current_rollout():
        return scope.agent, scope.span_id
    return _runtime_agent()[0], None


def _restore(var: contextvars.ContextVar[Any], token: contextvars.Token[Any], previous: Any) -> None:
    """Undo ``var.set``; an async generator may be finished from another context, where only a plain set works."""
    try:
        var.reset(token)
    except ValueError:
        var.set(previous)


def _fail(span: OpenSpan, exc: BaseException) -> str:
    """Describe an error on a span and record it once; returns the span's status."""
    if isinstance(exc, GeneratorExit):  # the consumer stopped iterating: not a failure
        span.attrs[ATTR_CLOSED_EARLY] = True
        return "ok"
    span.fail(exc)
    return "error"


@contextlib.contextmanager
def _recorded(span: OpenSpan, scope: _Scope, kind: SpanKind) -> Iterator[None]:
    """Run the body with ``scope`` as this context's AutoGen scope, then record ``span`` (failed if the body raised)."""
    previous = _scope.get()
    token = _scope.set(scope)
    status = "ok"
    try:
        yield
    except BaseException as exc:
        status = _fail(span, exc)
        raise
    finally:
        _restore(_scope, token, previous)
        span.finish(kind, status)


# ------------------------------------------------------------------------------------------------------ agents


@contextlib.contextmanager
def _agent_run(
    inner: ContextManager[Any], ctx: RolloutContext, name: str, agent_id: str | None, description: str | None
) -> Iterator[Any]:
    """Record one agent invocation around AutoGen's own ``trace_invoke_agent_span``."""
    parent = _here(ctx)[2]
    _, runtime_id, runtime_type = _runtime_agent()
    span = OpenSpan(ctx=ctx, name=name, agent=current_agent() or name, parent=parent)
    scope = _Scope(ctx, name, agent_id or runtime_id, span.span_id)
    span.attrs.update({ATTR_OPERATION: "invoke_agent", ATTR_AGENT_NAME: name})
    if scope.agent_id is not None:
        span.attrs[ATTR_AGENT_ID] = scope.agent_id
    if runtime_type is not None:
        span.attrs[ATTR_AGENT_TYPE] = runtime_type
    if description:
        span.attrs[ATTR_AGENT_DESCRIPTION] = description
    with _recorded(span, scope, "agent"), inner as otel_span:
        yield otel_span


def _wrap_invoke_agent_span(original: Callable[..., ContextManager[Any]]) -> Callable[..., ContextManager[Any]]:
    @functools.wraps(original)
    def trace_invoke_agent_span(agent_name: str, *args: Any, **kwargs: Any) -> ContextManager[Any]:
        inner = original(agent_name, *args, **kwargs)
        ctx = current_rollout()
        if ctx is None:
            return inner
        return _agent_run(inner, ctx, agent_name, kwargs.get("agent_id"), kwargs.get("agent_description"))

    return trace_invoke_agent_span


# ------------------------------------------------------------------------------------------------------- tools


@contextlib.contextmanager
def _tool_run(ctx: RolloutContext, tool: BaseTool[Any, Any], args: Any, call_id: str | None) -> Iterator[OpenSpan]:
    """Record one tool run; its code sees the tool as its scope (for ``agl.emit_*``)."""
    agent, agent_id, parent = _here(ctx)
    span = OpenSpan(ctx=ctx, name=tool.name, agent=agent, parent=parent)
    span.describe_tool(tool.name, args, call_id)
    if agent is not None:
        span.attrs[ATTR_AGENT_NAME] = agent
    with _recorded(span, _Scope(ctx, agent, agent_id, span.span_id), "tool"):
        yield span


def _tool_call_id(rest: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """``call_id`` of ``run_json(args, cancellation_token, call_id=None)``, however it was passed."""
    call_id = kwargs.get("call_id", rest[1] if len(rest) > 1 else None)
    return call_id if isinstance(call_id, str) else None


def _set_result(span: OpenSpan, tool: BaseTool[Any, Any], value: Any) -> None:
    try:
        span.attrs[ATTR_TOOL_RESULT] = tool.return_value_as_string(value)
    except Exception:
        span.attrs[ATTR_TOOL_RESULT] = jsonable(value)


def _wrap_run_json(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def run_json(self: BaseTool[Any, Any], args: Mapping[str, Any], *rest: Any, **kwargs: Any) -> Any:
        ctx = current_rollout()
        if ctx is None:
            return await original(self, args, *rest, **kwargs)
        with _tool_run(ctx, self, args, _tool_call_id(rest, kwargs)) as run:
            value = await original(self, args, *rest, **kwargs)
            _set_result(run, self, value)
            return value

    return run_json


def _wrap_run_json_stream(original: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def traced(
        ctx: RolloutContext, tool: BaseStreamTool[Any, Any, Any], args: Mapping[str, Any], rest: Any, kwargs: Any
    ) -> AsyncIterator[Any]:
        with _tool_run(ctx, tool, args, _tool_call_id(rest, kwargs)) as run:
            last: Any = None
            async for item in original(tool, args, *rest, **kwargs):
                last = item
                yield item
            _set_result(run, tool, last)

    @functools.wraps(original)
    def run_json_stream(
        self: BaseStreamTool[Any, Any, Any], args: Mapping[str, Any], *rest: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        ctx = current_rollout()
        if ctx is None:
            return original(self, args, *rest, **kwargs)
        return traced(ctx, self, args, rest, kwargs)

    return run_json_stream


def _wrap_function_tool_run(original: Callable[..., Any]) -> Callable[..., Any]:
    """Run a synchronous function tool in a copy of the caller's context (AutoGen's thread pool drops it)."""

    @functools.wraps(original)
    async def run(self: FunctionTool, args: Any, cancellation_token: Any) -> Any:
        func = getattr(self, "_func", None)
        signature = getattr(self, "_signature", None)
        if _scope.get() is None or func is None or signature is None or inspect.iscoroutinefunction(func):
            return await original(self, args, cancellation_token)
        # FunctionTool.run's synchronous branch, with the function run by Context.run
        kwargs = {name: getattr(args, name) for name in signature.parameters if hasattr(args, name)}
        linked = not getattr(self, "_has_cancellation_support", False)
        if not linked:
            kwargs["cancellation_token"] = cancellation_token
        call = functools.partial(contextvars.copy_context().run, func, **kwargs)
        future = asyncio.get_running_loop().run_in_executor(None, call)
        if linked:
            cancellation_token.link_future(future)
        return await future

    return run


# ------------------------------------------------------------------------------------------------- model calls


def _start_call(
    ctx: RolloutContext, client: ChatCompletionClient, messages: Sequence[Any], kwargs: Mapping[str, Any], stream: bool
) -> _Call:
    agent, agent_id, parent = _here(ctx)
    attrs: dict[str, Any] = {ATTR_OPERATION: "chat", ATTR_STREAM: stream, ATTR_CLIENT: type(client).__name__}
    create_args = getattr(client, "_create_args", None)
    if isinstance(create_args, dict) and isinstance(create_args.get("model"), str):
        attrs[ATTR_MODEL] = create_args["model"]
    if agent is not None:
        attrs[ATTR_AGENT_NAME] = agent
    if agent_id is not None:
        attrs[ATTR_AGENT_ID] = agent_id
    call = _Call(
        ctx=ctx,
        name=CALL_SPAN_NAME,
        agent=agent,
        parent=parent,
        attrs=attrs,
        messages=messages,
        tools=kwargs.get("tools"),
        stream=stream,
    )
    attrs[ATTR_CALL_ID] = call.call_id
    _calls.push(call)
    return call


def _end_call(call: _Call, result: CreateResult | None, error: BaseException | None) -> None:
    call.open = False
    attrs = call.attrs
    kind = call.gateway_kind()
    status = "ok"
    try:
        if kind == "llm":
            attrs[ATTR_INPUT_MESSAGES] = [m for message in call.messages for m in _openai_messages(message)]
            if call.tools:
                attrs[ATTR_TOOLS] = [_openai_tool(t) for t in call.tools]
        if result is not None:
            _describe_result(result, attrs)
    except Exception:
        log.warning("agl could not describe an AutoGen model call", exc_info=True)
    if error is not None:
        status = _fail(call, error)
    call.finish(kind, status)


def _wrap_create(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def create(self: ChatCompletionClient, messages: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        ctx = current_rollout()
        if ctx is None or _calls.innermost(ctx) is not None:  # outside agl, or a client delegating to another
            return await original(self, messages, *args, **kwargs)
        call = _start_call(ctx, self, messages, kwargs, stream=False)
        try:
            result = await original(self, messages, *args, **kwargs)
        except BaseException as exc:
            _end_call(call, None, exc)
            raise
        _end_call(call, result if isinstance(result, CreateResult) else None, None)
        return result

    return create


def _wrap_create_stream(original: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def traced(
        ctx: RolloutContext, client: ChatCompletionClient, messages: Sequence[Any], args: Any, kwargs: Any
    ) -> AsyncIterator[Any]:
        call = _start_call(ctx, client, messages, kwargs, stream=True)
        result: CreateResult | None = None
        try:
            async for item in original(client, messages, *args, **kwargs):
                if isinstance(item, CreateResult):
                    result = item
                yield item
        except BaseException as exc:
            _end_call(call, result, exc)
            raise
        _end_call(call, result, None)

    @functools.wraps(original)
    def create_stream(
        self: ChatCompletionClient, messages: Sequence[Any], *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        ctx = current_rollout()
        if ctx is None or _calls.innermost(ctx) is not None:
            return original(self, messages, *args, **kwargs)
        return traced(ctx, self, messages, args, kwargs)

    return create_stream


def _autogen_tag(ctx: RolloutContext) -> CallTag | None:
    """The open model call of this context that a gateway request belongs to (marked as sent)."""
    call = _calls.innermost(ctx)
    return call.take() if call is not None else None


# ----------------------------------------------------------------------------------------------- conversions


def _content_parts(content: Any) -> Any:
    """User content in OpenAI form: text as is, images as a placeholder (their bytes stay out of spans)."""
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": part}
        if isinstance(part, str)
        else {"type": "image_url", "image_url": {"url": "<image>"}}
        for part in content
    ]


def _tool_call(call: FunctionCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _openai_messages(message: Any) -> list[dict[str, Any]]:
    """One AutoGen ``LLMMessage`` as OpenAI chat messages (a batch of tool results becomes one message each)."""
    if isinstance(message, SystemMessage):
        return [{"role": "system", "content": message.content}]
    if isinstance(message, UserMessage):
        return [{"role": "user", "content": _content_parts(message.content), "name": message.source}]
    if isinstance(message, AssistantMessage):
        if isinstance(message.content, str):
            return [{"role": "assistant", "content": message.content}]
        return [
            {"role": "assistant", "content": message.thought, "tool_calls": [_tool_call(c) for c in message.content]}
        ]
    if isinstance(message, FunctionExecutionResultMessage):
        return [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in message.content]
    return [{"role": "unknown", "content": jsonable(message)}]


def _openai_tool(tool: Any) -> dict[str, Any]:
    schema = tool.schema if isinstance(tool, BaseTool) else getattr(tool, "schema", tool)
    return {"type": "function", "function": jsonable(schema)}


def _describe_result(result: CreateResult, attrs: dict[str, Any]) -> None:
    """The response message (OpenAI format), finish reason, usage and cache flag of a model call."""
    if isinstance(result.content, str):
        message: dict[str, Any] = {"role": "assistant", "content": result.content}
    else:
        message = {"role": "assistant", "content": None, "tool_calls": [_tool_call(c) for c in result.content]}
    attrs[ATTR_OUTPUT_MESSAGES] = [message]
    attrs[ATTR_FINISH_REASONS] = [result.finish_reason]
    attrs[ATTR_INPUT_TOKENS] = result.usage.prompt_tokens
    attrs[ATTR_OUTPUT_TOKENS] = result.usage.completion_tokens
    attrs[ATTR_CACHED] = result.cached
    if result.thought:
        attrs[ATTR_THOUGHT] = result.thought


# -------------------------------------------------------------------------------------------------- install


_PATCHES = Patches("autogen")


def _wrap_client_class(cls: type) -> None:
    """Wrap the ``create`` / ``create_stream`` a model client class defines itself (inherited ones already are)."""
    for attr, wrap in (("create", _wrap_create), ("create_stream", _wrap_create_stream)):
        own = vars(cls).get(attr)
        if own is not None and callable(own) and not getattr(own, "__isabstractmethod__", False):
            _PATCHES.wrap(cls, attr, wrap, own=True)


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _init_subclass_hook(own: Any) -> classmethod[Any, Any, None]:
    """``ChatCompletionClient.__init_subclass__``: wrap model clients defined after :func:`install` too."""

    def __init_subclass__(cls: Any, **kwargs: Any) -> None:
        if isinstance(own, classmethod):
            own.__func__(cls, **kwargs)
        else:
            super(ChatCompletionClient, cls).__init_subclass__(**kwargs)
        with _INTEGRATION.lock:
            if _INTEGRATION.installed:
                _wrap_client_class(cls)

    return classmethod(__init_subclass__)


def _hook() -> None:
    with contextlib.suppress(ImportError):
        importlib.import_module("autogen_agentchat.agents")
        importlib.import_module("autogen_agentchat.teams")
    original_invoke = autogen_core.trace_invoke_agent_span
    for name, module in list(sys.modules.items()):
        if name.startswith("autogen") and getattr(module, "trace_invoke_agent_span", None) is original_invoke:
            _PATCHES.wrap(module, "trace_invoke_agent_span", _wrap_invoke_agent_span, own=True)
    _PATCHES.wrap(BaseTool, "run_json", _wrap_run_json, own=True)
    _PATCHES.wrap(BaseStreamTool, "run_json_stream", _wrap_run_json_stream, own=True)
    _PATCHES.wrap(FunctionTool, "run", _wrap_function_tool_run, own=True)
    for cls in _subclasses(ChatCompletionClient):
        _wrap_client_class(cls)
    _PATCHES.wrap(ChatCompletionClient, "__init_subclass__", _init_subclass_hook, own=True)


_INTEGRATION = Integration(
    verified=Verified("autogen-core", "0.7", "0.8"), hook=_hook, scope_resolver=_autogen_scope, tagger=_autogen_tag
)


def install() -> None:
    """Capture AutoGen agents, tools and model calls while a rollout is current in this process. Idempotent.

    Wraps AutoGen's invoke-agent hook, tool entry points and model clients (see the module docs), registers the
    ``agl.emit_*`` scope resolver and the gateway headers on httpx clients. Imports ``autogen_agentchat`` when it
    is installed, so its modules are wrapped too.
    """
    _INTEGRATION.install()


def uninstall() -> None:
    """Put AutoGen's own functions back (benchmarks compare with and without capture). Idempotent."""
    _INTEGRATION.uninstall(_PATCHES.undo)


def activate() -> ContextManager[None]:
    """Capture AutoGen for the rollout current when entered; what runners wrap each agent call in."""
    return _INTEGRATION.activate()
