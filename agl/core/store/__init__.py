"""Stores: the durable home of rollouts, spans, resources and records. ``open_store(url)`` picks the implementation."""

from __future__ import annotations

from agl.core.store.base import NotFound, Store, StoreDenied, StoreError, StoreSettings, StoreUnavailable

#: URL schemes of a PostgreSQL store (``postgresql://user:password@host:5432/dbname``).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(url: str, settings: StoreSettings | None = None, token: str | None = None) -> Store:
    """Open a store by URL: ``sqlite:///path.db`` (embedded), ``postgresql://user:pw@host/db`` (one database for
    several servers), ``http://host:port`` (an ``agl server``).

    ``settings`` apply to a store opened directly; a server's store keeps the timing rules it was started with. A
    PostgreSQL store keeps them in the database: given, they become the rules of every server on it; None reads the
    stored ones. ``token`` is the bearer token sent to a server (default: env ``AGL_TOKEN``).
    """
    if url.startswith("sqlite:"):
        from agl.core.store.sqlite import SqliteStore, path_from_url

        return SqliteStore(path_from_url(url), settings)
    if url.startswith(POSTGRES_SCHEMES):
        try:
            from agl.core.store.postgres import PostgresStore
        except ImportError as exc:
            raise StoreError(
                f"store URL {url.split('://', 1)[0]}://...: the PostgreSQL store needs psycopg and psycopg-pool "
                f"(pip install 'agl[postgres]'): {exc}"
            ) from exc
        return PostgresStore(url, settings)
    if url.startswith(("http://", "https://")):
        from agl.core.store.http import HttpStore

        return HttpStore(url, token=token)
    raise StoreError(
        f"store URL {url!r}: expected sqlite:///path.db, postgresql://user:password@host:port/dbname or "
        "http://host:port"
    )


__all__ = ["NotFound", "Store", "StoreDenied", "StoreError", "StoreSettings", "StoreUnavailable", "open_store"]
