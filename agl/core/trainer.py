"""Trainer: starts the store (and in embedded mode the server), the runners, and drives an algorithm.

Concurrency model: the trainer process owns the store handle and, in embedded mode, an ``AglServer`` thread (store
API + LLM gateway); runners are separate processes that reach that server over loopback HTTP. A ``RunnerPool``
replaces dead runners while rollouts are awaited (their rollouts are retried by the store's lost-worker rules) and
raises ``RunnerPoolError`` when it cannot keep them alive.
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agl.core.adapter import CaptureFailure, build_trajectory, check_capture, select_agents
from agl.core.algorithm import Algorithm, Baseline
from agl.core.context import RolloutBatch, TrainContext
from agl.core.failures import ROLLOUT_TIMEOUT_PREFIX
from agl.core.integration_scopes import resolve_integrations
from agl.core.net import bind, url_of
from agl.core.reporting import Reporter
from agl.core.runner import AgentFn
from agl.core.runner_pool import RunnerPool, RunnerPoolError
from agl.core.runs import recorded_run
from agl.core.store import Store, StoreSettings, open_store
from agl.core.store.base import MAX_CANCEL_REASON
from agl.core.types import (
    ENV_TOKEN,
    LLM,
    REDACTED,
    Resource,
    ResourceSet,
    Rollout,
    RolloutMode,
    RolloutRequest,
    Trajectory,
)

if TYPE_CHECKING:
    from agl.otel.export import LiveExporter

log = logging.getLogger("agl.trainer")

#: Seconds added to the default ``rollout_timeout`` for starting a replacement runner process.
RUNNER_START_GRACE = 60.0


class CaptureError(RuntimeError):
    """Rollouts finished without the data training or evaluation needs (see ``failures``)."""

    def __init__(self, failures: Sequence[CaptureFailure]) -> None:
        self.failures = list(failures)
        lines = "\n  ".join(str(f) for f in self.failures[:10])
        more = f"\n  ... and {len(self.failures) - 10} more" if len(self.failures) > 10 else ""
        super().__init__(
            f"{len(self.failures)} rollout(s) captured nothing usable:\n  {lines}{more}\n"
            "(pass allow_capture_failures=True to count them and carry on)"
        )


@dataclass
class FitResult:
    """What ``Trainer.fit`` returns: the algorithm's final metrics and the resources it left published."""

    metrics: dict[str, Any]
    #: None on a process that only followed another's fit (``Algorithm.follows``).
    resources: ResourceSet | None


