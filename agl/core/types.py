"""The one schema every part of agl shares: spans, rollouts, attempts, trajectories, resources.

Pure data (pydantic v2), no I/O. Everything that crosses a process or machine boundary is one of these types and
round-trips through JSON unchanged: the types refuse what JSON cannot hold (NaN, ±Infinity, integers beyond 64 bits,
free-form values nested too deeply or holding non-JSON objects), so whatever a store accepted can be read back.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from agl.core.jsonsafe import INT64_MAX, UnsafeJson, check_json
from agl.core.net import backend_address

SpanKind = Literal["llm", "tool", "agent", "reward", "message", "exception", "custom"]
SPAN_KINDS: tuple[str, ...] = ("llm", "tool", "agent", "reward", "message", "exception", "custom")
RolloutStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
AttemptStatus = Literal["running", "succeeded", "failed", "timed_out", "lost"]
RolloutMode = Literal["train", "val", "test"]

#: Attribute keys agl itself writes on spans. Names follow OpenTelemetry GenAI where one exists.
ATTR_PROMPT_IDS = "agl.prompt_token_ids"
ATTR_RESPONSE_IDS = "agl.response_token_ids"
ATTR_LOGPROBS = "agl.response_logprobs"
ATTR_REWARD = "agl.reward"
ATTR_WEIGHTS_VERSION = "agl.weights_version"
#: The policy (served model name) the gateway routed a call to by its agent, and how it chose: "agent" (the call's
#: agent, or an agent it is nested in, has a route), "default" (its agent has none) or "no_agent" (the call carried
#: no agent identity). Set only when the call's ``LLM`` resource has ``routes``.
ATTR_POLICY = "agl.policy"
ATTR_POLICY_ROUTE = "agl.policy_route"
ATTR_RESOURCE = "agl.llm_resource"
ATTR_INPUT_MESSAGES = "gen_ai.input.messages"
ATTR_OUTPUT_MESSAGES = "gen_ai.output.messages"
ATTR_TOOLS = "gen_ai.tool.definitions"
ATTR_MODEL = "gen_ai.request.model"
ATTR_RESPONSE_MODEL = "gen_ai.response.model"
ATTR_RESPONSE_ID = "gen_ai.response.id"
#: The sampling temperature the call was sent with (after the ``LLM`` resource's defaults), when it stated one.
ATTR_TEMPERATURE = "gen_ai.request.temperature"
ATTR_INPUT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ATTR_FINISH_REASONS = "gen_ai.response.finish_reasons"
ATTR_CALL_ID = "agl.call_id"
ATTR_STREAM = "agl.stream"
ATTR_BACKEND_URL = "agl.backend_url"
ATTR_VIA_GATEWAY = "agl.via_gateway"
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_PROVIDER = "gen_ai.provider.name"
ATTR_AGENT_NAME = "gen_ai.agent.name"
ATTR_AGENT_ID = "gen_ai.agent.id"
ATTR_TOOL_NAME = "gen_ai.tool.name"
ATTR_TOOL_CALL_ID = "gen_ai.tool.call.id"
ATTR_TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
ATTR_TOOL_RESULT = "gen_ai.tool.call.result"
ATTR_ERROR_TYPE = "error.type"
ATTR_ERROR_MESSAGE = "error.message"
ATTR_HTTP_STATUS = "http.status_code"
ATTR_INTEGRATION = "agl.integration"
#: Why an ``llm`` span has no token ids: "off" (``LLM.token_ids``), "unsupported" (the backend refused the capture
#: fields), "missing" (the backend ignored them).
ATTR_TOKEN_IDS = "agl.token_ids"

#: Request headers an integration sets on gateway calls to join the gateway's ``llm`` span into its span tree.
HEADER_AGENT = "x-agl-agent"
HEADER_PARENT_SPAN = "x-agl-parent-span"
HEADER_CALL_ID = "x-agl-call-id"
#: The runner's sequence number for a gateway call (taken when the request is sent), so calls and the rewards the
#: runner records order by one counter instead of by the wall clocks of two hosts.
HEADER_SEQUENCE = "x-agl-sequence"
#: The most items a list in a request body to the server may hold (spans, rollout requests, rollout ids): validation
#: stops at the first item past it, so a body of millions of junk items costs one error, not one error object per
#: item (a 50 MB list of integers sent as spans took ~20 GB to refuse). ``HttpStore`` sends longer lists in chunks.
MAX_BODY_LIST = 10_000
#: Request headers a runner sends with its attempt's key (instead of its token) when it heartbeats, completes or writes
#: spans for that attempt: the key is good for this rollout and attempt only (``agl.core.server.auth``).
HEADER_ROLLOUT = "x-agl-rollout-id"
HEADER_ATTEMPT = "x-agl-attempt-id"
#: Response header on a 503 the agl server gives when it cannot serve a request itself (its store cannot take the
#: write; a gateway answer whose span could not be stored). Nothing the request asked for was applied, so it may be
#: sent again; and an agent that failed on it failed because of agl, not because of its LLM backend.
HEADER_UNAVAILABLE = "x-agl-unavailable"

#: The environment variable agl's clients (``HttpStore``, runners, the Trainer, the CLI) read their server token from,
#: and ``agl server`` a trainer token from.
ENV_TOKEN = "AGL_TOKEN"


def new_id(prefix: str) -> str:
    """A short random id with a readable prefix (``ro-``, ``at-``, ``sp-``)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _json_data(value: Any) -> Any:
    """Refuse a free-form value that would not survive a store-and-read-back as JSON, naming where inside it."""
    try:
        check_json(value)
    except UnsafeJson as exc:
        kind = "json_too_deep" if exc.too_deep else "json_unsafe"
        template = "{problem} (at {path})" if exc.path else "{problem}"
        raise PydanticCustomError(kind, template, {"problem": exc.problem, "path": exc.path}) from None
    return value


