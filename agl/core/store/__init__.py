"""Stores: the durable home of rollouts, spans, resources and records. ``open_store(url)`` picks the implementation."""

from __future__ import annotations

from agl.core.store.base import NotFound, Store, StoreDenied, StoreError, StoreSettings, StoreUnavailable


def open_store(url: str, settings: StoreSettings | None = None, token: str | None = None) -> Store:
    """Open a store by URL: ``sqlite:///path.db`` (embedded), ``http://host:port`` (an ``agl server``).

    ``settings`` apply to an embedded store; a server's store keeps the timing rules it was started with. ``token``
    is the bearer token sent to a server (default: env ``AGL_TOKEN``).
    """
    if url.startswith("sqlite:"):
        from agl.core.store.sqlite import SqliteStore, path_from_url

        return SqliteStore(path_from_url(url), settings)
    if url.startswith(("http://", "https://")):
        from agl.core.store.http import HttpStore

        return HttpStore(url, token=token)
    raise StoreError(f"store URL {url!r}: expected sqlite:///path.db or http://host:port")


__all__ = ["NotFound", "Store", "StoreDenied", "StoreError", "StoreSettings", "StoreUnavailable", "open_store"]