class Trainer:
    """Runs an agent on tasks through runners and a store, and improves its resources with an algorithm.

    Args:
        algorithm: what ``fit`` runs (``Baseline()`` by default: measure only).
        n_runners: runner processes started here (0 = use runners started elsewhere with ``agl runner``).
        store: ``sqlite:///path.db`` or ``postgresql://user:password@host/db`` (embedded: this process opens the
            store and serves it to its runners) or ``http://host:port`` (an ``agl server``).
        resources: published as a new version at start (omit to reuse the store's latest).
        agents: whose LLM calls become transitions: names, a regex, or None for all.
        max_attempts: tries per rollout when a worker is lost, an attempt times out, or the agent failed only
            because agl's own gateway or store could not be reached (a lost attempt).
        heartbeat_timeout: see ``StoreSettings`` (embedded mode).
        attempt_timeout: see ``StoreSettings`` (embedded mode).
        rollout_timeout: the longest a batch may go without any of its rollouts finishing; then its unfinished
            rollouts are cancelled. Default: ``max_attempts × (attempt_timeout + heartbeat_timeout) + 60`` — as long
            as the store's retry rules can keep one rollout busy, plus time to replace a runner — so a batch nobody
            works on ends instead of hanging. ``math.inf`` waits forever.
        allow_capture_failures: count rollouts that captured nothing usable instead of raising ``CaptureError``.
        success_threshold: a final reward at or above it counts as a success.
        run_dir: where metrics and reports go (default: the SQLite file's folder, else ``runs/``).
        token: the bearer token for an ``http://`` store and the runners started here (default: env ``AGL_TOKEN``).
            In embedded mode the server always has tokens: a fresh runner token for this trainer's runners, and
            ``token`` (or a fresh one) as its trainer token, for runners started elsewhere with ``agl runner``.
        integrations: framework integrations the runners started here enter in every rollout (``"crewai"``,
            ``"autogen"``, ``"openai_agents"``, ``"langchain"``, or their entry point names). Without it a runner
            enters those of the frameworks the agent's module imports; declare a framework the agent imports only
            inside its own code. See ``agl.core.integration_scopes.integration_scopes``.
        report_to: also write the numeric metrics to ``"tensorboard"``, ``"mlflow"`` and/or ``"wandb"`` (one name or
            a list; default none). See ``agl.core.reporting``.
        otlp_endpoint: an OTLP/HTTP receiver (``http://host:port``; Phoenix, Langfuse, MLflow, a collector): while
            the store is open, an ``agl.otel.LiveExporter`` sends each rollout that finishes there as a trace; closing
            the Trainer sends what finished last. Needs the ``otel`` extra.

    The agent must be importable (a module-level function): runners are separate processes. Scripts that create a
    Trainer need the ``if __name__ == "__main__":`` guard. Runners that die are replaced; when they cannot be kept
    alive (see ``agl.core.runner_pool.RunnerPool``), ``evaluate``/``fit`` raise ``RunnerPoolError`` instead of waiting.
    Server and runners start at the first ``evaluate``/``fit`` and stay up for the next ones (the same runner
    processes, unless the agent changes) until ``close()``, the end of a ``with`` block, the Trainer being
    garbage-collected, or interpreter exit.
    """

    def __init__(
        self,
        algorithm: Algorithm | None = None,
        *,
        n_runners: int = 2,
        store: str = "sqlite:///runs/agl.db",
        resources: dict[str, Resource] | None = None,
        agents: str | Sequence[str] | None = None,
        max_attempts: int = 3,
        heartbeat_timeout: float = 30.0,
        attempt_timeout: float = 1800.0,
        rollout_timeout: float | None = None,
        allow_capture_failures: bool = False,
        success_threshold: float = 1.0,
        run_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        progress: bool = True,
        token: str | None = None,
        integrations: Sequence[str] | None = None,
        report_to: str | Sequence[str] | None = None,
        otlp_endpoint: str | None = None,
    ) -> None:
        if n_runners < 0:
            raise ValueError(f"n_runners: must be >= 0, got {n_runners}")
        self.integrations = resolve_integrations(integrations)
        select_agents(agents)
        self.algorithm = algorithm or Baseline()
        self.n_runners = n_runners
        self.store_url = store
        self.resources = resources
        self.agents = agents
        self.max_attempts = max_attempts
        self.settings = StoreSettings(heartbeat_timeout=heartbeat_timeout, attempt_timeout=attempt_timeout)
        self._rollout_timeout = rollout_timeout
        self.allow_capture_failures = allow_capture_failures
        self.success_threshold = success_threshold
        if run_dir is None:
            run_dir = Path(store[len("sqlite:///") :]).parent if store.startswith("sqlite:///") else Path("runs")
        self.run_dir = Path(run_dir)
        self.host, self.port = host, port
        self.progress = progress
        self._live = _Live()
        self.server_url: str | None = None
        self._token = token
        self._keys: dict[tuple[str, str], str] = {}
        self.otlp_endpoint = otlp_endpoint
        # what is up when the Trainer is closed, garbage-collected, or the interpreter exits (a finalize object stays
        # alive in weakref's own registry until it runs, so it needs no reference here)
        weakref.finalize(self, self._live.close)
        self._reporter = Reporter(report_to, self.run_dir)
        weakref.finalize(self, self._reporter.close)

    @property
    def _store(self) -> Store | None:
        return self._live.store

    @property
    def _server(self) -> Any:
        return self._live.server

    @property
    def _pool(self) -> RunnerPool | None:
        return self._live.pool

    @property
    def embedded(self) -> bool:
        """Whether this Trainer serves its store itself (any store URL but ``http(s)://``: an agl server's)."""
        return not self.store_url.startswith(("http://", "https://"))

    @property
    def rollout_timeout(self) -> float:
        """Seconds a batch may go without a rollout finishing (the default follows the store's timing rules)."""
        if self._rollout_timeout is not None:
            return self._rollout_timeout
        settings = self._store.settings if self._store is not None else self.settings
        return self.max_attempts * (settings.attempt_timeout + settings.heartbeat_timeout) + RUNNER_START_GRACE

    @rollout_timeout.setter
    def rollout_timeout(self, value: float | None) -> None:
        self._rollout_timeout = value

    # lifecycle --------------------------------------------------------------------------------------------------
    def __enter__(self) -> Trainer:
        """``with Trainer(...) as t:`` closes it (runners, server, store) at the end of the block."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, agent: AgentFn | str) -> Store:
        """The store, the server (embedded mode) and a runner pool for ``agent``: started at the first call, kept for
        the Trainer's lifetime (its runner processes stay up across ``evaluate``/``fit`` calls; another agent gets
        new runners, the server and store stay)."""
        live = self._live
        if live.store is not None and live.agent == agent:
            return live.store
        if not isinstance(agent, str):
            try:
                pickle.dumps(agent)
            except Exception as exc:
                raise ValueError(
                    f"agent: {agent!r} cannot be sent to runner processes ({exc}); use a module-level function"
                ) from exc
        live.stop_pool()
        live.agent = agent
        if live.store is None:
            self._open(agent)
        else:
            self._start_pool(agent)
        assert live.store is not None
        return live.store

    def _start_pool(self, agent: AgentFn | str) -> None:
        if self.n_runners and self.server_url is not None:
            self._live.pool = RunnerPool(
                agent, self.server_url, self.n_runners, token=self._live.runner_token, integrations=self.integrations
            ).start()

    def _open(self, agent: AgentFn | str) -> None:
        """Open the store and, in embedded mode, serve it; start the runners as early as their server's address is
        known (their processes start up while the server does)."""
        live = self._live
        token = self._token if self._token is not None else os.environ.get(ENV_TOKEN) or None
        store = open_store(self.store_url, self.settings, token=token)
        live.store, live.runner_token = store, token
        try:
            if self.otlp_endpoint is not None:
                from agl.otel.export import LiveExporter

                live.exporter = LiveExporter(store, self.otlp_endpoint).start()
            if self.embedded:
                live.runner_token = secrets.token_urlsafe(32)
                sock = bind(self.host, self.port)
                try:
                    self.server_url = url_of(self.host, sock.getsockname()[1])
                    self._start_pool(agent)
                    from agl.core.server import AglServer
                    from agl.core.server.auth import Tokens
                except BaseException:
                    sock.close()
                    raise
                tokens = Tokens([("runner", live.runner_token), ("trainer", token or secrets.token_urlsafe(32))])
                live.server = AglServer(store, host=self.host, port=self.port, tokens=tokens).start(sock=sock)
            else:
                self.server_url = self.store_url
                self._start_pool(agent)
            if self.resources:
                store.publish_resources(self.resources)
                self._remember_keys(self.resources)
                self.resources = None
        except BaseException:
            live.close()
            raise

    def _remember_keys(self, resources: dict[str, Resource]) -> None:
        """Keep the API keys of LLMs this trainer publishes: an agl server answers them redacted."""
        for name, res in resources.items():
            if isinstance(res, LLM) and res.api_key != REDACTED:
                self._keys[(name, res.base_url)] = res.api_key

    def _unredact(self, rs: ResourceSet) -> ResourceSet:
        """``rs`` with each redacted LLM key this trainer published (same name and base_url) filled in."""
        filled: dict[str, Resource] = {}
        for name, res in rs.resources.items():
            key = self._keys.get((name, res.base_url)) if isinstance(res, LLM) and res.api_key == REDACTED else None
            filled[name] = res.model_copy(update={"api_key": key}) if key is not None else res
        return rs.model_copy(update={"resources": filled})

    def close(self) -> None:
        """Stop the runners and the embedded server and close the store (the store file stays). Also done by the
        ``with`` block's end, when the Trainer is garbage-collected, and at interpreter exit; a later ``evaluate`` or
        ``fit`` starts them again. Closes the ``report_to`` writers too."""
        try:
            self._live.close()
        finally:
            self._reporter.close()

    # public API -------------------------------------------------------------------------------------------------
    def evaluate(self, agent: AgentFn | str, tasks: Sequence[Any], *, mode: RolloutMode = "test") -> RolloutBatch:
        """Run every task once with the current resources; returns rewards, trajectories and a summary. Recorded
        as a run (``agl.core.runs``)."""
        if self.algorithm.follows():
            raise RuntimeError(
                f"evaluate: this process only follows the fit of another ({type(self.algorithm).__name__}.follows(): "
                "a rank other than 0 of a distributed update); evaluate on rank 0 only"
            )
        store = self._start(agent)
        with recorded_run(store, "evaluate", type(self.algorithm).__name__, [mode]) as run_id:
            ctx = TrainContext(self, store, run_id)
            return ctx.rollouts(tasks, mode=mode, desc=f"evaluate ({mode})")

    def fit(
        self, agent: AgentFn | str, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None = None
    ) -> FitResult:
        """Let the algorithm improve the resources; returns its metrics and the resources it published last.
        Recorded as a run (``agl.core.runs``).

        In a process that only follows another's fit (``Algorithm.follows``: a rank other than 0 of a distributed
        update), it starts no store, server or runners: it follows until the leading process's fit ends and returns
        this process's metrics with no resources."""
        if self.algorithm.follows():
            return FitResult(metrics=self.algorithm.follow(), resources=None)
        store = self._start(agent)
        with recorded_run(store, "fit", type(self.algorithm).__name__, ["train", "val"]) as run_id:
            ctx = TrainContext(self, store, run_id)
            metrics = self.algorithm.fit(ctx, list(train_tasks), list(val_tasks) if val_tasks is not None else None)
        return FitResult(metrics=metrics, resources=self._unredact(store.get_resources()))

    # internals --------------------------------------------------------------------------------------------------
    def _run_requests(self, store: Store, requests: list[RolloutRequest], desc: str) -> RolloutBatch:
        if not requests:
            return RolloutBatch([], [], success_threshold=self.success_threshold)
        if self.n_runners == 0:
            log.info("no local runners: waiting for runners started with `agl runner`")
        ids = [r.rollout_id for r in store.enqueue(requests)]
        rollouts = self._wait(store, ids, desc)
        selector = select_agents(self.agents)
        trajectories: list[Trajectory] = []
        failures: list[CaptureFailure] = []
        for ro in rollouts:
            attempts = store.list_attempts(ro.rollout_id)
            final = next((a for a in reversed(attempts) if a.status in ("succeeded", "failed")), None)
            spans = store.query_spans(attempt_id=final.attempt_id) if final else []
            traj = build_trajectory(ro, spans, selector, final.attempt_id if final else None, air=self.algorithm.air)
            trajectories.append(traj)
            failure = check_capture(traj, spans, self.algorithm.requires_token_ids)
            if failure is not None:
                log.error("capture failure: %s", failure)
                failures.append(failure)
        if failures and not self.allow_capture_failures:
            raise CaptureError(failures)
        return RolloutBatch(rollouts, trajectories, failures, self.success_threshold)

    def _wait(self, store: Store, ids: list[str], desc: str) -> list[Rollout]:
        """Wait for the rollouts while supervising the runners; cancel the rest after ``rollout_timeout`` idle.

        Interrupted (Ctrl-C, the runners cannot be kept alive, the store failed), it cancels the batch's unfinished
        rollouts, so the runners kept for the next call do not work on them, and stops runners it cannot keep.
        """
        bar = _progress(len(ids), desc, self.progress)
        limit = self.rollout_timeout
        progressed = time.monotonic()
        done = 0
        try:
            while True:
                if self._pool is not None:
                    self._pool.check()
                rollouts = store.wait(ids, timeout=0.5)
                finished = sum(r.finished for r in rollouts)
                if finished > done:
                    bar.update(finished - done)
                    done, progressed = finished, time.monotonic()
                if finished == len(ids):
                    return rollouts
                if time.monotonic() - progressed > limit:
                    left = [r.rollout_id for r in rollouts if not r.finished]
                    store.cancel(left, f"{ROLLOUT_TIMEOUT_PREFIX}: no rollout of the batch finished for {limit:g}s")
                    log.error(
                        "rollout_timeout: no rollout finished for %.0fs; cancelled %d unfinished rollouts (are runners "
                        "working for this store?)",
                        limit,
                        len(left),
                    )
                    return store.get_rollouts(ids)
        except BaseException as exc:
            try:
                store.cancel(ids, _interrupted(exc))
            except Exception as cancel_exc:  # the store is what failed: the error raised below says so
                log.warning("could not cancel the unfinished rollouts: %s", cancel_exc)
            if isinstance(exc, RunnerPoolError):
                self._live.stop_pool()
            raise
        finally:
            bar.close()


