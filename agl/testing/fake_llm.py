"""A fake OpenAI-compatible LLM server on loopback, for testing agents offline (stdlib only).

Concurrency model: ``ThreadingHTTPServer`` in a daemon thread, one thread per connection; the script, the recorded
requests and replies are shared state guarded by one lock. It answers like vLLM: token ids and logprobs only when the
request asks for them (``return_token_ids``, ``logprobs``), deterministic for a given text.

Example::

    with FakeLLM(["Hello!", FakeReply(tool_calls=[{"name": "add", "arguments": {"a": 1, "b": 2}}])]) as llm:
        client = openai.OpenAI(base_url=llm.base_url, api_key="x")
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_PIECE = re.compile(r"\s*\S+|\s+")


def fake_tokens(text: str) -> list[str]:
    """The fake tokenizer: each word with its leading whitespace is one token (joining them gives ``text`` back)."""
    return _PIECE.findall(text)


def fake_token_id(piece: str) -> int:
    """A stable id for one token piece (CRC-32 based, the same in every process)."""
    return 256 + zlib.crc32(piece.encode()) % 100_000


def fake_token_ids(text: str) -> list[int]:
    """Deterministic token ids of ``text``; different texts give different id lists (barring hash collisions)."""
    return [fake_token_id(p) for p in fake_tokens(text)]


def fake_logprob(token_id: int) -> float:
    """A deterministic, non-positive logprob for a token id."""
    return -((token_id * 7919) % 1000) / 250.0


def render_messages(messages: Sequence[Any]) -> str:
    """The text the fake model "sees" for a conversation; prompt token ids are the ids of this text."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = f"<|{m.get('role', 'user')}|> {content or ''}"
        if m.get("tool_calls"):
            text += " " + json.dumps(m["tool_calls"], sort_keys=True)
        out.append(text)
    return "\n".join(out) + "\n<|assistant|>"


@dataclass
class FakeReply:
    """One scripted answer.

    content: the assistant text. tool_calls: ``[{"name": ..., "arguments": {...}}]`` returned in OpenAI format.
    status != 200 answers with an OpenAI-style error (message ``error``). finish_reason defaults to ``stop`` (or
    ``tool_calls`` when there are tool calls).
    """

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    status: int = 200
    error: str | None = None
    finish_reason: str | None = None


@dataclass
class ServedReply:
    """What the fake server answered to one call; id/logprob fields are None when the request did not ask for them."""

    status: int
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    stream: bool = False
    error: str | None = None


class RecordedRequest(dict[str, Any]):
    """A received request: the JSON body (it is the dict) plus ``.path`` and ``.headers`` (lower-cased names)."""

    def __init__(self, body: dict[str, Any], path: str, headers: dict[str, str]) -> None:
        super().__init__(body)
        self.path = path
        self.headers = headers


Script = Sequence[FakeReply | str] | Callable[[dict[str, Any]], FakeReply | str] | None


class FakeLLM:
    """A real OpenAI-compatible HTTP server on loopback answering from a script.

    script: a list consumed one reply per call (``cycle=True`` starts over at the end; past the end without cycling
    every call gets a 500 error), a callable ``request_body -> reply``, or None to echo the last user message.
    weights_version: when set, sent as top-level ``agl_weights_version`` (as agl's policy servers do).
    chunk_delay: seconds to wait between streamed chunks (to test timeouts and clients that leave mid-stream).
    """

    def __init__(
        self,
        script: Script = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "fake-model",
        cycle: bool = False,
        weights_version: str | None = None,
        chunk_delay: float = 0.0,
    ) -> None:
        self.script = script
        self.host = host
        self.port = port
        self.model = model
        self.cycle = cycle
        self.weights_version = weights_version
        self.chunk_delay = chunk_delay
        self.requests: list[RecordedRequest] = []
        self.replies: list[ServedReply] = []
        self._lock = threading.Lock()
        self._next = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> FakeLLM:
        if self._server is not None:
            return self
        handler = type("_BoundHandler", (_Handler,), {"fake": self})
        self._server = _Server((self.host, self.port), handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="agl-fake-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # answering ----------------------------------------------------------------------------------------------
    def _pick(self, body: dict[str, Any]) -> FakeReply:
        script = self.script
        if script is None:
            reply: FakeReply | str = _last_user_text(body.get("messages") or [])
        elif callable(script):
            reply = script(body)
        else:
            with self._lock:
                index = self._next
                self._next += 1
            if index >= len(script) and not (self.cycle and script):
                return FakeReply(status=500, error=f"FakeLLM script exhausted: it has {len(script)} replies")
            reply = script[index % len(script)]
        return FakeReply(content=reply) if isinstance(reply, str) else reply

    def _answer(
        self, body: dict[str, Any], number: int
    ) -> tuple[int, dict[str, Any] | None, Iterator[dict[str, Any]] | None]:
        """(status, JSON body, or SSE chunk iterator) for one chat completion request."""
        reply = self._pick(body)
        stream = bool(body.get("stream"))
        if reply.status != 200:
            why = reply.error or f"fake error {reply.status}"
            self._served(ServedReply(status=reply.status, error=why, stream=stream))
            return reply.status, _error_body(why, reply.status), None
        want_ids = bool(body.get("return_token_ids"))
        want_logprobs = bool(body.get("logprobs"))
        calls = [
            {
                "id": f"call_{number}_{i}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))},
            }
            for i, c in enumerate(reply.tool_calls or [])
        ]
        pieces = fake_tokens(reply.content or "")
        n_content = len(pieces)
        if calls:
            rendered = "\n".join(
                f"<tool_call>{json.dumps({'name': c['name'], 'arguments': c.get('arguments', {})})}</tool_call>"
                for c in reply.tool_calls or []
            )
            pieces += fake_tokens(f"\n{rendered}" if n_content else rendered)
        ids = [fake_token_id(p) for p in pieces]
        prompt_ids = fake_token_ids(render_messages(body.get("messages") or []))
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        self._served(
            ServedReply(
                status=200,
                content=reply.content,
                tool_calls=calls,
                finish_reason=finish,
                prompt_token_ids=prompt_ids if want_ids else None,
                token_ids=ids if want_ids else None,
                logprobs=[fake_logprob(i) for i in ids] if want_logprobs else None,
                stream=stream,
            )
        )
        model = body.get("model") or self.model
        head: dict[str, Any] = {"id": f"chatcmpl-fake-{number}", "created": int(time.time()), "model": model}
        if self.weights_version is not None:
            head["agl_weights_version"] = self.weights_version
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
        }
        if stream:
            chunks = _stream_chunks(
                head, n_content, calls, pieces, ids, finish, prompt_ids, want_ids, want_logprobs, body, usage
            )
            return 200, None, chunks
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            message["tool_calls"] = calls
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": {"content": _logprob_entries(pieces, ids)} if want_logprobs else None,
            "finish_reason": finish,
        }
        if want_ids:
            choice["token_ids"] = ids
        out = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        if want_ids:
            out["prompt_token_ids"] = prompt_ids
        return 200, out, None

    def _served(self, reply: ServedReply) -> None:
        with self._lock:
            self.replies.append(reply)


