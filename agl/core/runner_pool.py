"""The pool that keeps runner processes alive: starts them (forked from their agent's fork server, or spawned),
replaces the ones that die, and gives up, naming why, when they cannot be kept alive (see ``agl.core.runner`` for
how a runner heals)."""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing as mp
import os
import pickle
import signal
import time
from collections.abc import Iterator, Sequence
from typing import Any

from agl.core import fork_servers
from agl.core.integration_scopes import resolve_integrations
from agl.core.runner import EXIT_ABANDONED, EXIT_STORE_FAILED, EXIT_TOKEN_REFUSED, AgentFn, worker_main
from agl.core.types import ENV_TOKEN, new_id

log = logging.getLogger("agl.runner")


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


#: How a pool starts its runner processes: ``forkserver`` (forked from the fork server of its agent's module, which
#: has imported agl's runner side and that module once: ``agl.core.fork_servers``) or ``spawn`` (a fresh interpreter
#: each). Env ``AGL_RUNNER_START`` overrides the default.
ENV_RUNNER_START = "AGL_RUNNER_START"


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
    (see ``Runner``). The agent travels pickled; its module is imported after the frameworks' own telemetry is
    switched off (``agl.core.telemetry``), by the workers' fork server or by each spawned worker.

    ``start_method``: ``forkserver`` (the default where available) forks every runner from the fork server of the
    agent's module (``agl.core.fork_servers``), which imports agl's runner side, the OpenAI SDK and that module, with
    the frameworks it imports, once instead of once per runner; the runners of one agent share those pages, and a
    runner never holds another agent's module. ``spawn`` starts a fresh interpreter per runner, which imports the
    agent's module itself (env ``AGL_RUNNER_START=spawn``: for an agent module whose import must not be shared, one
    that opens a connection or starts a thread when imported).

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
        self._server: fork_servers.AgentForkServer | None = None
        self._stop = self._ctx.Event()
        self._procs: list[Any] = []
        self._progress: list[Any] = []
        self._deaths = [0] * n
        self.replaced = 0

    def start(self) -> RunnerPool:
        if self.start_method == "forkserver" and self._server is None:
            self._server = fork_servers.acquire(fork_servers.agent_module(self.agent))
        self._progress = [None] * self.n  # each slot's counter is made with its runner (_spawn)
        self._procs = []
        try:
            for slot in range(self.n):
                self._procs.append(self._spawn(slot))
        except BaseException:
            self.stop()  # the runners already started, and the fork server, are not left behind
            raise
        return self

    def _spawn(self, slot: int) -> Any:
        worker_id = f"{self.name}-{slot}-{new_id('w')[2:10]}"
        progress = self._progress[slot] = self._ctx.Value("q", 0)
        process: Any = self._ctx.Process
        if self._server is not None:
            process = functools.partial(fork_servers.ServedProcess, self._server.module)
        proc = process(
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
            try:
                proc.start()
            except fork_servers.ForkServerDied as exc:
                raise RunnerPoolError(
                    f"{exc}, so no runner can start: importing the agent's module ends the process that imports it "
                    f"(the log above has what it printed); try `python -c 'import {exc.module}'`"
                ) from exc
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
        if self._server is not None:
            fork_servers.release(self._server)
            self._server = None
