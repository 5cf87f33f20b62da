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
  exits with ``EXIT_STORE_FAILED`` and its pool gives up.
- A runner whose attempt was taken away (reaped as lost or timed out, or cancelled), or that ran past the store's
  ``attempt_timeout``, leaves its process with ``EXIT_ABANDONED``: a hung agent cannot be interrupted any other way.
  The pool starts a fresh process and the store retries the rollout.
- Any other death (a crash, ``kill -9``) is replaced too. When the workers of one slot died ``max_deaths`` times in
  a row without finishing a rollout, the pool gives up: the agent or its environment kills every runner.
- An integration whose ``activate()`` raises is skipped for that rollout with a warning and an ``exception`` span
  naming it; the agent still runs, uncaptured by that framework's hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from agl.core.emit import RolloutContext, SpanSink, current_rollout, emit_exception, record_exception, rollout_scope
from agl.core.store.base import NotFound, Store, StoreError, StoreUnavailable
from agl.core.types import ATTR_INTEGRATION, LLM, Attempt, AttemptStatus, Resource, Rollout, new_id

log = logging.getLogger("agl.runner")

AgentFn = Callable[[Any, dict[str, Any]], Any]

#: Exit code of a runner process that gave up because the store failed (or was unreachable) for ``retry_for`` seconds.
EXIT_STORE_FAILED = 75
#: Exit code of a runner process that left a hung, timed-out or taken-away attempt; its pool replaces it.
EXIT_ABANDONED = 76
#: Span attribute naming the integration (entry point target) an ``exception`` span is about.


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


def gateway_resources(resources: dict[str, Resource], server_url: str, rollout: Rollout, attempt: Attempt) -> dict:
    """The resources as the agent sees them: every LLM's base_url points at the gateway route of this attempt."""
    out: dict[str, Any] = {}
    for name, res in resources.items():
        if isinstance(res, LLM):
            url = f"{server_url.rstrip('/')}/gw/{rollout.rollout_id}/{attempt.attempt_id}/{name}/v1"
            out[name] = res.model_copy(update={"base_url": url})
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
#: Answers a server gives while it (or what is behind it) is briefly unable to serve.
_UNAVAILABLE_STATUS = frozenset({502, 503, 504})


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
    """How ``exc`` itself is a failed request to ``base`` (unreachable, dropped, or 502/503/504), or None."""
    names = _class_names(exc)
    if not names:
        return None
    request = _request_of(exc)
    url = str(getattr(request, "url", ""))
    if not url.startswith(base):
        return None
    status = _status_of(exc)
    unreachable = bool(names & _CONNECTION_ERRORS) and not names & _SLOW_ERRORS
    if not (unreachable or status in _UNAVAILABLE_STATUS):
        return None
    what = f"HTTP {status}" if status in _UNAVAILABLE_STATUS else type(exc).__name__
    return f"{what} on {getattr(request, 'method', 'request')} {url}: {exc}"