#: A free-form JSON value (a task, a span attribute): any JSON data that round-trips, checked by ``check_json``.
JsonData = Annotated[Any, AfterValidator(_json_data)]
#: A free-form JSON object (attributes, metadata, record data, sampling parameters).
JsonObject = Annotated[dict[str, Any], AfterValidator(_json_data)]
#: An integer a 64-bit store column holds.
Int64 = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Span(_Model):
    """One observed event of a rollout: an LLM call, a tool run, an agent step, a reward, a message, an error."""

    span_id: str = Field(default_factory=lambda: new_id("sp"), min_length=1, max_length=128)
    rollout_id: str = Field(min_length=1, max_length=128)
    attempt_id: str = Field(min_length=1, max_length=128)
    parent_id: str | None = Field(default=None, max_length=128)
    sequence: int = Field(
        default=0,
        ge=0,
        le=INT64_MAX,
        description=(
            "The runner's counter (1, 2, ...; 0 = none), ordering a rollout's spans without clocks "
            "(an llm span: its call's x-agl-sequence header)."
        ),
    )
    kind: SpanKind
    name: str = Field(max_length=512)
    agent: str | None = Field(default=None, max_length=512, description="The agent that produced it (selection key).")
    start_time: float = Field(default_factory=time.time)
    end_time: float | None = None
    status: Literal["ok", "error"] = "ok"
    attributes: JsonObject = Field(default_factory=dict)


class Attempt(_Model):
    """One try of a rollout by one worker."""

    attempt_id: str
    rollout_id: str
    number: int = Field(ge=1, le=INT64_MAX)
    worker_id: str
    status: AttemptStatus = "running"
    started_at: float
    heartbeat_at: float
    ended_at: float | None = None
    error: str | None = None


class RolloutRequest(_Model):
    """What a caller enqueues: a task run once against one resources version."""

    task: JsonData
    task_id: str | None = Field(default=None, max_length=256)
    rollout_id: Annotated[str, AfterValidator(path_safe_id)] | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Client-chosen id (no '/'): enqueueing it again returns the stored rollout, so a resent request "
        "is safe.",
    )
    mode: RolloutMode = "train"
    resources_version: int | None = Field(
        default=None, ge=1, le=INT64_MAX, description="None = latest at enqueue time."
    )
    max_attempts: int = Field(default=3, ge=1, le=100)
    metadata: JsonObject = Field(default_factory=dict)