def _interrupted(exc: BaseException) -> str:
    """The cancel reason of a batch ``exc`` interrupted (one line, within ``MAX_CANCEL_REASON``)."""
    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    reason = " ".join(f"the batch was interrupted ({what})".split())
    return reason if len(reason) <= MAX_CANCEL_REASON else reason[: MAX_CANCEL_REASON - 1] + "…"


class _Live:
    """What a Trainer has started: store, embedded server, runner pool, OTLP exporter (closed by ``Trainer.close``,
    and by a ``weakref.finalize`` when the Trainer is collected or the interpreter exits, so it must not refer to the
    Trainer)."""

    def __init__(self) -> None:
        self.store: Store | None = None
        self.server: Any = None
        self.pool: RunnerPool | None = None
        self.agent: AgentFn | str | None = None
        self.runner_token: str | None = None
        self.exporter: LiveExporter | None = None

    def stop_pool(self) -> None:
        if self.pool is None:
            return
        if self.server is not None:
            self.server.drain()  # waiting leases answer at once: idle runners see their stop now
        try:
            self.pool.stop(timeout=10)
        finally:
            self.pool = self.agent = None
            if self.server is not None:
                self.server.drain(False)

    def close(self) -> None:
        try:
            self.stop_pool()
        finally:
            self.agent = None
            if self.server is not None:
                self.server.stop()
                self.server = None
            self.close_exporter()
            if self.store is not None:
                self.store.close()
                self.store = None

    def close_exporter(self) -> None:
        """Send the rollouts that finished since the exporter's last poll, then stop it (a failed send is logged:
        closing a Trainer does not fail for an unreachable receiver)."""
        if self.exporter is None:
            return
        try:
            self.exporter.close()
        except Exception as exc:
            log.warning("agl: the last OTLP export failed: %s", exc)
        finally:
            self.exporter = None


class _NoBar:
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="rollout", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
