"""Who may do what on the agl server: bearer tokens with roles, per-attempt gateway keys, and API keys that never
leave the server.

Tokens and roles. A server started with tokens (``agl server --token-file F``, env ``AGL_TOKEN``,
``AglServer(tokens=...)``) answers every request but ``/health`` and the OpenAPI pages only when it carries
``Authorization: Bearer <token>`` of one of three roles:

- ``trainer``: everything: publish resources, enqueue, cancel, read everything, and all a runner does. It may also
  call the gateway for any attempt.
- ``runner``: what a runner needs: settings, lease, heartbeat, complete, reap, write spans, read resources and a
  rollout by id. It may not publish, enqueue, cancel, list, or read spans (403).
- ``reader``: read-only: every ``GET`` plus the read-only ``POST``s (``/api/rollouts/get``, ``/api/rollouts/wait``),
  for dashboards. API keys are redacted for everyone, so a reader sees no secret.

``agl.core.routes`` is the one table of which role may call which route (``ROUTE_ROLES`` here); a route missing from
it (the pages) is open to ``trainer`` and ``reader`` when it is a ``GET`` and to ``trainer`` alone otherwise. No
token, or one the server does not know, is answered 401 (``WWW-Authenticate: Bearer``); a known token of the wrong
role 403. Tokens are compared in constant time (``hmac.compare_digest``) and never logged or echoed.

Token file: one ``<role> <token>`` per line; blank lines and lines starting with ``#`` are ignored::

    # agl server tokens (keep this file private: chmod 600)
    trainer  kq3Xv0b1bY0m0J8Q2E5o1Jp4Wc7nH9sT
    runner   9fG2pL0aZr8uYt1wQe4xCv6bNm3kJh5D
    reader   u7Yt5Re3Wq1Zx9Cv8Bn6Ml4Kj2Hg0Fd1

A role may have several tokens; a token is at least 16 characters without whitespace (make one with
``python -c "import secrets; print(secrets.token_urlsafe(32))"``). ``AGL_TOKEN`` set alone is one ``trainer`` token;
set with a token file it adds one.

Attempt keys. The agent's OpenAI client sends ``Authorization: Bearer <api_key>`` to the gateway. The runner hands
the agent an ``LLM`` whose ``api_key`` is the *attempt key* the server gave it with the lease: an HMAC of the
rollout and attempt ids under a secret derived from the configured tokens. The gateway route
``/gw/{rollout}/{attempt}/...`` takes that attempt's key (or a trainer token) and nothing else, so agent code never
sees an upstream key or the runner's token, and its key is good for its own attempt only. A server restarted with the
same tokens accepts the keys of attempts still running.

Secrets stay on the server. The ``api_key`` of an ``LLM`` resource is replaced by ``REDACTED`` in every answer
(``redact``). A client that publishes a resource set it read back (redacted) does not erase the key: the server
takes the key of the latest earlier LLM of the same name and the same ``base_url`` (``keep_secrets``), so a key is
only ever sent to the endpoint it was published for; with no such LLM the publish is refused (422).

Without tokens the server is open, as before, and may only listen on loopback (``check_bind``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlencode

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match

from agl.core.net import is_loopback
from agl.core.routes import READERS, ROLES, ROUTES, TRAINER, Role
from agl.core.server.errors import ASGIApp, Receive, Scope, Send, error
from agl.core.store.base import NotFound, Store
from agl.core.types import ENV_TOKEN, HEADER_ATTEMPT, HEADER_ROLLOUT, LLM, REDACTED, Resource, ResourceSet

log = logging.getLogger("agl.server")


#: Shortest token accepted.
MIN_TOKEN_CHARS = 16
#: What a client without tokens sends and a server without tokens hands out as an attempt key.
OPEN_KEY = "agl"
#: Paths served to anybody: liveness and the API's own description.
OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
#: How many versions back ``keep_secrets`` looks for the key of a republished LLM.
KEY_SEARCH_VERSIONS = 100

#: Which roles may call each route (method, path template) of the store API. The gateway (``/gw/...``) takes a
#: trainer token or the attempt key of the attempt in its path; the ``ATTEMPT_ROUTES`` take a trainer token or an
#: attempt's key (with ``HEADER_ROLLOUT`` / ``HEADER_ATTEMPT``), never a runner token.
ROUTE_ROLES: dict[tuple[str, str], frozenset[Role]] = {(r.method, r.path): r.roles for r in ROUTES}
#: Routes that act on one attempt (see ``agl.core.routes``).
ATTEMPT_ROUTES = frozenset((r.method, r.path) for r in ROUTES if r.attempt)


def roles_for(method: str, template: str) -> frozenset[Role]:
    """The roles that may call ``method template`` on the store API (see ``ROUTE_ROLES``)."""
    found = ROUTE_ROLES.get((method, template))
    if found is not None:
        return found
    return READERS if method in ("GET", "HEAD") else TRAINER


class TokenFileError(ValueError):
    """A token file (or ``AGL_TOKEN``) that cannot be used; the message names the file and line, never a token."""


class Tokens:
    """The tokens a server accepts, each with its role; derives the attempt keys.

    ``entries``: ``(role, token)`` pairs. The representation shows how many tokens each role has, never a token.

    Example::

        tokens = Tokens([("trainer", trainer_token), ("runner", runner_token)])
        AglServer(SqliteStore("runs/agl.db"), tokens=tokens)
    """

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        roles: dict[str, Role] = {}
        for n, (role, token) in enumerate(entries, 1):
            _check(role, token, f"token {n}")
            if roles.get(token, role) != role:
                raise TokenFileError(f"token {n}: the same token is given two roles ({roles[token]} and {role})")
            roles[token] = cast(Role, role)
        if not roles:
            raise TokenFileError("no tokens given")
        self._entries: tuple[tuple[bytes, Role], ...] = tuple((t.encode(), r) for t, r in roles.items())
        # Attempt keys are signed under one trainer token (any token where there is none) and taken under each: a
        # token added to the file never invalidates the keys of running attempts; removing one revokes its keys.
        signers = sorted(t for t, r in self._entries if r == "trainer") or sorted(t for t, _ in self._entries)
        self._secrets = [hmac.new(b"agl attempt keys v2", t, hashlib.sha256).digest() for t in signers]

    @classmethod
    def parse(cls, text: str, source: str = "token file") -> Tokens:
        """Tokens from the text of a token file (``<role> <token>`` per line, ``#`` comments)."""
        entries: list[tuple[str, str]] = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise TokenFileError(
                    f"{source} line {number}: expected '<role> <token>' ({len(parts)} fields found); "
                    f"roles: {', '.join(ROLES)}"
                )
            _check(parts[0], parts[1], f"{source} line {number}")
            entries.append((parts[0], parts[1]))
        if not entries:
            raise TokenFileError(f"{source}: no tokens (expected lines of '<role> <token>')")
        try:
            return cls(entries)
        except TokenFileError as exc:
            raise TokenFileError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        """Tokens from a token file; warns when other users may read it."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            mode = path.stat().st_mode
        except OSError as exc:
            raise TokenFileError(f"token file {path}: cannot read it ({exc.strerror or exc})") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("token file %s can be read by other users (mode %o); chmod 600 it", path, mode & 0o777)
        return cls.parse(text, f"token file {path}")

    @classmethod
    def configured(cls, token_file: str | Path | None = None, env: Mapping[str, str] | None = None) -> Tokens | None:
        """The tokens of a token file plus ``AGL_TOKEN`` (a trainer token); None when neither is given."""
        env = os.environ if env is None else env
        entries: list[tuple[str, str]] = []
        if token_file is not None:
            entries += [(role, t.decode()) for t, role in cls.load(token_file)._entries]
        token = env.get(ENV_TOKEN)
        if token:
            try:
                _check("trainer", token, ENV_TOKEN)
            except TokenFileError as exc:
                raise TokenFileError(str(exc)) from None
            entries.append(("trainer", token))
        return cls(entries) if entries else None

    def role_of(self, token: str | bytes) -> Role | None:
        """The role of ``token``, or None when it is none of these tokens (every token is compared)."""
        given = token.encode() if isinstance(token, str) else token
        found: Role | None = None
        for known, role in self._entries:
            if hmac.compare_digest(given, known):
                found = role
        return found

    def attempt_key(self, rollout_id: str, attempt_id: str) -> str:
        """The key an attempt's agent sends to the gateway (good for that rollout and attempt only)."""
        return _attempt_key(self._secrets[0], rollout_id, attempt_id)

    def is_attempt_key(self, key: str | bytes, rollout_id: str, attempt_id: str) -> bool:
        """Whether ``key`` is the key of that rollout and attempt under any of the tokens that sign keys."""
        given = key.encode() if isinstance(key, str) else key
        found = False
        for secret in self._secrets:  # every one compared, in constant time each
            found |= hmac.compare_digest(given, _attempt_key(secret, rollout_id, attempt_id).encode())
        return found

    def count(self, role: Role) -> int:
        return sum(r == role for _, r in self._entries)

    def __repr__(self) -> str:
        return "Tokens(" + ", ".join(f"{r}={self.count(r)}" for r in ROLES if self.count(r)) + ")"


def _attempt_key(secret: bytes, rollout_id: str, attempt_id: str) -> str:
    return "agl-ak-" + hmac.new(secret, f"{rollout_id}\n{attempt_id}".encode(), hashlib.sha256).hexdigest()


def _check(role: str, token: str, where: str) -> None:
    if role not in ROLES:
        raise TokenFileError(f"{where}: unknown role {role[:32]!r}; roles: {', '.join(ROLES)}")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenFileError(f"{where}: the token is {len(token)} characters; at least {MIN_TOKEN_CHARS} are needed")
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise TokenFileError(f"{where}: a token is printable ASCII without whitespace")


# ------------------------------------------------------------------------------------------------- binding


def check_bind(host: str, tokens: Tokens | None) -> None:
    """Refuse to serve an open (token-less) server beyond loopback: ValueError naming how to configure tokens."""
    if tokens is None and not is_loopback(host):
        raise ValueError(
            f"refusing to listen on {host} without tokens: anyone who can reach it could read and change every "
            f"rollout and use its LLM keys. Give tokens with --token-file FILE or the {ENV_TOKEN} environment "
            "variable (AglServer(tokens=...) in Python), or listen on 127.0.0.1"
        )


# ------------------------------------------------------------------------------------------------- secrets


def redact(rs: ResourceSet) -> ResourceSet:
    """``rs`` with the ``api_key`` of every ``LLM`` replaced by ``REDACTED`` (what any read answers)."""
    if not any(isinstance(r, LLM) for r in rs.resources.values()):
        return rs
    shown: dict[str, Resource] = {
        name: r.model_copy(update={"api_key": REDACTED}) if isinstance(r, LLM) else r
        for name, r in rs.resources.items()
    }
    return rs.model_copy(update={"resources": shown})


def keep_secrets(store: Store, resources: dict[str, Resource]) -> dict[str, Resource]:
    """Resources to publish, each LLM whose ``api_key`` is ``REDACTED`` given back its stored key.

    The key comes from the newest of the last ``KEY_SEARCH_VERSIONS`` versions that has an LLM of the same name and
    the same ``base_url`` (a key is only ever sent where it was published for). HTTP 422 naming the field when there
    is none.
    """
    marked = [n for n, r in resources.items() if isinstance(r, LLM) and r.api_key == REDACTED]
    if not marked:
        return resources
    out = dict(resources)
    versions: dict[int, ResourceSet | None] = {}

    def version(v: int | None) -> ResourceSet | None:
        slot = -1 if v is None else v
        if slot not in versions:
            try:
                versions[slot] = store.get_resources(v)
            except NotFound:
                versions[slot] = None
        return versions[slot]

    latest = version(None)
    newest = 0
    if latest is not None:
        newest = latest.version
        versions[newest] = latest
    for name in marked:
        llm = cast(LLM, resources[name])
        key: str | None = None
        for number in range(newest, max(0, newest - KEY_SEARCH_VERSIONS), -1):
            found = version(number)
            prev = found.resources.get(name) if found is not None else None
            if isinstance(prev, LLM) and prev.base_url == llm.base_url and prev.api_key != REDACTED:
                key = prev.api_key
                break
        if key is None:
            raise HTTPException(
                422,
                f"resources.{name}.api_key: {REDACTED!r} stands for a key the server keeps, but none of the last "
                f"{KEY_SEARCH_VERSIONS} versions has an LLM {name!r} with base_url {llm.base_url!r} to take it "
                "from; send the key itself",
            )
        out[name] = llm.model_copy(update={"api_key": key})
    return out


# ------------------------------------------------------------------------------------------------- the door


#: The cookie that holds a dashboard reader's token (set by ``?token=``), taken on the dashboard's GET pages only.
COOKIE = "agl_token"
#: Headers on every page the server renders (the dashboard's and the login form): only the dashboard's own script
#: and stylesheet run (no inline script, nothing from elsewhere), no other site may frame it (clickjacking), no
#: content sniffing, no URL (with a ``?token=``) leaks in Referer.
PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
_LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agl: token needed</title></head>
<body><main id="login">
<h1>This agl server needs a token</h1>
<p>Open the link <code>agl server</code> printed when it started (<code>http://HOST:PORT/?token=...</code>), or paste
a token of this server (trainer or reader):</p>
<form method="get"><input type="password" name="token" autocomplete="off" aria-label="token" required>
<button type="submit">Open the dashboard</button></form>
</main></body></html>
"""


def _is_page(scope: Scope) -> bool:
    """Whether the request is for a dashboard page or asset (a GET outside the API and the gateway)."""
    path = str(scope.get("path", ""))
    return scope.get("method") in ("GET", "HEAD") and not path.startswith(("/api/", "/gw/"))


def _cookie(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            for part in bytes(value).split(b";"):
                key, _, token = part.strip().partition(b"=")
                if key == COOKIE.encode() and token:
                    return token
    return None


def _bearer(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = bytes(value).strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


class BearerAuth:
    """ASGI middleware: every request but ``OPEN_PATHS`` needs a bearer token whose role may call its route.

    ``routes`` are the app's routes, used to find the route template (and the gateway's path ids) of a request.
    """

    def __init__(self, app: ASGIApp, tokens: Tokens, routes: list[BaseRoute]) -> None:
        self.app = app
        self.tokens = tokens
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        page = _is_page(scope)
        if page:
            login = self._login(scope)
            if login is not None:
                await login(scope, receive, send)
                return
        refusal = self.check(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message = refusal
        if page and status == 401:
            await HTMLResponse(_LOGIN_PAGE, 401, headers=PAGE_HEADERS)(scope, receive, send)
            return
        response = error(status, message)
        response.headers["www-authenticate"] = (
            'Bearer realm="agl"'
            if status == 403 or _bearer(scope) is None
            else 'Bearer realm="agl", error="invalid_token"'
        )
        await response(scope, receive, send)

    def _login(self, scope: Scope) -> Response | None:
        """A dashboard page opened with ``?token=`` (the link ``agl server`` prints, or the login form): a token of
        this server is kept in a cookie for the pages (HttpOnly, SameSite=Strict: no other site's request carries it)
        and the browser sent on to the page without it in the URL; None when the query holds no known token."""
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"), keep_blank_values=True)
        given = query.pop("token", [""])[-1].strip()
        if not given or self.tokens.role_of(given.encode()) is None:
            return None
        rest = urlencode(query, doseq=True)
        target = str(scope["path"]) + (f"?{rest}" if rest else "")
        response = RedirectResponse(target, status_code=303, headers=PAGE_HEADERS)
        response.set_cookie(COOKIE, given, httponly=True, samesite="strict", path="/")
        return response

    def _route(self, scope: Scope) -> tuple[str, dict[str, Any]] | None:
        for route in self.routes:
            match, child = route.matches(scope)
            if match == Match.FULL:
                return str(getattr(route, "path", "")), dict(child.get("path_params", {}))
        return None

    def _attempt_route(
        self, scope: MutableMapping[str, Any], token: bytes, role: Role | None, path_attempt: str
    ) -> tuple[int, str] | None:
        """A route of ``ATTEMPT_ROUTES`` called with something other than a trainer token: it must be the key of
        the attempt named by the headers (and the path, where it names one). The attempt is kept in the request's
        state for the route to hold the body to it (``attempt_of_request``)."""
        rollout_id, attempt_id = _header(scope, HEADER_ROLLOUT), _header(scope, HEADER_ATTEMPT) or path_attempt
        named = bool(rollout_id and attempt_id) and (not path_attempt or path_attempt == attempt_id)
        if named and self.tokens.is_attempt_key(token, rollout_id, attempt_id):
            scope.setdefault("state", {})["agl_attempt"] = (rollout_id, attempt_id)
            return None
        if role is None:
            return 401, (
                "not a token of this agl server, nor the key of the attempt named by headers "
                f"{HEADER_ROLLOUT} / {HEADER_ATTEMPT} (a runner sends the key it got with the lease)"
            )
        return 403, (
            f"a {role} token may not heartbeat, complete or write spans of an attempt: send that attempt's key (from "
            f"the lease) with headers {HEADER_ROLLOUT} and {HEADER_ATTEMPT}, as agl's runners do, or a trainer token"
        )

    def check(self, scope: MutableMapping[str, Any]) -> tuple[int, str] | None:
        """None when the request may go on, else (status, message)."""
        token = _bearer(scope)
        if token is None and _is_page(scope):
            token = _cookie(scope)
        if token is None:
            return 401, (
                "this agl server needs a token: send header 'Authorization: Bearer <token>' (agl's clients read "
                f"it from {ENV_TOKEN}); an agent calls the gateway with the api_key of the LLM resource it was handed"
            )
        role = self.tokens.role_of(token)
        method = str(scope.get("method", "GET"))
        found = self._route(scope)
        if found is None:
            return None if role is not None else (401, "unknown token: not a token of this agl server")
        template, params = found
        if template.startswith("/gw/"):
            rollout_id, attempt_id = str(params.get("rollout_id", "")), str(params.get("attempt_id", ""))
            if self.tokens.is_attempt_key(token, rollout_id, attempt_id) or role == "trainer":
                return None
            if role is None:
                return 401, (
                    f"gateway: the bearer token is not the key of attempt {attempt_id!r} of rollout {rollout_id!r} "
                    "(each attempt has its own key: the api_key of the LLM resource its runner handed the agent)"
                )
            return 403, (
                f"gateway: a {role} token may not call the gateway; the agent of an attempt calls it with that "
                "attempt's key (the api_key of the LLM resource its runner handed it), or use a trainer token"
            )
        if (method, template) in ATTEMPT_ROUTES and role != "trainer":
            return self._attempt_route(scope, token, role, str(params.get("attempt_id", "")))
        if role is None:
            return 401, "unknown token: not a token of this agl server"
        allowed = roles_for(method, template)
        if role in allowed:
            return None
        needed = " or ".join(r for r in ROLES if r in allowed)
        return 403, f"{method} {template} needs a {needed} token; this token has the {role} role"


def _host_name(scope: Scope) -> str | None:
    """The name in the request's Host header, without its port; None when there is none."""
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = bytes(value).decode("latin-1").strip().lower()
            if host.startswith("["):
                return host[: host.find("]") + 1] if "]" in host else host
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return None


class HostGuard:
    """ASGI middleware of a server bound to loopback: the Host header must name loopback (``localhost``,
    ``127.0.0.1``, ``[::1]``; any port) or one of ``names``. A web page that points its own domain at 127.0.0.1 (DNS
    rebinding) sends that domain as Host and is refused here; without this check the user's browser would let such a
    page drive the server."""

    def __init__(self, app: ASGIApp, names: Iterable[str]) -> None:
        self.app = app
        self.names = frozenset(n.lower() for n in names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        name = _host_name(scope)
        if name is not None and (name in self.names or is_loopback(name.strip("[]"))):
            await self.app(scope, receive, send)
            return
        response = error(
            403,
            f"Host header {name!r} is not a name of this server: it answers to localhost, 127.0.0.1 and [::1] (add "
            "another with agl server --allow-host NAME, e.g. behind a local proxy)",
        )
        await response(scope, receive, send)


def install_host_guard(app: FastAPI, names: Iterable[str]) -> None:
    """Put ``HostGuard`` in front of ``app`` (outermost, so that a refused name reaches nothing else)."""
    app.add_middleware(HostGuard, names=list(names))


def _header(scope: Scope, name: str) -> str:
    wanted = name.encode()
    for key, value in scope.get("headers", ()):
        if key == wanted:
            return bytes(value).decode("latin-1")
    return ""


def attempt_of_request(scope: Scope) -> tuple[str, str] | None:
    """(rollout id, attempt id) whose key authorised this request (``BearerAuth`` sets it); None for a token."""
    found = scope.get("state", {}).get("agl_attempt")
    return cast(tuple[str, str], found) if found is not None else None


def install_auth(app: FastAPI, tokens: Tokens) -> None:
    """Put ``BearerAuth`` in front of ``app`` (outermost: before a body is read) and describe it in the schema."""
    app.add_middleware(BearerAuth, tokens=tokens, routes=app.router.routes)
    app.state.tokens = tokens
    previous = app.openapi

    def openapi() -> dict[str, Any]:
        schema = previous()
        if "bearer" not in schema.setdefault("components", {}).setdefault("securitySchemes", {}):
            schema["components"]["securitySchemes"]["bearer"] = {"type": "http", "scheme": "bearer"}
            schema["security"] = [{"bearer": []}]
            for path, operations in schema.get("paths", {}).items():
                if path in OPEN_PATHS:
                    for operation in operations.values():
                        operation["security"] = []
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
