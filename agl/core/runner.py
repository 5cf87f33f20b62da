"""Runners: lease a rollout → hand the agent its resources → run it → heartbeat → report; and the pool that keeps
runner processes alive.

Concurrency model: one runner = one process running one rollout at a time (plus a heartbeat thread and the span
sink's flush thread). Runners talk to an agl server over HTTP, so they can live on any machine. ``RunnerPool`` starts
runner processes and replaces the ones that die; the Trainer and ``agl runner`` both supervise through it.

How runners heal:

- An agent that raises fails its attempt, never the runner. An agent that failed only because agl's own gateway or
  store (the runner's ``server_url``) could not be reached is reported as a ``lost`` attempt, which the store retries
  while the rollout has attempts left (``agl_side_failure`` decides, from the exception chain and the failing
  request's URL; an agent's own bug is never retried).
- Spans that could not be stored make the attempt ``failed`` with an error saying how many were lost: a rollout with
  missing spans is never a silent success.
- The store answering with errors, or not at all, is retried; a runner that could not lease for ``retry_for`` seconds
  exits with ``EXIT_STORE_FAILED`` and its pool gives up; one whose token the server refuses exits at once with
  ``EXIT_TOKEN_REFUSED`` (asking again cannot help), and its pool gives up naming the token.
- A runner whose attempt was taken away (reaped as lost or timed out, or cancelled), or that ran past the store's
  ``attempt_timeout``, leaves its process with ``EXIT_ABANDONED``: a hung agent cannot be interrupted any other way.
  The pool starts a fresh process and the store retries the rollout.
- Any other death (a crash, ``kill -9``) is replaced too. When the workers of one slot died ``max_deaths`` times in
  a row without finishing a rollout, the pool gives up: the agent or its environment kills every runner.
- An integration whose ``activate()`` raises is skipped for that rollout with a warning and an ``exception`` span
  naming it; the agent still runs, uncaptured by that framework's hooks.
- A runner enters only the integrations of the frameworks its agent uses (imported by the agent's module, or
  declared: ``integrations=[...]``), so no framework is imported for nothing and none sees another's data; and it
  switches off the frameworks' own telemetry exporters (``agl.core.telemetry``). An attempt during which the agent
  first imported a framework, uncaptured, is reported ``lost`` and runs again, captured.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import logging
import math
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

from agl.core.emit import RolloutContext, SpanSink, current_rollout, emit_exception, record_exception, rollout_scope
from agl.core.store.base import NotFound, Store, StoreDenied, StoreError, StoreUnavailable
from agl.core.telemetry import quiet_framework_telemetry
from agl.core.types import (
    ATTR_INTEGRATION,
    ENV_TOKEN,
    HEADER_UNAVAILABLE,
    LLM,
    Attempt,
    AttemptStatus,
    Resource,
    Rollout,
    new_id,
)

log = logging.getLogger("agl.runner")

AgentFn = Callable[[Any, dict[str, Any]], Any]

#: Exit code of a runner process that gave up because the store failed (or was unreachable) for ``retry_for`` seconds.
EXIT_STORE_FAILED = 75
#: Exit code of a runner process that left a hung, timed-out or taken-away attempt; its pool replaces it.
EXIT_ABANDONED = 76
#: Exit code of a runner process whose token the server refused (HTTP 401/403).
EXIT_TOKEN_REFUSED = 77

#: How long one lease request of an idle runner waits for work at most: the server answers as soon as a rollout is
#: queued (``Store.lease_wait``), so an idle runner sends a request every few seconds instead of polling. For
#: ``LEASE_SHORT_FOR_S`` after its start or its last rollout a runner asks for ``LEASE_WAIT_MIN_S`` only, so a stop
#: that comes right after a batch (the usual moment) is seen at once; then the wait doubles up to ``LEASE_WAIT_S``.
LEASE_WAIT_S = 4.0
LEASE_WAIT_MIN_S = 0.5
LEASE_SHORT_FOR_S = 5.0


def load_agent(ref: str) -> AgentFn:
    """Import ``package.module:function`` (what ``agl runner --agent`` takes)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"agent: expected 'module:function', got {ref!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"agent: {ref!r} is not callable")
    return obj