class Rollout(_Model):
    """A task input run once by the agent against one resources version; may take several attempts."""

    rollout_id: str
    task: JsonData
    task_id: str | None = None
    mode: RolloutMode = "train"
    resources_version: Int64
    status: RolloutStatus = "queued"
    max_attempts: Int64 = 3
    attempts: Int64 = 0
    final_reward: float | None = None
    error: str | None = None
    created_at: float
    finished_at: float | None = None
    metadata: JsonObject = Field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


class Transition(_Model):
    """One LLM call of a selected agent, ready to train on."""

    span_id: str
    agent: str | None
    step: int = Field(ge=0, description="Index of this call among the selected calls of its rollout.")
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    reward: float = Field(default=0.0, description="Intermediate reward that landed after this call (emitted + AIR).")
    ret: float | None = Field(default=None, description="Return, filled by credit assignment.")
    tie_break: float | None = Field(
        default=None,
        description=(
            "Secondary score of this call from tie-break reward spans that landed after it (never part of reward or "
            "return; GRPO may use it to order a group whose returns are all equal). None when none landed."
        ),
    )
    advantage: float | None = Field(default=None, description="Advantage, filled by the algorithm.")
    weights_version: str | None = None
    policy: str | None = Field(
        default=None, description="The policy (served model name) the gateway routed this call to, when it routes."
    )
    temperature: float | None = Field(
        default=None,
        description="Sampling temperature the call was sent with (0 = greedy); None when the request stated none.",
    )
    request_messages: list[dict[str, Any]] = Field(default_factory=list)
    response_message: dict[str, Any] = Field(default_factory=dict)

    @property
    def has_token_ids(self) -> bool:
        return bool(self.prompt_ids) and bool(self.response_ids)


def logprob_temperature(temperature: float) -> float:
    """The temperature whose distribution a call's response logprobs describe: its sampling temperature, or 1 for a
    greedy call (temperature 0, where the sampled distribution is a point mass and has no useful log-probs).

    agl's policy server reports, vLLM as agl launches it reports (``--logprobs-mode processed_logprobs``), and
    LightningRL's loss recomputes ``log_softmax(logits / logprob_temperature(T))`` for the sampled token, so the
    behaviour and policy log-probs of an importance ratio come from the distribution the token was drawn from.
    """
    if temperature < 0 or math.isnan(temperature):
        raise ValueError(f"temperature: must be >= 0, got {temperature}")
    return temperature if temperature > 0 else 1.0


class Trajectory(_Model):
    """The ordered transitions of one rollout, its final reward and what it ran with."""

    rollout_id: str
    attempt_id: str | None
    task_id: str | None
    task: Any = None
    mode: RolloutMode = "train"
    resources_version: int
    status: RolloutStatus
    final_reward: float | None
    transitions: list[Transition] = Field(default_factory=list)
    rewards: list[float] = Field(default_factory=list, description="Every intermediate reward, in order.")
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------------------------------- resources


#: What an ``agl server`` answers in place of an ``LLM``'s ``api_key``; publishing it back keeps the stored key.
REDACTED = "<redacted>"


def _backend_url(url: str) -> str:
    """A backend URL the gateway can call as a prefix: http(s), one its HTTP client can call
    (``agl.core.net.backend_address``: ``10.0.0.300``, ``0177.0.0.1`` and a 64-character label are refused here, not
    at call time), no ``user:password@`` part (a key in the URL would be stored
    and readable back with it: reads redact ``api_key`` only) and no query or fragment (clients append paths such as
    ``/chat/completions``: ``http://internal/admin?`` would turn every call into a request for ``/admin``)."""
    backend_address(url)
    if "@" in urlsplit(url).netloc:
        raise ValueError("credentials in the URL would be readable back; give the key as api_key instead")
    if "?" in url or "#" in url:
        raise ValueError("a base URL is a prefix that paths are appended to: it cannot hold a query or fragment")
    return url


def path_safe_id(value: str) -> str:
    """A client-chosen id that can be opened by URL (``/api/rollouts/{id}``, the dashboard's pages): no ``/``."""
    if "/" in value:
        raise ValueError("an id cannot hold '/': it would not name one path segment of the API or the dashboard")
    return value


