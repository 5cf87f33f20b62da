"""Runners: lease a rollout → hand the agent its resources → run it → heartbeat → report.

Concurrency model: one runner = one process running one rollout at a time (plus a heartbeat thread and the span
sink's flush thread). Runners talk to an agl server over HTTP, so they can live on any machine. A crashing agent fails
its attempt, never the runner; a killed runner stops heartbeating and the store retries its rollout elsewhere.
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
import os
import threading
from collections.abc import Callable
from typing import Any

from agl.core.emit import RolloutContext, SpanSink, emit_exception, rollout_scope
from agl.core.store.base import Store
from agl.core.types import LLM, Attempt, Resource, Rollout, new_id

log = logging.getLogger("agl.runner")

AgentFn = Callable[[Any, dict[str, Any]], Any]


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


@functools.cache
def _integrations() -> tuple[tuple[str, str], ...]:
    """Installed integrations: entry points of group ``agl.integrations``, named for the module they need."""
    return tuple((ep.name, ep.value) for ep in importlib.metadata.entry_points(group="agl.integrations"))


def integration_scopes() -> contextlib.ExitStack:
    """Enter the capture scope of every integration whose framework is installed (call inside ``rollout_scope``).

    Integrations register as entry points (``langchain_core = "agl.integrations.langchain:activate"``), so the
    core never imports them by name and a third-party package can add its own.
    """
    stack = contextlib.ExitStack()
    for framework, target in _integrations():
        if importlib.util.find_spec(framework) is None:
            continue
        module, _, attr = target.partition(":")
        try:
            activate = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            log.warning(
                "integration %s for %s is unavailable (%s); its framework is not captured", target, framework, exc
            )
            continue
        stack.enter_context(activate())
    return stack


class Runner:
    """Runs rollouts from ``store`` one after another until ``stop`` is set (or ``max_rollouts`` ran)."""

    def __init__(
        self,
        agent: AgentFn,
        store: Store,
        server_url: str,
        *,
        worker_id: str | None = None,
        poll_interval: float = 0.05,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.server_url = server_url
        self.worker_id = worker_id or f"{os.uname().nodename}-{os.getpid()}-{new_id('w')[2:8]}"
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval or max(0.2, store.settings.heartbeat_timeout / 4)
        self._resources: dict[int, dict[str, Resource]] = {}

    def run(self, stop: threading.Event | Any, max_rollouts: int | None = None) -> int:
        """Work until ``stop`` is set; returns how many rollouts this runner finished."""
        done = 0
        while not stop.is_set() and (max_rollouts is None or done < max_rollouts):
            leased = self.store.lease(self.worker_id)
            if leased is None:
                stop.wait(self.poll_interval)
                continue
            self.run_one(*leased)
            done += 1
        return done

    def run_one(self, rollout: Rollout, attempt: Attempt) -> None:
        """One attempt, start to report. Never raises for the agent's own errors."""
        if rollout.resources_version not in self._resources:
            self._resources[rollout.resources_version] = self.store.get_resources(rollout.resources_version).resources
        resources = gateway_resources(self._resources[rollout.resources_version], self.server_url, rollout, attempt)
        sink = SpanSink(self.store)
        ctx = RolloutContext(rollout.rollout_id, attempt.attempt_id, sink, resources=resources, task=rollout.task)
        finished = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(attempt.attempt_id, finished), daemon=True)
        beat.start()
        status, reward, error = "succeeded", None, None
        with rollout_scope(ctx), integration_scopes():
            try:
                reward = final_reward_of(call_agent(self.agent, rollout.task, resources))
            except Exception as exc:
                status, error = "failed", f"{type(exc).__name__}: {exc}"
                emit_exception(exc)
                log.warning("rollout %s failed: %s", rollout.rollout_id, error)
        try:
            sink.close()
        except Exception as exc:
            status, error = "failed", f"could not store the rollout's spans: {exc}"
        finished.set()
        beat.join()
        self.store.complete_attempt(attempt.attempt_id, status, final_reward=reward, error=error)  # type: ignore[arg-type]

    def _heartbeat(self, attempt_id: str, finished: threading.Event) -> None:
        while not finished.wait(self.heartbeat_interval):
            try:
                if not self.store.heartbeat(attempt_id):
                    log.warning("attempt %s was taken away (reaped); its result will be ignored", attempt_id)
                    return
            except Exception as exc:
                log.warning("heartbeat for %s failed: %s", attempt_id, exc)


def worker_main(
    agent: AgentFn | str, server_url: str, worker_id: str, stop: Any, log_level: int = logging.WARNING
) -> None:
    """Entry point of a runner process (spawned by the Trainer or by ``agl runner``)."""
    from agl.core.store.http import HttpStore

    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    fn = load_agent(agent) if isinstance(agent, str) else agent
    store = HttpStore(server_url)
    try:
        Runner(fn, store, server_url, worker_id=worker_id).run(stop)
    finally:
        store.close()