def _last_user_text(messages: Sequence[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _error_body(message: str, status: int) -> dict[str, Any]:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _logprob_entries(pieces: Sequence[str], ids: Sequence[int]) -> list[dict[str, Any]]:
    return [
        {"token": p, "logprob": fake_logprob(i), "bytes": list(p.encode()), "top_logprobs": []}
        for p, i in zip(pieces, ids, strict=True)
    ]


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` consecutive (start, end) ranges covering ``range(n)`` as evenly as possible."""
    bounds = [round(k * n / parts) for k in range(parts + 1)]
    return list(itertools.pairwise(bounds))


def _stream_chunks(
    head: dict[str, Any],
    n_content: int,
    calls: list[dict[str, Any]],
    pieces: list[str],
    ids: list[int],
    finish: str,
    prompt_ids: list[int],
    want_ids: bool,
    want_logprobs: bool,
    body: dict[str, Any],
    usage: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """The SSE chunks of a streamed reply, vLLM style: every response token id appears in exactly one chunk."""
    base = {**head, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], lo: int = 0, hi: int = 0, finish_reason: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": _logprob_entries(pieces[lo:hi], ids[lo:hi])} if want_logprobs and hi > lo else None,
            "finish_reason": finish_reason,
        }
        if want_ids:
            choice["token_ids"] = ids[lo:hi]
        return {**base, "choices": [choice]}

    first = chunk({"role": "assistant", "content": ""})
    if want_ids:
        first["prompt_token_ids"] = prompt_ids
    yield first
    # content tokens come first, two per chunk; then the tool-call tokens spread over the tool-call deltas
    for lo in range(0, n_content, 2):
        hi = min(lo + 2, n_content)
        yield chunk({"content": "".join(pieces[lo:hi])}, lo, hi)
    if calls:
        deltas: list[dict[str, Any]] = []
        for i, call in enumerate(calls):
            fn = call["function"]
            deltas.append(
                {"index": i, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}
            )
            args = fn["arguments"]
            for a, b in _split(len(args), 3):
                deltas.append({"index": i, "function": {"arguments": args[a:b]}})
        ranges = _split(len(ids) - n_content, len(deltas))
        for delta, (a, b) in zip(deltas, ranges, strict=True):
            yield chunk({"tool_calls": [delta]}, n_content + a, n_content + b)
    yield chunk({}, finish_reason=finish)
    if (body.get("stream_options") or {}).get("include_usage"):
        yield {**base, "choices": [], "usage": usage}


class _Server(ThreadingHTTPServer):
    """Accepts bursts of connections: a gateway with dozens of runners behind it opens many at once, and the
    default listen backlog (5) would reset some of them."""

    request_queue_size = 1024
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    """Routes ``POST /v1/chat/completions`` and ``GET /v1/models`` to the bound ``FakeLLM``."""

    fake: FakeLLM
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle + delayed ACK add ~40 ms per call
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: tests read ``FakeLLM.requests`` instead."""

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": self.fake.model, "object": "model", "created": 0, "owned_by": "agl"}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_json(404, _error_body(f"no route GET {self.path}", 404))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, _error_body(f"no route POST {self.path}", 404))
            return
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self._send_json(400, _error_body(f"malformed JSON body: {exc}", 400))
            return
        if not isinstance(body, dict):
            self._send_json(400, _error_body("request body must be a JSON object", 400))
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        with self.fake._lock:
            self.fake.requests.append(RecordedRequest(body, self.path, headers))
            number = len(self.fake.requests)
        status, whole, chunks = self.fake._answer(body, number)
        if chunks is None:
            self._send_json(status, whole or {})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for i, c in enumerate(chunks):
                if i and self.fake.chunk_delay:
                    time.sleep(self.fake.chunk_delay)
                self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the client left mid-stream: nothing more to send