def agl_side_failure(exc: BaseException, server_url: str) -> str | None:
    """Why the agent's failure ``exc`` is agl's own fault, or None when it is the agent's.

    It is agl's fault when the exception, or one it was raised from or while handling (``__cause__`` /
    ``__context__``), is a request to ``server_url`` (this runner's gateway and store) that could not connect, lost
    its connection, or was answered 502/503/504. An exception group is agl's fault when all of its members are.
    Timeouts are the agent's (its own limit, a slow model), and so is every other error.
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


@functools.cache
def _integrations() -> tuple[tuple[str, str], ...]:
    """Installed integrations: entry points of group ``agl.integrations``, named for the module they need."""
    return tuple((ep.name, ep.value) for ep in importlib.metadata.entry_points(group="agl.integrations"))


_warned_integrations: set[str] = set()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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


def warm_integrations() -> None:
    """Import every installed integration and its framework now, so a runner's first attempt does not pay for it.

    Errors are left for ``integration_scopes`` to report in each rollout.
    """
    for framework, target in _integrations():
        if _installed(framework):
            with contextlib.suppress(Exception):
                importlib.import_module(framework)
                importlib.import_module(target.partition(":")[0])


def integration_scopes() -> contextlib.ExitStack:
    """Enter the capture scope of every integration whose framework is installed (call inside ``rollout_scope``).

    Integrations register as entry points (``langchain_core = "agl.integrations.langchain:activate"``), so the
    core never imports them by name and a third-party package can add their own. One that cannot be imported, or
    whose ``activate()`` raises when called, entered or left, is skipped with a warning (once per process) and an
    ``exception`` span carrying ``agl.integration`` in the rollout; the agent runs either way.
    """
    stack = contextlib.ExitStack()
    for framework, target in _integrations():
        if not _installed(framework):
            continue
        module, _, attr = target.partition(":")
        try:
            scope = getattr(importlib.import_module(module), attr)()
            scope.__enter__()
        except Exception as exc:
            _integration_failed(target, framework, exc, "to activate")
            continue
        stack.push(functools.partial(_exit_integration, target, framework, scope))
    return stack


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
    ) -> None:
        self.agent = agent
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

        Raises ``StoreError`` when leasing failed for ``retry_for`` seconds in a row.
        """
        done = 0
        failing_since: float | None = None
        backoff = self.poll_interval
        while not stop.is_set() and (max_rollouts is None or done < max_rollouts):
            asked = time.monotonic()
            try:
                leased = self.store.lease(self.worker_id)
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
                stop.wait(self.poll_interval)
                continue
            self.run_one(*leased)
            done += 1
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
        with rollout_scope(ctx), integration_scopes():
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
        missing = _unstored_spans(sink)
        if missing is not None and status != "lost":
            status, error = "failed", missing if error is None else f"{missing}; {error}"
        return status, reward, error

    def _resources_for(self, rollout: Rollout, attempt: Attempt) -> dict[str, Any]:
        version = rollout.resources_version
        if version not in self._resources:
            self._resources[version] = self.store.get_resources(version).resources
        return gateway_resources(self._resources[version], self.server_url, rollout, attempt)

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
    agent: AgentFn | str,
    server_url: str,
    worker_id: str,
    stop: Any,
    log_level: int = logging.WARNING,
    retry_for: float = 60.0,
    progress: Any = None,
) -> None:
    """Entry point of a runner process (spawned by ``RunnerPool``; ``progress`` counts its finished rollouts).

    The agent and the integrations are imported before the first lease (an attempt's clock starts at its lease).
    Ctrl-C is left to the pool (it stops its workers through ``stop``). Exits with ``EXIT_STORE_FAILED`` when the
    store failed for ``retry_for`` seconds, ``EXIT_ABANDONED`` when it left a hung or taken-away attempt.
    """
    from agl.core.store.http import HttpStore

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for chatty in ("httpx", "httpx2"):  # not a log line per lease poll or per LLM call
        logging.getLogger(chatty).setLevel(max(log_level, logging.WARNING))
    fn = load_agent(agent) if isinstance(agent, str) else agent
    warm_integrations()
    store = HttpStore(server_url, retry_for=retry_for)
    try:
        Runner(fn, store, server_url, worker_id=worker_id, retry_for=retry_for, progress=progress).run(stop)
    except StoreError as exc:
        log.error("runner %s gives up: %s", worker_id, exc)
        raise SystemExit(EXIT_STORE_FAILED) from None
    finally:
        store.close()


# -------------------------------------------------------------------------------------------------- pool


class RunnerPoolError(RuntimeError):
    """Runner processes cannot be kept alive; the message says why and what to check."""


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class RunnerPool:
    """``n`` runner processes for ``server_url``, replaced when they die; the one supervisor of runner processes.

    Call ``check()`` regularly: it replaces dead workers and raises ``RunnerPoolError`` when it cannot keep them
    alive — a worker gave up on the store (``EXIT_STORE_FAILED``), or the workers of one slot died ``max_deaths``
    times in a row without finishing a rollout (they cannot start, or the agent kills them). A worker that left a
    hung or taken-away attempt (``EXIT_ABANDONED``) is replaced without counting as a death. ``stop()`` asks workers
    to finish their rollout and exit, then kills those still running after ``timeout``.

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
    ) -> None:
        if n < 0:
            raise ValueError(f"runners: must be >= 0, got {n}")
        self.agent = agent
        self.server_url = server_url
        self.n = n
        self.name = name
        self.retry_for = retry_for
        self.log_level = log_level
        self.max_deaths = max_deaths
        self.daemon = daemon
        self._ctx = mp.get_context("spawn")
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
            args=(self.agent, self.server_url, worker_id, self._stop, self.log_level, self.retry_for, progress),
            name=f"agl-{self.name}-{slot}",
            daemon=self.daemon,
        )
        proc.start()
        return proc

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