def agent_with_parents(name: str) -> list[str]:
    """An agent name and the names of the agents it is nested in: ``"a/b/c"`` → ``["a/b/c", "a/b", "a"]``."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


class PolicyRoute(_Model):
    """Where the gateway sends one agent's calls: a model name the backend serves (e.g. a LoRA adapter
    ``policy/writer``) and the weights version it serves under that name."""

    model: str = Field(min_length=1)
    weights_version: str | None = None


class LLM(_Model):
    """An OpenAI-compatible endpoint the agent calls. Inside a rollout, ``base_url`` points at agl's gateway."""

    kind: Literal["llm"] = "llm"
    base_url: Annotated[str, AfterValidator(_backend_url)] = Field(min_length=1)
    model: str = Field(min_length=1)
    api_key: str = Field(
        default="agl",
        repr=False,
        description=f"Sent as the bearer token. Kept by the server: every read answers {REDACTED!r} in its place.",
    )
    sampling: JsonObject = Field(default_factory=dict, description="Default sampling params (temperature, ...).")
    weights_version: str | None = Field(
        default=None, description="Weights version the endpoint serves (trainers set it)."
    )
    token_ids: Literal["auto", "require", "off"] = Field(
        default="auto",
        description=(
            "How agl's gateway asks this backend for exact token ids (vLLM's return_token_ids, plus logprobs unless "
            "the agent sets them): 'auto' asks backends that accept it and learns once per base_url which do not "
            "(hosted APIs), 'require' fails a call that cannot get ids, 'off' never asks."
        ),
    )
    routes: dict[str, PolicyRoute] = Field(
        default_factory=dict,
        description=(
            "One policy per agent: agent name → the model (and weights version) that serves its calls; the gateway "
            "sets the request's model by the call's agent (a nested agent 'solver/critic' takes the route of "
            "'solver' when it has none of its own). Calls of other agents, and calls without an agent identity, "
            "go to the agent's own model."
        ),
    )

    def route(self, agent: str | None) -> tuple[PolicyRoute | None, str]:
        """The route of a call made by ``agent`` (None: no agent identity), and how it was chosen (``agent``,
        ``default`` or ``no_agent``, as recorded in ``agl.policy_route``)."""
        if agent is None:
            return None, "no_agent"
        for name in agent_with_parents(agent):
            found = self.routes.get(name)
            if found is not None:
                return found, "agent"
        return None, "default"


class PromptTemplate(_Model):
    """A prompt owned by an agent; ``format`` fills ``{placeholders}`` (str.format syntax)."""

    kind: Literal["prompt_template"] = "prompt_template"
    template: str
    agent: str | None = None

    def format(self, **values: Any) -> str:
        return self.template.format(**values)

    @property
    def placeholders(self) -> set[str]:
        return set(re.findall(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}", self.template))


class ModelWeights(_Model):
    """A reference to trained weights: a full checkpoint folder or a LoRA adapter on top of ``base_model``."""

    kind: Literal["model_weights"] = "model_weights"
    path: str
    version: str
    base_model: str | None = None
    adapter: bool = False


Resource = Annotated[LLM | PromptTemplate | ModelWeights, Field(discriminator="kind")]


class ResourceSet(_Model):
    """Named resources published together under one version; immutable once published."""

    version: int = Field(ge=1, le=INT64_MAX)
    resources: dict[str, Resource]
    created_at: float = Field(default_factory=time.time)


def _null_non_finite(value: Any, info: ValidationInfo) -> Any:
    """Built in-process, a NaN/±inf metric (a mean over nothing) becomes null; arriving as JSON it is refused."""
    if info.mode != "python":
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _null_non_finite(v, info) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_null_non_finite(v, info) for v in value]
    return value


class Record(_Model):
    """A free-form record an algorithm keeps in the store (metrics per round, APO history, ...).

    ``data`` must be JSON data; built in-process, its non-finite floats are stored as null (a metric that is NaN
    means "no value"), while a request that sends NaN or Infinity is refused.
    """

    kind: str = Field(min_length=1, max_length=128)
    key: str = Field(default="", max_length=512)
    data: Annotated[JsonObject, BeforeValidator(_null_non_finite)] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
