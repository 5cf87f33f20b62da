"""The server's door: request bodies parsed strictly, bad input answered with a 4xx naming the field, body size
limits, and unexpected errors answered with an id instead of their text (the log has the details)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from agl.core.jsonsafe import MAX_JSON_DEPTH
from agl.core.store.base import NotFound, StoreError, StoreUnavailable
from agl.core.types import HEADER_UNAVAILABLE, new_id

log = logging.getLogger("agl.server")

T = TypeVar("T")
ASGIApp = Callable[..., Awaitable[None]]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: Validation error types that mean "nested too deeply" (answered 400, like malformed JSON, rather than 422).
_TOO_DEEP = "json_too_deep"
_UNSAFE = "json_unsafe"


class ErrorOut(BaseModel):
    """Every error the server answers: one message saying what was wrong and, where it helps, what to do."""

    model_config = ConfigDict(extra="forbid")
    error: str


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def unavailable(message: str) -> JSONResponse:
    """The 503 of a server that cannot serve the request itself, nothing applied (``HEADER_UNAVAILABLE``)."""
    return JSONResponse({"error": message}, status_code=503, headers={HEADER_UNAVAILABLE: "1"})


def is_json(request: Request) -> bool:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def not_json_message(request: Request) -> str:
    got = request.headers.get("content-type")
    return f"send the body as JSON with header Content-Type: application/json (got {got or 'no Content-Type'})"


# ------------------------------------------------------------------------------------------------- validation


def _where(loc: tuple[int | str, ...] | list[int | str], root: str = "") -> str:
    """``("body", "spans", 3, "kind")`` → ``spans[3].kind``; query/path parameters are named as such."""
    parts = list(loc)
    label = ""
    if parts and parts[0] in ("query", "path", "header"):
        label = f"{parts.pop(0)} parameter "
    elif parts and parts[0] == "body":
        parts.pop(0)
    text = root
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return label + (text or "body")


def format_validation_errors(errors: list[Any], root: str = "") -> tuple[int, str]:
    """Turn pydantic/FastAPI errors into (status, one message naming each field and its problem).

    Malformed JSON and JSON nested too deeply are 400; every other problem is 422. A value JSON cannot hold (NaN,
    Infinity, an integer beyond 64 bits, ...) inside a free-form field is named down to its place in that field.
    """
    for e in errors:
        if e.get("type") == "json_invalid":
            detail = str((e.get("ctx") or {}).get("error") or e.get("msg", ""))
            if "recursion limit" in detail:
                return 400, f"JSON body is nested too deeply ({detail}); stored values nest at most {MAX_JSON_DEPTH}"
            loc = e.get("loc") or ()
            pos = f" at position {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            return 400, f"malformed JSON body{pos}: {detail}"
    shown = [_describe(e, root) for e in errors[:5]]
    more = f" (and {len(errors) - 5} more errors)" if len(errors) > 5 else ""
    status = 400 if any(e.get("type") == _TOO_DEEP for e in errors) else 422
    return status, "; ".join(shown) + more


def _describe(e: Any, root: str) -> str:
    where = _where(e.get("loc", ()), root)
    if e.get("type") in (_UNSAFE, _TOO_DEEP):
        ctx = e.get("ctx") or {}
        return f"{where}{ctx.get('path', '')}: {ctx.get('problem', e.get('msg', 'invalid'))}"
    return f"{where}: {e.get('msg', 'invalid')}"


async def read_body(request: Request) -> bytes:
    """The raw body of a JSON request (415 for any other content type)."""
    if not is_json(request):
        raise HTTPException(415, not_json_message(request))
    return await request.body()


def parse_body(raw: bytes, adapter: TypeAdapter[T], root: str = "") -> T:
    """Validate a JSON body strictly (no "3" for 3, no 1 for true): what the schema does not allow is refused.

    Lax coercion would let malformed requests change state; strict parsing makes the OpenAPI schema the contract.
    """
    try:
        return adapter.validate_json(raw, strict=True)
    except ValidationError as exc:
        raise HTTPException(*format_validation_errors(exc.errors(), root)) from None


# ------------------------------------------------------------------------------------------------- middleware


class BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` by Content-Length, and by counting what actually arrives."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    shown = value.decode(errors="replace")
                    await error(400, f"Content-Length {shown!r} is not a number")(scope, receive, send)
                    return
                if declared > limit:
                    message = f"request body of {declared} bytes is over the limit of {limit} bytes"
                    await error(413, message)(scope, receive, send)
                    return
        seen = 0

        async def counted() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"request body is over the limit of {limit} bytes")
            return message

        await self.app(scope, counted, send)


class CrashGuard:
    """ASGI middleware: an unexpected error becomes a 500 carrying only an error id, logged with its traceback.

    The exception is not re-raised, so the server keeps the client's connection open (a re-raised error makes the
    server close it, which breaks the connection pools of runners). Once a response has started (a stream), the
    error is re-raised: the only way left to tell the client is to break the stream.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:  # the client left while its body arrived: nobody to answer, nothing went wrong here
            log.info("agl server: client left during %s %s", scope.get("method"), scope.get("path"))
        except Exception:
            error_id = new_id("err")
            log.exception("agl server: unhandled error %s on %s %s", error_id, scope.get("method"), scope.get("path"))
            if started:
                raise
            message = f"internal server error (id {error_id}); the agl server's log has the details"
            await error(500, message)(scope, receive, send)


def install(app: FastAPI, max_body_bytes: int) -> None:
    """Give ``app`` the door: body limit, crash guard, and one error format for every refusal."""
    app.add_middleware(CrashGuard)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(*format_validation_errors(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no endpoint {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        return error(exc.status_code, message)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return error(404, str(exc))

    @app.exception_handler(StoreUnavailable)
    async def _unavailable(_: Request, exc: StoreUnavailable) -> JSONResponse:
        return unavailable(str(exc))

    @app.exception_handler(StoreError)
    async def _refused(_: Request, exc: StoreError) -> JSONResponse:
        return error(409, str(exc))