def gateway_resources(
    resources: dict[str, Resource], server_url: str, rollout: Rollout, attempt: Attempt, api_key: str = "agl"
) -> dict:
    """The resources as the agent sees them: every LLM's base_url points at the gateway route of this attempt and
    its ``api_key`` is ``api_key``, the attempt's gateway key (``Store.attempt_key``), never the upstream key."""
    out: dict[str, Any] = {}
    for name, res in resources.items():
        if isinstance(res, LLM):
            url = f"{server_url.rstrip('/')}/gw/{rollout.rollout_id}/{attempt.attempt_id}/{name}/v1"
            out[name] = res.model_copy(update={"base_url": url, "api_key": api_key})
        else:
            out[name] = res
    return out


def final_reward_of(value: Any) -> float | None:
    """The agent's return value as the final reward: a finite number (bools count as 1/0) or None."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    raise TypeError(f"the agent returned {type(value).__name__} {value!r}; return a finite number (the reward) or None")


def call_agent(agent: AgentFn, task: Any, resources: dict[str, Any]) -> Any:
    """Run a sync or async agent to completion."""
    result = agent(task, resources)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


# ------------------------------------------------------------------------------------- agl-side failures

#: HTTP client packages whose errors carry the failing request (openai's own client runs on httpx2).
_HTTP_PACKAGES = frozenset({"httpx", "httpx2", "httpcore", "openai"})
#: Error classes (by name, in those packages) that mean the server could not be reached or dropped the connection.
_CONNECTION_ERRORS = frozenset(
    {"ConnectError", "ConnectTimeout", "ReadError", "WriteError", "RemoteProtocolError", "APIConnectionError"}
)
#: Subclasses of those that mean "slow", not "unreachable": the agent's own timeout, not agl's outage.
_SLOW_ERRORS = frozenset({"APITimeoutError", "ReadTimeout", "WriteTimeout", "PoolTimeout"})


def _class_names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__ if c.__module__.partition(".")[0] in _HTTP_PACKAGES}


def _request_of(exc: BaseException) -> Any:
    """The HTTP request an httpx / openai error is about, or None (httpx raises when it was never set)."""
    try:
        return getattr(exc, "request", None)
    except RuntimeError:
        return None


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def _unreachable_request(exc: BaseException, base: str) -> str | None:
    """How ``exc`` itself is a failed request to ``base`` (unreachable, dropped, or agl's own 503), or None.

    Only a 503 marked ``HEADER_UNAVAILABLE`` is agl's: the gateway passes its LLM backend's errors on, and answers
    502/504 when the backend is unreachable or slow; those are the agent's (its model's) failures.
    """
    names = _class_names(exc)
    if not names:
        return None
    request = _request_of(exc)
    url = str(getattr(request, "url", ""))
    if not url.startswith(base):
        return None
    response = getattr(exc, "response", None)
    refused = _status_of(exc) == 503 and HEADER_UNAVAILABLE in getattr(response, "headers", {})
    unreachable = bool(names & _CONNECTION_ERRORS) and not names & _SLOW_ERRORS
    if not (unreachable or refused):
        return None
    what = "HTTP 503" if refused else type(exc).__name__
    return f"{what} on {getattr(request, 'method', 'request')} {url}: {exc}"


def agl_side_failure(exc: BaseException, server_url: str) -> str | None:
    """Why the agent's failure ``exc`` is agl's own fault, or None when it is the agent's.

    It is agl's fault when the exception, or one it was raised from or while handling (``__cause__`` /
    ``__context__``), is a request to ``server_url`` (this runner's gateway and store) that could not connect, lost
    its connection, or was answered agl's own 503 (``HEADER_UNAVAILABLE``). An exception group is agl's fault when
    all of its members are. Timeouts are the agent's (its own limit, a slow model), and so is every other error.
    """
    base = server_url.rstrip("/") + "/"
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            causes = [agl_side_failure(member, server_url) for member in current.exceptions]
            if causes and all(causes):
                return str(causes[0])
        else:
            found = _unreachable_request(current, base)
            if found is not None:
                return found
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


# ------------------------------------------------------------------------------------------ integrations
#
# Which integrations a rollout enters. A framework is in use in a runner process when its module is imported there
# (the agent's module imported it) or when the runner was told so (``integrations=[...]``); only those are
# imported and entered, so one framework's hooks and telemetry never see another's agent. See ``integration_scopes``.


@functools.cache
def _integrations() -> tuple[tuple[str, str], ...]:
    """Installed integrations: entry points of group ``agl.integrations`` as (framework module, target), the name
    being the module whose presence in ``sys.modules`` means the framework is in use."""
    return tuple((ep.name, ep.value) for ep in importlib.metadata.entry_points(group="agl.integrations"))


_warned_integrations: set[str] = set()


def _integration_names(framework: str, target: str) -> tuple[str, ...]:
    """The names a user may declare an integration by: its framework module, its integration module's last part
    (unless private: ``_http``)."""
    module = target.partition(":")[0].rpartition(".")[2]
    return (framework,) if module.startswith("_") else (framework, module)


def resolve_integrations(names: Iterable[str] | None) -> tuple[str, ...]:
    """The framework modules (entry point names) of declared integrations.

    Each name is an entry point name of group ``agl.integrations`` (``langchain_core``, ``agents``,
    ``autogen_core``, ``crewai``, ``httpx``) or the last part of its integration module (``langchain``,
    ``openai_agents``, ``autogen``, ``crewai``). Raises ``ValueError`` naming the known ones for any other name.
    """
    wanted = [names] if isinstance(names, str) else list(names or ())
    known = {name: framework for framework, target in _integrations() for name in _integration_names(framework, target)}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ValueError(
            f"integrations: unknown {', '.join(map(repr, unknown))}; installed: {', '.join(sorted(known)) or 'none'}"
        )
    return tuple(dict.fromkeys(known[name] for name in wanted))


def _in_use(declared: Iterable[str]) -> list[tuple[str, str]]:
    """The integrations to enter now: declared, or whose framework module is imported in this process."""
    chosen = set(declared)
    return [(fw, target) for fw, target in _integrations() if fw in chosen or fw in sys.modules]


def _integration_failed(target: str, framework: str, exc: BaseException, when: str) -> None:
    """Warn (once per process) and record an ``exception`` span naming the integration in the current rollout."""
    if target not in _warned_integrations:
        _warned_integrations.add(target)
        log.warning(
            "integration %s (for %s) failed %s and is skipped: %s: %s; calls made through %s are not captured",
            target,
            framework,
            when,
            type(exc).__name__,
            exc,
            framework,
        )
    ctx = current_rollout()
    if ctx is not None:
        record_exception(ctx, exc, **{ATTR_INTEGRATION: target, "agl.integration.framework": framework})


def _exit_integration(
    target: str,
    framework: str,
    scope: Any,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool:
    try:
        return bool(scope.__exit__(exc_type, exc, tb))
    except Exception as err:
        _integration_failed(target, framework, err, "on exit")
        return False


def warm_integrations(declared: Iterable[str] = ()) -> None:
    """Import the integrations ``integration_scopes(declared)`` would enter now (and so the declared frameworks),
    so a runner's first attempt does not pay for it. Call it after the agent's module was imported: frameworks the
    agent does not use are never imported.

    Errors are left for ``integration_scopes`` to report in each rollout.
    """
    for framework, target in _in_use(declared):
        with contextlib.suppress(Exception):
            importlib.import_module(framework)
            importlib.import_module(target.partition(":")[0])


class IntegrationScopes(contextlib.ExitStack):
    """The capture scopes entered around one rollout (what ``integration_scopes`` returns; leave it to exit them).

    ``late()`` names the frameworks with an integration that were not in use when the rollout started but were
    imported while it ran: their calls in this rollout were not captured.
    """

    def __init__(self) -> None:
        super().__init__()
        self._absent: list[str] = []

    def entered(self) -> None:
        """Note the frameworks not imported now, when the scopes are entered and the agent is about to run."""
        self._absent = [framework for framework, _ in _integrations() if framework not in sys.modules]

    def late(self) -> list[str]:
        return [framework for framework in self._absent if framework in sys.modules]


def integration_scopes(declared: Iterable[str] = ()) -> IntegrationScopes:
    """Enter the capture scopes of the integrations of the frameworks in use (call inside ``rollout_scope``).

    Integrations register as entry points named for their framework's module (``langchain_core =
    "agl.integrations.langchain:activate"``), so the core never imports them by name and a third-party package can
    add their own. A framework is in use when its module is already imported in this process (the agent's module
    imported it) or its integration is in ``declared`` (``resolve_integrations``); the choice is made again at every
    rollout start, and no other framework is imported or hooked, so an AutoGen runner never imports CrewAI nor lets
    its telemetry see AutoGen's data. A framework the agent imports only inside its code is not in use until then:
    ``IntegrationScopes.late()`` names it at the end of that rollout (declare it, or import it in the agent's
    module). An integration that cannot be imported, or whose ``activate()`` raises when called, entered or left, is
    skipped with a warning (once per process) and an ``exception`` span carrying ``agl.integration`` in the rollout;
    the agent runs either way.
    """
    stack = IntegrationScopes()
    for framework, target in _in_use(declared):
        module, _, attr = target.partition(":")
        try:
            scope = getattr(importlib.import_module(module), attr)()
            scope.__enter__()
        except Exception as exc:
            _integration_failed(target, framework, exc, "to activate")
            continue
        stack.push(functools.partial(_exit_integration, target, framework, scope))
    stack.entered()
    return stack


def late_import_error(frameworks: list[str]) -> str:
    """What an attempt reports when ``frameworks`` were first imported while its agent ran (uncaptured)."""
    names = ", ".join(frameworks)
    return (
        f"{names} was first imported while the agent ran, after agl chose which integrations to enter, so its calls "
        f"in this attempt were not captured; this runner captures it from now on. Import {names} in the agent's "
        f"module, or declare it: Trainer(integrations=[{', '.join(map(repr, frameworks))}]) / agl runner "
        f"--integration {frameworks[0]}"
    )


# ------------------------------------------------------------------------------------------------ runner


def leave_process(reason: str) -> None:
    """What a runner process does with an attempt it cannot finish: say why and exit with ``EXIT_ABANDONED``.

    The agent's thread may be stuck anywhere (a socket read, a C extension), so the process ends at once; buffered
    spans of the abandoned attempt go with it (the store already gave the rollout another attempt).
    """
    log.error("%s; leaving this runner process so a fresh one takes its place", reason)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_ABANDONED)


class Runner:
    """Runs rollouts from ``store`` one after another until ``stop`` is set (or ``max_rollouts`` ran).

    ``retry_for``: how long leasing may keep failing before ``run`` gives up with ``StoreError``.
    ``abandon``: called with a reason when the running attempt was taken away or ran past ``attempt_timeout``; the
    default, ``leave_process``, ends the process (a runner is a process of its own).
    ``progress``: a shared counter (``multiprocessing.Value``) incremented after every finished rollout, so a
    supervisor can tell a runner that works from one that never finishes anything.
    ``integrations``: integrations to enter in every rollout besides those of the frameworks already imported when
    it starts (names as ``resolve_integrations`` takes them); needed only for a framework the agent imports inside
    its own code. An attempt during which such a framework was first imported, uncaptured, is reported ``lost``
    (``late_import_error`` says why and how to avoid it), so the store runs it again, captured.
    One lease request waits for work at most ``LEASE_WAIT_S`` (``Store.lease_wait``; see ``LEASE_WAIT_MIN_S``);
    ``stop`` is noticed between requests (a server that stops its runners answers waiting leases at once:
    ``AglServer.drain``).
    """

    def __init__(
        self,
        agent: AgentFn,
        store: Store,
        server_url: str,
        *,
        worker_id: str | None = None,
        poll_interval: float = 0.05,
        heartbeat_interval: float | None = None,
        retry_for: float = 60.0,
        abandon: Callable[[str], None] = leave_process,
        progress: Any = None,
        integrations: Sequence[str] = (),
    ) -> None:
        self.agent = agent
        self.integrations = resolve_integrations(integrations)
        self.store = store
        self.server_url = server_url
        self.worker_id = worker_id or f"{os.uname().nodename}-{os.getpid()}-{new_id('w')[2:8]}"
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.retry_for = retry_for
        self.abandon = abandon
        self.progress = progress
        self._resources: dict[int, dict[str, Resource]] = {}

    def run(self, stop: threading.Event | Any, max_rollouts: int | None = None) -> int:
        """Work until ``stop`` is set; returns how many rollouts this runner finished.

        Raises ``StoreError`` when leasing failed for ``retry_for`` seconds in a row, and at once when the server
        refuses this runner's token (``StoreDenied``).
        """
        done = 0
        failing_since: float | None = None
        backoff = self.poll_interval
        wait = short = LEASE_WAIT_MIN_S
        worked = time.monotonic()
        while not stop.is_set() and (max_rollouts is None or done < max_rollouts):
            asked = time.monotonic()
            try:
                leased = self.store.lease_wait(self.worker_id, wait, self.poll_interval)
            except StoreDenied:
                raise
            except StoreError as exc:
                if failing_since is None:
                    failing_since = asked
                    log.warning("runner %s: could not lease (%s); trying again", self.worker_id, exc)
                failing_for = time.monotonic() - failing_since
                if failing_for >= self.retry_for:
                    raise StoreError(f"could not lease work for {failing_for:.0f}s: {exc}") from exc
                backoff = min(max(2 * backoff, 0.1), 5.0)
                stop.wait(min(backoff, max(0.05, self.retry_for - failing_for)))
                continue
            if failing_since is not None:
                log.warning("runner %s: leasing works again", self.worker_id)
            failing_since, backoff = None, self.poll_interval
            if leased is None:
                if time.monotonic() - asked < self.poll_interval:  # a store that answered at once: do not spin
                    stop.wait(self.poll_interval)
                if time.monotonic() - worked > LEASE_SHORT_FOR_S:
                    wait = min(2 * wait, LEASE_WAIT_S)
                continue
            self.run_one(*leased)
            done += 1
            wait, worked = short, time.monotonic()
            if self.progress is not None:
                with self.progress.get_lock():
                    self.progress.value += 1
        return done

    def run_one(self, rollout: Rollout, attempt: Attempt) -> None:
        """One attempt, start to report. Never raises for the agent's errors or the store's."""
        with self._watch(attempt):
            status, reward, error = self._attempt(rollout, attempt)
        self._report(attempt, status, reward, error)

    def _attempt(self, rollout: Rollout, attempt: Attempt) -> tuple[AttemptStatus, float | None, str | None]:
        """Run the agent; returns the attempt's (status, final reward, error)."""
        try:
            resources = self._resources_for(rollout, attempt)
        except NotFound as exc:
            return "failed", None, f"resources v{rollout.resources_version}: {exc}"
        except StoreError as exc:
            return "lost", None, f"could not fetch resources v{rollout.resources_version}: {exc}"
        sink = SpanSink(self.store)
        ctx = RolloutContext(rollout.rollout_id, attempt.attempt_id, sink, resources=resources, task=rollout.task)
        status: AttemptStatus = "succeeded"
        reward: float | None = None
        error: str | None = None
        with rollout_scope(ctx), integration_scopes(self.integrations) as scopes:
            try:
                reward = final_reward_of(call_agent(self.agent, rollout.task, resources))
            except Exception as exc:
                emit_exception(exc)
                cause = agl_side_failure(exc, self.server_url)
                if cause is None:
                    status, error = "failed", f"{type(exc).__name__}: {exc}"
                else:
                    status, error = "lost", f"the agent could not reach agl at {self.server_url} ({cause})"
                log.warning("rollout %s: attempt %s %s: %s", rollout.rollout_id, attempt.number, status, error)
            late = scopes.late()
        if late:  # never a success that missed a framework's calls; run again, captured (an agent error stays)
            uncaptured = late_import_error(late)
            status, error = ("lost", uncaptured) if status == "succeeded" else (status, f"{error}; {uncaptured}")
            log.warning("rollout %s: attempt %s %s: %s", rollout.rollout_id, attempt.number, status, uncaptured)
        missing = _unstored_spans(sink)
        if missing is not None and status != "lost":
            status, error = "failed", missing if error is None else f"{missing}; {error}"
        return status, reward, error

    def _resources_for(self, rollout: Rollout, attempt: Attempt) -> dict[str, Any]:
        version = rollout.resources_version
        if version not in self._resources:
            self._resources[version] = self.store.get_resources(version).resources
        key = self.store.attempt_key(attempt.attempt_id)
        return gateway_resources(self._resources[version], self.server_url, rollout, attempt, key)

    def _report(self, attempt: Attempt, status: AttemptStatus, reward: float | None, error: str | None) -> None:
        """Complete the attempt; a store that cannot take the report leaves it to be reaped as lost."""
        try:
            accepted = self.store.complete_attempt(attempt.attempt_id, status, final_reward=reward, error=error)
        except StoreError as exc:
            if status == "lost" and not isinstance(exc, NotFound | StoreUnavailable):
                log.warning(
                    "the store does not take lost reports (%s); reporting attempt %s failed", exc, attempt.attempt_id
                )
                self._report(attempt, "failed", reward, error)
                return
            log.error(
                "runner %s: could not report attempt %s as %s (%s); the store will reap it as lost",
                self.worker_id,
                attempt.attempt_id,
                status,
                exc,
            )
            return
        if not accepted:
            log.warning(
                "attempt %s was no longer running (reaped or cancelled); its result is ignored", attempt.attempt_id
            )

    @contextlib.contextmanager
    def _watch(self, attempt: Attempt) -> Iterator[None]:
        """Heartbeat ``attempt`` from a thread while the block runs."""
        settings = self.store.settings
        interval = self.heartbeat_interval or max(0.2, settings.heartbeat_timeout / 4)
        finished = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat,
            args=(attempt.attempt_id, finished, interval, settings.attempt_timeout),
            name="agl-heartbeat",
            daemon=True,
        )
        beat.start()
        try:
            yield
        finally:
            finished.set()
            beat.join()

    def _heartbeat(self, attempt_id: str, finished: threading.Event, interval: float, attempt_timeout: float) -> None:
        deadline = time.monotonic() + attempt_timeout
        while not finished.wait(min(interval, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                with contextlib.suppress(Exception):
                    self.store.reap()
                self.abandon(f"attempt {attempt_id} ran past attempt_timeout ({attempt_timeout:g}s)")
                return
            try:
                alive = self.store.heartbeat(attempt_id)
            except Exception as exc:
                log.warning("heartbeat for %s failed: %s", attempt_id, exc)
                continue
            if not alive and not finished.is_set():
                self.abandon(f"attempt {attempt_id} was taken away by the store (reaped or cancelled)")
                return


def _unstored_spans(sink: SpanSink) -> str | None:
    """Close the sink; what went missing, or None when every span of the attempt was stored."""
    problem = None
    try:
        sink.close()
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    dropped = int(getattr(sink, "dropped", 0))
    if problem is None and not dropped:
        return None
    return f"attempt incomplete: {problem or f'{dropped} span(s) could not be stored'}"


def worker_main(
    agent: AgentFn | str | bytes,
    server_url: str,
    worker_id: str,
    stop: Any,
    log_level: int = logging.WARNING,
    retry_for: float = 60.0,
    progress: Any = None,
    token: str | None = None,
    integrations: Sequence[str] = (),
    environ: dict[str, str] | None = None,
    streams: tuple[int, int] | None = None,
) -> None:
    """Entry point of a runner process (started by ``RunnerPool``; ``progress`` counts its finished rollouts).

    ``agent``: the function, its ``module:function`` reference, or the function pickled (``RunnerPool`` sends it
    pickled, so its module is imported here, after the frameworks' telemetry switches are set:
    ``agl.core.telemetry.quiet_framework_telemetry``). The agent and the integrations of the frameworks it uses (and
    of ``integrations``, see ``Runner``) are imported before the first lease (an attempt's clock starts at its lease).
    Ctrl-C is left to the pool (it stops its workers through ``stop``). Exits with ``EXIT_STORE_FAILED`` when the
    store failed for ``retry_for`` seconds, ``EXIT_TOKEN_REFUSED`` when the server refused its token,
    ``EXIT_ABANDONED`` when it left a hung or taken-away attempt.
    ``token`` is the server token (default: env ``AGL_TOKEN``); ``AGL_TOKEN`` is then removed from the process's
    environment, so the agent and what it starts do not inherit it. ``environ``: the environment to run with (a
    runner forked from the fork server would otherwise have the one the fork server started with, not the pool's);
    ``streams``: the pool's stdout and stderr at start (``_Inherited``), for the same reason.
    """
    if streams is not None:
        for fd, target in zip(streams, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    quiet_framework_telemetry()  # before the agent's module imports its framework
    from agl.core.store.http import HttpStore

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for chatty in ("httpx", "httpx2"):  # not a log line per lease poll or per LLM call
        logging.getLogger(chatty).setLevel(max(log_level, logging.WARNING))
    fn = load_agent(agent) if isinstance(agent, str) else pickle.loads(agent) if isinstance(agent, bytes) else agent
    warm_integrations(integrations)
    store = HttpStore(server_url, retry_for=retry_for, token=token)
    os.environ.pop(ENV_TOKEN, None)
    try:
        runner = Runner(
            fn,
            store,
            server_url,
            worker_id=worker_id,
            retry_for=retry_for,
            progress=progress,
            integrations=integrations,
        )
        runner.run(stop)
    except StoreDenied as exc:
        log.error("runner %s gives up: %s", worker_id, exc)
        raise SystemExit(EXIT_TOKEN_REFUSED) from None
    except StoreError as exc:
        log.error("runner %s gives up: %s", worker_id, exc)
        raise SystemExit(EXIT_STORE_FAILED) from None
    finally:
        store.close()


# -------------------------------------------------------------------------------------------------- pool


class _Inherited:
    """A file descriptor of the pool's process that its runner gets a copy of (``multiprocessing`` passes it along
    when the process object is sent to the fork server); unpickled, it is the runner's own descriptor number."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return int(dup.detach())


class RunnerPoolError(RuntimeError):
    """Runner processes cannot be kept alive; the message says why and what to check."""


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


#: How a pool starts its runner processes: ``forkserver`` (forked from Python's fork server, which has imported
#: ``RUNNER_PRELOAD`` once) or ``spawn`` (a fresh interpreter each). Env ``AGL_RUNNER_START`` overrides the default.
ENV_RUNNER_START = "AGL_RUNNER_START"

#: What the fork server imports once for every runner it forks: agl's runner side and the OpenAI SDK most agents
#: call, with the parts the SDK imports only at its first call (its resources, streaming helpers and HTTP stack:
#: ~630 modules, 0.9 s of CPU per runner otherwise; a missing one is skipped). Never the agent's own module nor a
#: framework: those are imported in each runner, after it switched the frameworks' telemetry off, so a runner holds
#: only what its own agent imports and nothing one agent's module did at import time is shared by another's runners.
RUNNER_PRELOAD = (
    "agl.core.runner",
    "agl.core.store.http",
    "openai",
    "openai.resources",
    "openai.lib.streaming.chat",
    "httpcore2",
    "anyio",
    "anyio._backends._asyncio",
    "h11",
    "jiter",
)


def default_start_method() -> str:
    """``forkserver`` where the platform has it (Linux, macOS), else ``spawn``; env ``AGL_RUNNER_START`` overrides."""
    chosen = os.environ.get(ENV_RUNNER_START, "").strip().lower()
    if chosen:
        if chosen not in ("forkserver", "spawn"):
            raise ValueError(f"{ENV_RUNNER_START}: expected 'forkserver' or 'spawn', got {chosen!r}")
        return chosen
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


@contextlib.contextmanager
def _without_token_in_environ() -> Iterator[None]:
    """``AGL_TOKEN`` out of this process's environment while a runner (or the fork server it forks from) starts, so
    that the new process's own environment block (``/proc/<pid>/environ``, which no later ``unsetenv`` clears) never
    holds it: the runner gets its token with its arguments."""
    token = os.environ.pop(ENV_TOKEN, None)
    try:
        yield
    finally:
        if token is not None:
            os.environ[ENV_TOKEN] = token


class RunnerPool:
    """``n`` runner processes for ``server_url``, replaced when they die; the one supervisor of runner processes.

    Call ``check()`` regularly: it replaces dead workers and raises ``RunnerPoolError`` when it cannot keep them
    alive — a worker gave up on the store (``EXIT_STORE_FAILED``), or the workers of one slot died ``max_deaths``
    times in a row without finishing a rollout (they cannot start, or the agent kills them). A worker that left a
    hung or taken-away attempt (``EXIT_ABANDONED``) is replaced without counting as a death. ``stop()`` asks workers
    to finish their rollout and exit, then kills those still running after ``timeout``. ``token``: the server token
    the workers send (default: env ``AGL_TOKEN``), handed to them with their arguments, not on a command line.
    ``integrations``: integrations every rollout enters besides those of the frameworks the agent's module imports
    (see ``Runner``). The workers import the agent themselves (it travels pickled), after switching off the
    frameworks' own telemetry (``agl.core.telemetry``).

    ``start_method``: ``forkserver`` (the default where available) forks every runner from Python's fork server,
    which imports agl's runner side and the OpenAI SDK once (``RUNNER_PRELOAD``) instead of once per runner;
    ``spawn`` starts a fresh interpreter per runner (env ``AGL_RUNNER_START=spawn``). Either way a runner imports the
    agent's module itself, and with it only the frameworks that module imports.

    Example::

        pool = RunnerPool("my_agents:solve", "http://127.0.0.1:4747", 4).start()
        try:
            while True:
                pool.check()
                time.sleep(0.5)
        finally:
            pool.stop()
    """

    def __init__(
        self,
        agent: AgentFn | str,
        server_url: str,
        n: int,
        *,
        name: str = "runner",
        retry_for: float = 60.0,
        log_level: int = logging.WARNING,
        max_deaths: int = 3,
        daemon: bool = True,
        token: str | None = None,
        integrations: Sequence[str] = (),
        start_method: str | None = None,
    ) -> None:
        if n < 0:
            raise ValueError(f"runners: must be >= 0, got {n}")
        method = start_method or default_start_method()
        if method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method: expected 'forkserver' or 'spawn', got {method!r}")
        self.agent = agent
        self.integrations = resolve_integrations(integrations)
        self._sent_agent = agent if isinstance(agent, str) else pickle.dumps(agent)
        self.server_url = server_url
        self._token = os.environ.get(ENV_TOKEN) if token is None else token
        self.n = n
        self.name = name
        self.retry_for = retry_for
        self.log_level = log_level
        self.max_deaths = max_deaths
        self.daemon = daemon
        self.start_method = method
        self._ctx: Any = mp.get_context(method)
        if method == "forkserver":
            self._ctx.set_forkserver_preload(list(RUNNER_PRELOAD))
        self._stop = self._ctx.Event()
        self._procs: list[Any] = []
        self._progress: list[Any] = []
        self._deaths = [0] * n
        self.replaced = 0

    def start(self) -> RunnerPool:
        self._progress = [self._ctx.Value("q", 0) for _ in range(self.n)]
        self._procs = [self._spawn(slot) for slot in range(self.n)]
        return self

    def _spawn(self, slot: int) -> Any:
        worker_id = f"{self.name}-{slot}-{new_id('w')[2:10]}"
        progress = self._progress[slot] = self._ctx.Value("q", 0)
        proc = self._ctx.Process(
            target=worker_main,
            args=(self._sent_agent, self.server_url, worker_id, self._stop, self.log_level, self.retry_for, progress),
            kwargs={
                "token": self._token,
                "integrations": self.integrations,
                "environ": {k: v for k, v in os.environ.items() if k != ENV_TOKEN},
                "streams": (_Inherited(1), _Inherited(2)) if self.start_method == "forkserver" else None,
            },
            name=f"agl-{self.name}-{slot}",
            daemon=self.daemon,
        )
        with _without_token_in_environ():
            proc.start()
        return proc

    def pids(self) -> list[int | None]:
        """The process id of the runner in each slot (None before ``start``)."""
        return [proc.pid for proc in self._procs] or [None] * self.n

    def check(self) -> None:
        """Replace workers that died; raise ``RunnerPoolError`` when they cannot be kept alive."""
        for slot, proc in enumerate(self._procs):
            if proc.is_alive():
                continue
            code = proc.exitcode
            if code == EXIT_STORE_FAILED:
                raise RunnerPoolError(
                    f"{proc.name} could not work with the agl server at {self.server_url} for {self.retry_for:g}s "
                    "(unreachable, or failing every request; its log above says which); giving up. Check that "
                    "`agl server` runs and can write its store, then start the runners again"
                )
            if code == EXIT_TOKEN_REFUSED:
                raise RunnerPoolError(
                    f"{proc.name}: the agl server at {self.server_url} refused the runner's token (its log above has "
                    f"the server's answer); give runners a token of the runner or trainer role (env {ENV_TOKEN})"
                )
            if code == EXIT_ABANDONED:
                log.warning("%s left a hung or taken-away attempt; starting a fresh one", proc.name)
            else:
                finished = self._progress[slot].value
                self._deaths[slot] = 1 if finished else self._deaths[slot] + 1
                if self._deaths[slot] >= self.max_deaths:
                    raise RunnerPoolError(
                        f"{proc.name} died {self._deaths[slot]} times in a row without finishing a rollout (last: "
                        f"{_describe_exit(code)}); the agent or its environment kills the runner process (see the "
                        "log above); giving up"
                    )
                log.warning("%s died (%s); starting a new one", proc.name, _describe_exit(code))
            self._procs[slot] = self._spawn(slot)
            self.replaced += 1

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every worker to stop after its current rollout; kill those still running after ``timeout``."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs = []
