"""Running the server: bound to a socket in a background thread (``AglServer``) or in the foreground (``serve``)."""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

import uvicorn
from fastapi import FastAPI

from agl.core.local_token import remove_local_token, store_token, store_token_path, write_local_token
from agl.core.net import bind, bound_url, shown_url, url_of
from agl.core.server.app import create_app
from agl.core.server.auth import Tokens, check_bind, is_loopback
from agl.core.server.gateway import DEFAULT_MAX_RESPONSE_BYTES
from agl.core.store.base import Store


def _config(app: FastAPI) -> uvicorn.Config:
    return uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5)


class AglServer:
    """The agl server in a background thread, for tests, notebooks and the embedded trainer.

    ``tokens``: the bearer tokens it accepts (``agl.core.server.auth.Tokens``); without, it is open and may only
    listen on loopback (``start`` raises ValueError otherwise).

    Example::

        with AglServer(SqliteStore("runs/agl.db")) as server:
            store = HttpStore(server.url)
    """

    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_body_bytes: int = 64 * 2**20,
        gateway_timeout: float = 600.0,
        tokens: Tokens | None = None,
        allow_backends: Sequence[str] | None = None,
        gateway_max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        allow_hosts: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.allow_hosts = allow_hosts
        self.tokens = tokens
        self.allow_backends = allow_backends
        self.gateway_max_response_bytes = gateway_max_response_bytes
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.gateway_timeout = gateway_timeout
        self.app: FastAPI | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return url_of(self.host, self.port)

    def start(self, timeout: float = 30.0, sock: socket.socket | None = None) -> AglServer:
        """Bind (port 0 picks a free port) and return once the server accepts connections.

        ``sock``: a socket already bound and listening (``bind``) to serve on instead (``host`` must name its
        address); it is closed if the server cannot start.
        """
        if self._thread is not None:
            raise RuntimeError(f"AglServer already running at {self.url}")
        try:
            check_bind(self.host, self.tokens)
            if sock is None:
                sock = bind(self.host, self.port)
            self.port = sock.getsockname()[1]
            self.app = create_app(
                self.store,
                max_body_bytes=self.max_body_bytes,
                gateway_timeout=self.gateway_timeout,
                tokens=self.tokens,
                allow_backends=self.allow_backends,
                gateway_max_response_bytes=self.gateway_max_response_bytes,
                host_names=host_names(sock.getsockname()[0], self.allow_hosts),
            )
            server = uvicorn.Server(_config(self.app))
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="agl-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise RuntimeError(f"agl server on {self.url} did not start")
            time.sleep(0.005)
        self._server, self._thread = server, thread
        return self

    def flush(self) -> None:
        """Make every gateway span recorded so far durable in the store."""
        if self.app is not None:
            self.app.state.span_pipeline.flush()

    def drain(self, on: bool = True) -> None:
        """Lease no more rollouts and answer waiting leases at once: call it before stopping this server's runners
        (an idle runner waits in a lease request; drained, it sees its stop at once). ``on=False``: lease again."""
        if self.app is not None:
            self.app.state.wakeups.drain(on)

    def stop(self) -> None:
        """Stop serving: finish open requests (up to 5 s), flush gateway spans, release the port."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> AglServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    store_url: str,
    host: str,
    port: int,
    tokens: Tokens | None = None,
    *,
    gateway_timeout: float = 600.0,
    allow_backends: Sequence[str] | None = None,
    gateway_max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    allow_hosts: Sequence[str] = (),
    local_token: bool = True,
    rotate_token: bool = False,
    pages: Callable[[FastAPI, Store], None] | None = None,
) -> None:
    """Run the server in the foreground until interrupted (``agl server --store sqlite:///runs/agl.db``).

    The gateway settings and ``pages`` are ``create_app``'s; ``allow_hosts`` are ``host_names``'.

    Without ``tokens``, on loopback, it serves with its store's trainer token (``local_token``; ``agl server
    --no-token`` passes False and serves open): the same at every start on that store, so its clients outlive a
    restart (``agl.core.local_token.store_token``; ``rotate_token`` makes a new one, and the old one stops working).
    While it runs the token is in a file only the user can read, which agl's clients on this machine read, and it is
    printed with the dashboard's URL; that file goes when the server stops. Without tokens it serves only on loopback:
    ValueError (naming ``--token-file`` / ``AGL_TOKEN``) for any other ``host``, before anything is opened.
    """
    from agl.core.store import open_store

    made = store_token(store_url, rotate=rotate_token) if tokens is None and local_token and is_loopback(host) else None
    if made is not None:
        tokens = Tokens([("trainer", made)])
    check_bind(host, tokens)
    sock = bind(host, port)
    try:
        bound = sock.getsockname()[0]
        check_bind(bound, tokens)  # a name such as "localhost" resolved to what it is
        store = open_store(store_url)
    except BaseException:
        sock.close()
        raise
    bound_port = int(sock.getsockname()[1])
    auth = "open: no tokens" if tokens is None else f"tokens: {tokens!r}"
    print(f"agl server listening on {bound_url(sock)} (store: {shown_url(store_url)}; {auth})", flush=True)
    if made is not None:
        path = write_local_token(bound_port, made)
        kept = store_token_path(store_url)
        print(
            f"agl server: a token for this user is in {path} (agl's clients on this machine use it; AGL_TOKEN "
            f"overrides it); the dashboard: {bound_url(sock)}/?token={made}",
            flush=True,
        )
        if kept is not None:
            print(
                f"agl server: the token is this store's, kept in {kept}: a restart on this store keeps it (and its "
                "clients); `agl server --rotate-token` makes a new one",
                flush=True,
            )
    if not is_loopback(bound):
        print(
            "agl server: reachable from other machines; tokens travel in clear over http, so use it on a trusted "
            "network or put a TLS proxy in front",
            file=sys.stderr,
            flush=True,
        )
    try:
        app = create_app(
            store,
            tokens=tokens,
            gateway_timeout=gateway_timeout,
            allow_backends=allow_backends,
            gateway_max_response_bytes=gateway_max_response_bytes,
            pages=pages,
            host_names=host_names(bound, allow_hosts),
        )
        # uvicorn shuts down gracefully on SIGTERM, then raises the signal again with the handler it found: this
        # one turns it into SystemExit, so that the ``finally`` below runs (the token file goes) before the exit.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        server = uvicorn.Server(_config(app))
        server.run(sockets=[sock])
        if server.should_exit:  # a signal stopped it and uvicorn's raising it again did not reach here: say so too
            raise KeyboardInterrupt
    finally:
        store.close()
        if made is not None:
            remove_local_token(bound_port, made)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def host_names(bound: str, allow_hosts: Sequence[str]) -> list[str] | None:
    """The Host names a server bound to ``bound`` answers to besides loopback's (``create_app(host_names=...)``):
    ``allow_hosts`` on loopback, where the Host check is always on (it stops DNS rebinding from web pages); beyond
    loopback tokens guard the server and the check is on only when ``allow_hosts`` names hosts."""
    return list(allow_hosts) if is_loopback(bound) or allow_hosts else None
