"""The fork servers runner processes start from: one per agent module, so that a runner starts with agl's runner
side, the OpenAI SDK and its own agent's module (with that module's framework and agl's integration of it) already
imported, in pages it shares with the other runners of the same agent — and never with another agent's.

Python's own fork server is one per process, with one preload list for every process it forks
(``multiprocessing.set_forkserver_preload``): it could hold agl and the SDK, but an agent's module there would be
in the runners of every other agent too. Here each agent module has a server of its own (``acquire``/``release``),
started by the first pool of that agent and kept while any pool uses it; at most ``MAX_IDLE`` servers nobody uses
are kept for the next pool, the least recently used stopped first. An agent defined in the main script has a server
without it (its runners import the script themselves, as any process started from a fork server does).

The runners of one agent then share what its module did at import time, as the workers of a pre-forking server
(gunicorn's ``--preload``, Celery's prefork pool) share their application's: a module that opens a connection or
starts a thread when imported should do so on its first call instead, or run its runners with
``AGL_RUNNER_START=spawn`` (a fresh interpreter each)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.context import set_spawning_popen
from multiprocessing.process import BaseProcess
from typing import Any

from agl.core.fork_preload import ENV_AGENT_MODULE

#: What every fork server imports before the agent's module: agl's runner side and the OpenAI SDK most agents call,
#: with the parts the SDK imports only at its first call (its resources, streaming helpers and HTTP stack: ~630
#: modules, 0.9 s of CPU per runner otherwise; a missing one is skipped). ``agl.core.fork_preload`` comes last: it
#: imports the agent's module and freezes what all of them created, so the runners keep sharing it.
RUNNER_PRELOAD = (
    "agl.core.runner",
    "agl.core.runner_pool",
    "agl.core.fork_servers",
    "agl.core.store.http",
    "openai",
    "openai.resources",
    "openai.lib.streaming.chat",
    "httpcore2",
    "anyio",
    "anyio._backends._asyncio",
    "h11",
    "jiter",
    "agl.core.fork_preload",
)

#: Fork servers kept while no pool uses them (each holds ~30 MiB of its own once started).
MAX_IDLE = 2

_lock = threading.Lock()
_starting = threading.Lock()  # one server reads the environment variable naming its module at a time
_servers: dict[str, AgentForkServer] = {}
_idle: OrderedDict[str, None] = OrderedDict()


def agent_module(agent: Any) -> str:
    """The module a fork server imports for ``agent`` (a ``module:function`` reference or the object itself);
    ``""`` for one defined in the main script, which its runners import themselves."""
    module = agent.partition(":")[0] if isinstance(agent, str) else getattr(agent, "__module__", None) or ""
    return "" if module in ("__main__", "__mp_main__") else module


class AgentForkServer(forkserver.ForkServer):
    """Python's fork server, for the runners of the agents of one module (``""``: no agent module)."""

    def __init__(self, module: str) -> None:
        super().__init__()
        self.module = module
        self.users = 0
        self.set_forkserver_preload(list(RUNNER_PRELOAD))

    def ensure_running(self) -> None:
        """Start the server if it is not running (again, if it died), telling it which module to import."""
        with _starting, _environ(ENV_AGENT_MODULE, self.module):
            super().ensure_running()

    def pid(self) -> int | None:
        """The server's process id, None while it is not running."""
        state: Any = self
        return state._forkserver_pid

    def reap(self) -> int | None:
        """After a launch found the server gone: wait for its exit and return its exit code (None if it was not
        started); the next launch starts a new one."""
        state: Any = self
        with state._lock:
            pid = state._forkserver_pid
            if pid is None:
                return None
            _, status = os.waitpid(pid, 0)
            os.close(state._forkserver_alive_fd)
            self._forget_address()
            state._forkserver_pid = state._forkserver_alive_fd = None
        return os.waitstatus_to_exitcode(status)

    def _forget_address(self) -> None:
        state: Any = self
        address = state._forkserver_address
        if isinstance(address, str) and not util.is_abstract_socket_namespace(address):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
        state._forkserver_address = None

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the server to exit (it does once no runner it forked is left), killing it after ``timeout``."""
        state: Any = self  # multiprocessing's own attributes, which its type stubs leave out
        with state._lock:
            pid, alive = state._forkserver_pid, state._forkserver_alive_fd
            if pid is None or alive is None:
                return
            os.close(alive)
            deadline = time.monotonic() + timeout
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.02)
            self._forget_address()
            state._forkserver_pid = state._forkserver_alive_fd = None


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` in this process's environment (where a starting server reads it), then removed."""
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def acquire(module: str) -> AgentForkServer:
    """The fork server for ``module``'s agents, one more pool using it (started at its first runner)."""
    with _lock:
        server = _servers.get(module)
        if server is None:
            server = _servers[module] = AgentForkServer(module)
        _idle.pop(module, None)
        server.users += 1
        return server


def release(server: AgentForkServer) -> None:
    """One pool fewer uses ``server``; once none does, it is kept idle, and the oldest beyond ``MAX_IDLE`` stopped."""
    stopping = []
    with _lock:
        server.users -= 1
        if server.users > 0:
            return
        _idle[server.module] = None
        while len(_idle) > MAX_IDLE:
            module, _ = _idle.popitem(last=False)
            stopping.append(_servers.pop(module))
    for old in stopping:
        old.stop()


class ForkServerDied(RuntimeError):
    """The fork server exited before it forked the runner: while importing the agent's module, as a rule."""

    def __init__(self, module: str, exit_code: int | None) -> None:
        super().__init__(f"the fork server of {module or 'the main script'} exited (exit code {exit_code})")
        self.module = module
        self.exit_code = exit_code


class ServedProcess(BaseProcess):
    """A process forked by the fork server of ``server_module`` (``acquire`` it first); otherwise a
    ``multiprocessing`` process of the ``forkserver`` start method."""

    _start_method = "forkserver"

    def __init__(self, server_module: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.server_module = server_module

    @staticmethod
    def _Popen(process_obj: ServedProcess) -> _ServedPopen:
        return _ServedPopen(process_obj)


class _ServedPopen(popen_forkserver.Popen):
    """``multiprocessing``'s launch through a fork server, sent to the process's own server instead of the global
    one: the process's preparation data and pickled object go down a pipe to the child it forks."""

    def _launch(self, process_obj: ServedProcess) -> None:
        server = _servers[process_obj.server_module]
        state: Any = self  # multiprocessing's own attributes, which its type stubs leave out
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(spawn.get_preparation_data(process_obj.name), buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        try:
            self.sentinel, w = server.connect_to_new_process(state._fds)
            parent_w = os.dup(w)  # kept open while the child runs: the child's sign that its parent is alive
            self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))  # type: ignore[attr-defined]
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)
        except (OSError, EOFError) as exc:
            raise ForkServerDied(server.module, server.reap()) from exc
