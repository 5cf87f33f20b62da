"""Runners: lease a rollout → hand the agent its resources → run it → heartbeat → report. The pool that keeps runner
processes alive is ``agl.core.runner_pool``; which integrations a rollout enters, ``agl.core.integration_scopes``;
whose fault a failure is, ``agl.core.outage``.

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
import contextvars
import importlib
import importlib.metadata
import inspect
import logging
import math
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from agl.core.emit import RolloutContext, SpanSink, emit_exception, rollout_scope
from agl.core.integration_scopes import integration_scopes, late_import_error, resolve_integrations, warm_integrations
from agl.core.outage import agl_side_failure
from agl.core.store.base import NotFound, Store, StoreDenied, StoreError, StoreUnavailable
from agl.core.telemetry import quiet_framework_telemetry
from agl.core.types import (
    ENV_TOKEN,
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
    """Run a sync or async agent to completion; an async one on this thread's agent loop (``_agent_loop``)."""
    result = agent(task, resources)
    if inspect.isawaitable(result):
        # in a copy of this rollout's context: left to itself the loop would run every rollout in the context it
        # copied for the first one, and spans would go to that rollout
        return _agent_loop().run(_alone(result), context=contextvars.copy_context())
    return result


_loops = threading.local()


def _agent_loop() -> asyncio.Runner:
    """This thread's event loop for async agents, kept from rollout to rollout (a new one in a forked child): what an
    agent builds once on it, such as an HTTP client's connection pool (``agl.clients``), stays usable, and no rollout
    pays for a loop of its own. ``_alone`` ends each rollout as ``asyncio.run`` would."""
    held: tuple[int, asyncio.Runner] | None = getattr(_loops, "runner", None)
    if held is None or held[0] != os.getpid():
        held = (os.getpid(), asyncio.Runner())
        _loops.runner = held
    return held[1]


async def _alone(awaitable: Any) -> Any:
    """Await the agent, then cancel whatever it left running (and wait for it), so nothing of one rollout runs on
    into the next."""
    try:
        return await awaitable
    finally:
        current = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not current]
        for task in left:
            task.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)


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
