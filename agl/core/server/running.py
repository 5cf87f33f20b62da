"""Running the server: bound to a socket in a background thread (``AglServer``) or in the foreground (``serve``)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from agl.core.server.app import create_app
from agl.core.store.base import Store


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0 picks a free one)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def url_of(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _config(app: FastAPI) -> uvicorn.Config:
    return uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5)


class AglServer:
    """The agl server in a background thread, for tests, notebooks and the embedded trainer.

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
    ) -> None:
        self.store = store
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

    def start(self, timeout: float = 30.0) -> AglServer:
        """Bind (port 0 picks a free port) and return once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError(f"AglServer already running at {self.url}")
        sock = bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        self.app = create_app(self.store, max_body_bytes=self.max_body_bytes, gateway_timeout=self.gateway_timeout)
        server = uvicorn.Server(_config(self.app))
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


def serve(store_url: str, host: str, port: int) -> None:
    """Run the server in the foreground until interrupted (``agl server --store sqlite:///runs/agl.db``)."""
    from agl.core.store import open_store

    store = open_store(store_url)
    sock = bind(host, port)
    print(f"agl server listening on {url_of(host, sock.getsockname()[1])} (store: {store_url})", flush=True)
    try:
        uvicorn.Server(_config(create_app(store))).run(sockets=[sock])
    finally:
        store.close()
