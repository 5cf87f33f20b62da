"""The agl server: store API over HTTP, bad input handling, durability across restarts, and the LLM gateway."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agl.core.server import AglServer
from agl.core.store.base import NotFound, StoreError
from agl.core.store.http import HttpStore
from agl.core.store.sqlite import SqliteStore
from agl.core.types import (
    ATTR_FINISH_REASONS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_LOGPROBS,
    ATTR_MODEL,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_POLICY,
    ATTR_POLICY_ROUTE,
    ATTR_PROMPT_IDS,
    ATTR_RESOURCE,
    ATTR_RESPONSE_IDS,
    ATTR_TOOLS,
    ATTR_WEIGHTS_VERSION,
    HEADER_SEQUENCE,
    LLM,
    PolicyRoute,
    PromptTemplate,
    Record,
    RolloutRequest,
    Span,
)
from agl.testing import FakeLLM, FakeReply
from tests.server_process import free_port, kill, start_server

USER: Any = [{"role": "user", "content": "what is two plus two"}]
JSON = {"content-type": "application/json"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AglServer]:
    with AglServer(SqliteStore(tmp_path / "s.db")) as srv:
        yield srv


def start_rollout(server: AglServer, llm_url: str, **sampling: Any) -> tuple[str, str]:
    """Publish an LLM resource pointing at ``llm_url``, enqueue and lease one rollout: (rollout_id, attempt_id)."""
    store = server.store
    store.publish_resources(
        {
            "main_llm": LLM(base_url=llm_url, model="fake-model", sampling=sampling),
            "prompt": PromptTemplate(template="{q}"),
        }
    )
    store.enqueue([RolloutRequest(task={"q": "2+2"})])
    leased = store.lease("worker-1")
    assert leased is not None
    return leased[0].rollout_id, leased[1].attempt_id


def gw(server: AglServer, rollout_id: str, attempt_id: str, name: str = "main_llm") -> str:
    return f"{server.url}/gw/{rollout_id}/{attempt_id}/{name}/v1"


def llm_spans(server: AglServer, rollout_id: str) -> list[Span]:
    server.flush()
    return server.store.query_spans(rollout_id=rollout_id, kind="llm")


# --------------------------------------------------------------------------------------------------- gateway


def test_gateway_records_exact_tokens_and_merges_sampling(server: AglServer) -> None:
    with FakeLLM(["four"], weights_version="w7") as fake:
        rid, aid = start_rollout(server, fake.base_url, temperature=0.3, max_tokens=50)
        client = openai.OpenAI(base_url=gw(server, rid, aid), api_key="agent-key", max_retries=0)
        tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
        r = client.chat.completions.create(
            model="fake-model",
            messages=USER,
            max_tokens=7,
            tools=tools,  # type: ignore[arg-type]
            extra_headers={"x-agl-agent": "solver", "x-agl-parent-span": "sp-parent", "x-agl-call-id": "c1"},
        )
        assert r.choices[0].message.content == "four"
        sent = fake.requests[0]
        assert sent["temperature"] == 0.3 and sent["max_tokens"] == 7, "defaults fill gaps, never override"
        assert sent["return_token_ids"] is True and sent["logprobs"] is True
        assert sent.headers["authorization"] == "Bearer agl", "the resource's key goes to the backend"

        [span] = llm_spans(server, rid)
        served = fake.replies[0]
        a = span.attributes
        assert (span.name, span.attempt_id, span.agent, span.parent_id, span.status) == (
            "chat.completions",
            aid,
            "solver",
            "sp-parent",
            "ok",
        )
        assert span.end_time is not None and span.end_time >= span.start_time
        assert a[ATTR_PROMPT_IDS] == served.prompt_token_ids
        assert a[ATTR_RESPONSE_IDS] == served.token_ids
        assert a[ATTR_LOGPROBS] == served.logprobs
        assert a[ATTR_INPUT_MESSAGES] == USER and a[ATTR_TOOLS] == tools and a[ATTR_MODEL] == "fake-model"
        assert a[ATTR_OUTPUT_MESSAGES][0]["content"] == "four" and a[ATTR_OUTPUT_MESSAGES][0]["role"] == "assistant"
        assert a[ATTR_FINISH_REASONS] == ["stop"]
        assert a[ATTR_INPUT_TOKENS] == len(served.prompt_token_ids or [])
        assert a[ATTR_OUTPUT_TOKENS] == len(served.token_ids or [])
        assert a[ATTR_WEIGHTS_VERSION] == "w7" and a[ATTR_RESOURCE] == "main_llm"
        assert a["agl.call_id"] == "c1" and a["agl.stream"] is False and a["agl.backend_url"] == fake.base_url


def test_gateway_routes_each_agents_calls_to_its_policy_and_records_it(server: AglServer) -> None:
    """With ``routes``, the call's agent picks the model (a nested agent takes its parent's route) and the weights
    version the span records; agents without a route, and calls with no agent identity, keep the agent's model."""
    routes = {
        "writer": PolicyRoute(model="policy/writer", weights_version="w-3"),
        "rewriter": PolicyRoute(model="policy/rewriter", weights_version="r-5"),
    }
    with FakeLLM(cycle=True, script=["ok"]) as fake:
        store = server.store
        store.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="base", routes=routes)})
        store.enqueue([RolloutRequest(task={})])
        leased = store.lease("worker-1")
        assert leased is not None
        rid, aid = leased[0].rollout_id, leased[1].attempt_id
        client = openai.OpenAI(base_url=gw(server, rid, aid), api_key="k", max_retries=0)
        calls = [("writer", 1), ("rewriter/fix", 2), ("checker", 3), (None, 4)]
        for agent, sequence in calls:
            headers = {"x-agl-sequence": str(sequence)} | ({"x-agl-agent": agent} if agent else {})
            client.chat.completions.create(model="base", messages=USER, extra_headers=headers)
        assert [q["model"] for q in fake.requests] == ["policy/writer", "policy/rewriter", "base", "base"]
        spans = sorted(llm_spans(server, rid), key=lambda s: s.sequence)
        assert [(s.attributes[ATTR_POLICY], s.attributes[ATTR_POLICY_ROUTE]) for s in spans] == [
            ("policy/writer", "agent"),
            ("policy/rewriter", "agent"),
            ("base", "default"),
            ("base", "no_agent"),
        ]
        assert [s.attributes.get(ATTR_WEIGHTS_VERSION) for s in spans] == ["w-3", "r-5", None, None]


def test_gateway_streaming_assembles_tool_calls(server: AglServer) -> None:
    reply = FakeReply(
        content="Let me add these.", tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 2}}, {"name": "check"}]
    )
    with FakeLLM([reply]) as fake:
        rid, aid = start_rollout(server, fake.base_url)
        client = openai.OpenAI(base_url=gw(server, rid, aid), api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model="fake-model", messages=USER, stream=True, top_logprobs=2, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Let me add these."
        assert fake.requests[0]["top_logprobs"] == 2 and fake.requests[0]["stream"] is True

        [span] = llm_spans(server, rid)
        served = fake.replies[0]
        a = span.attributes
        assert a["agl.stream"] is True and span.status == "ok"
        assert a[ATTR_PROMPT_IDS] == served.prompt_token_ids
        assert a[ATTR_RESPONSE_IDS] == served.token_ids
        assert a[ATTR_LOGPROBS] == served.logprobs
        [message] = a[ATTR_OUTPUT_MESSAGES]
        assert message["role"] == "assistant" and message["content"] == "Let me add these."
        assert message["tool_calls"] == served.tool_calls
        assert a[ATTR_FINISH_REASONS] == ["tool_calls"]
        assert a[ATTR_OUTPUT_TOKENS] == len(served.token_ids or [])


def test_gateway_with_async_client(server: AglServer) -> None:
    with FakeLLM(["one", "two"]) as fake:
        rid, aid = start_rollout(server, fake.base_url)

        async def main() -> list[str]:
            client = openai.AsyncOpenAI(base_url=gw(server, rid, aid), api_key="x", max_retries=0)
            r = await client.chat.completions.create(model="fake-model", messages=USER)
            text = ""
            async for chunk in await client.chat.completions.create(model="fake-model", messages=USER, stream=True):
                text += chunk.choices[0].delta.content or "" if chunk.choices else ""
            await client.close()
            return [r.choices[0].message.content or "", text]

        assert asyncio.run(main()) == ["one", "two"]
        spans = sorted(llm_spans(server, rid), key=lambda s: s.start_time)
        assert [s.attributes[ATTR_RESPONSE_IDS] for s in spans] == [r.token_ids for r in fake.replies]


def test_gateway_passes_backend_errors_through(server: AglServer) -> None:
    script = [FakeReply(status=429, error="slow down please"), FakeReply(status=400, error="bad stream request")]
    with FakeLLM(script) as fake:
        rid, aid = start_rollout(server, fake.base_url)
        client = openai.OpenAI(base_url=gw(server, rid, aid), api_key="x", max_retries=0)
        with pytest.raises(openai.RateLimitError, match="slow down please") as limited:
            client.chat.completions.create(model="fake-model", messages=USER)
        assert limited.value.status_code == 429
        with pytest.raises(openai.BadRequestError, match="bad stream request"):
            client.chat.completions.create(model="fake-model", messages=USER, stream=True)
        spans = sorted(llm_spans(server, rid), key=lambda s: s.start_time)
        assert [(s.status, s.attributes["http.status_code"]) for s in spans] == [("error", 429), ("error", 400)]
        assert "slow down please" in spans[0].attributes["error.message"]


def test_gateway_backend_unreachable_is_502(server: AglServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    rid, aid = start_rollout(server, dead)
    r = httpx.post(gw(server, rid, aid) + "/chat/completions", json={"messages": USER})
    assert r.status_code == 502 and "unreachable" in r.json()["error"] and dead in r.json()["error"]
    [span] = llm_spans(server, rid)
    assert span.status == "error" and span.attributes["http.status_code"] == 502


def test_gateway_unknown_rollout_resource_or_kind_is_404(server: AglServer) -> None:
    with FakeLLM() as fake:
        rid, aid = start_rollout(server, fake.base_url)
        cases = {
            gw(server, "ro-missing", aid): "unknown rollout 'ro-missing'",
            gw(server, rid, aid, "other"): "no resource 'other' (it has: main_llm, prompt)",
            gw(server, rid, aid, "prompt"): "is a prompt_template, not an LLM",
        }
        for base, message in cases.items():
            r = httpx.post(base + "/chat/completions", json={"messages": USER})
            assert r.status_code == 404 and message in r.json()["error"]
        assert fake.requests == []
        models = httpx.get(gw(server, rid, aid) + "/models")
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "fake-model"


def test_gateway_records_span_when_client_leaves_mid_stream(server: AglServer) -> None:
    with FakeLLM(["a long answer " * 100], chunk_delay=0.01) as fake:
        rid, aid = start_rollout(server, fake.base_url)
        body = {"model": "fake-model", "messages": USER, "stream": True}
        with httpx.stream("POST", gw(server, rid, aid) + "/chat/completions", json=body) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()
            next(chunks)
            next(chunks)
        deadline = time.monotonic() + 10
        while not llm_spans(server, rid) and time.monotonic() < deadline:
            time.sleep(0.02)
        [span] = llm_spans(server, rid)
        assert span.status == "error" and span.attributes["http.status_code"] == 499
        assert span.attributes[ATTR_PROMPT_IDS] == fake.replies[0].prompt_token_ids
        got, full = span.attributes[ATTR_RESPONSE_IDS], fake.replies[0].token_ids or []
        assert 0 < len(got) < len(full) and got == full[: len(got)], "the part that was streamed is kept"


def test_complete_attempt_makes_gateway_spans_durable_first(server: AglServer) -> None:
    with FakeLLM() as fake:
        rid, aid = start_rollout(server, fake.base_url)
        openai.OpenAI(base_url=gw(server, rid, aid), api_key="x").chat.completions.create(model="m", messages=USER)
        http = HttpStore(server.url)
        assert http.complete_attempt(aid, "succeeded", final_reward=1.0)
        assert len(server.store.query_spans(rollout_id=rid, kind="llm")) == 1
        http.close()


class WriteLock:
    """Holds SQLite's write lock on a store file from a connection of its own, until ``release`` (or ``after`` s)."""

    def __init__(self, db: Path, after: float) -> None:
        self._conn = sqlite3.connect(db, timeout=30, isolation_level=None, check_same_thread=False)
        self._conn.execute("BEGIN IMMEDIATE")
        self.released = threading.Event()
        self._timer = threading.Timer(after, self.release)
        self._timer.start()

    def release(self) -> None:
        if not self.released.is_set():
            self._conn.execute("COMMIT")
            self._conn.close()
            self.released.set()

    def __enter__(self) -> WriteLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self.release()


def refuse_spans(db: Path) -> sqlite3.Connection:
    """Make the store file refuse span writes (a trigger), as a broken disk or a read-only store would."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("CREATE TRIGGER refuse_spans BEFORE INSERT ON spans BEGIN SELECT RAISE(ABORT, 'spans refused'); END")
    return conn


def test_gateway_answer_arrives_only_once_its_span_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with FakeLLM(["four", "five"]) as fake, AglServer(SqliteStore(db)) as server:
        rid, aid = start_rollout(server, fake.base_url)
        reader = SqliteStore(db)  # a connection of its own: sees only what was committed to the file
        client = openai.OpenAI(base_url=gw(server, rid, aid), api_key="x", max_retries=0)
        client.chat.completions.create(model="fake-model", messages=USER)
        assert len(reader.query_spans(rollout_id=rid, kind="llm")) == 1, "stored before the answer, with no flush"
        with WriteLock(db, after=0.6) as lock:  # the rollout's resource is cached: only the span write waits
            client.chat.completions.create(model="fake-model", messages=USER)
            assert lock.released.is_set(), "the answer came while its span could not be written yet"
        assert len(reader.query_spans(rollout_id=rid, kind="llm")) == 2
        reader.close()


def test_gateway_stream_sends_done_only_once_its_span_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with FakeLLM(["a streamed answer of several chunks"]) as fake, AglServer(SqliteStore(db)) as server:
        rid, aid = start_rollout(server, fake.base_url)
        reader = SqliteStore(db)
        body = {"model": "fake-model", "messages": USER, "stream": True}
        httpx.get(gw(server, rid, aid) + "/models", timeout=30)  # caches the rollout's resource: only the span waits
        content_before_done = 0
        with (
            WriteLock(db, after=0.6) as lock,
            httpx.stream("POST", gw(server, rid, aid) + "/chat/completions", json=body, timeout=30) as r,
        ):
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    assert lock.released.is_set(), "[DONE] arrived while the span could not be written yet"
                    [span] = reader.query_spans(rollout_id=rid, kind="llm")
                    assert span.status == "ok" and span.attributes[ATTR_RESPONSE_IDS] == fake.replies[0].token_ids
                    break
                content_before_done += line.startswith("data: {")
        assert content_before_done > 2, "the answer itself streamed as it came"
        reader.close()


def test_gateway_refuses_success_when_its_span_cannot_be_stored(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with FakeLLM(["four", "five", "six"]) as fake, AglServer(SqliteStore(db)) as server:
        rid, aid = start_rollout(server, fake.base_url)
        client = openai.OpenAI(base_url=gw(server, rid, aid), api_key="x", max_retries=0)
        broken = refuse_spans(db)
        with pytest.raises(openai.InternalServerError, match=r"could not be recorded.*spans refused") as refused:
            client.chat.completions.create(model="fake-model", messages=USER)
        assert refused.value.status_code == 503
        stream = client.chat.completions.create(model="fake-model", messages=USER, stream=True)
        with pytest.raises(openai.APIError, match=r"could not be recorded.*spans refused"):
            list(stream)
        broken.execute("DROP TRIGGER refuse_spans")
        broken.close()
        assert client.chat.completions.create(model="fake-model", messages=USER).choices[0].message.content == "six"
        assert len(llm_spans(server, rid)) == 1, "only the call whose span was stored counts as answered"


def test_gateway_span_takes_the_runners_sequence_number(server: AglServer) -> None:
    with FakeLLM(["four"]) as fake:
        rid, aid = start_rollout(server, fake.base_url)
        client = openai.OpenAI(base_url=gw(server, rid, aid), api_key="x", max_retries=0)
        client.chat.completions.create(model="fake-model", messages=USER, extra_headers={HEADER_SEQUENCE: "41"})
        [span] = llm_spans(server, rid)
        assert span.sequence == 41
        for bad in ("-1", "1e3", "seven", str(2**63), ""):
            r = httpx.post(
                gw(server, rid, aid) + "/chat/completions", json={"messages": USER}, headers={HEADER_SEQUENCE: bad}
            )
            assert r.status_code == 400 and f"header {HEADER_SEQUENCE}" in r.json()["error"], (bad, r.text)
        assert len(fake.requests) == 1 and len(llm_spans(server, rid)) == 1, "a refused call reaches nothing"


# --------------------------------------------------------------------------------------------------- bad input


def snapshot(store: Any) -> tuple[Any, ...]:
    resources = [store.get_resources(v).model_dump() for v in range(1, store.get_resources().version + 1)]
    return (
        [r.model_dump() for r in store.list_rollouts(limit=1000)],
        [s.model_dump() for s in store.query_spans()],
        resources,
        [r.model_dump() for r in store.list_records("k")],
    )


def raw_request(server: AglServer, head: bytes) -> bytes:
    """Send bytes httpx would refuse to send (a lying Content-Length) and return the start of the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(head)
        return conn.recv(4096)


def test_the_client_sends_long_lists_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agl.core.store.http as http_store

    monkeypatch.setattr(http_store, "MAX_BODY_LIST", 3)
    with AglServer(SqliteStore(tmp_path / "s.db")) as server:
        client = HttpStore(server.url)
        client.publish_resources({"p": PromptTemplate(template="{i}")})
        rollouts = client.enqueue([RolloutRequest(task={"i": i}) for i in range(7)])
        ids = [r.rollout_id for r in rollouts]
        assert len(set(ids)) == 7 and [r.task for r in client.get_rollouts(ids)] == [{"i": i} for i in range(7)]
        spans = [Span(rollout_id=ids[0], attempt_id="at-x", kind="tool", name=f"s{i}") for i in range(7)]
        assert client.add_spans(spans) == 7 and len(server.store.query_spans(rollout_id=ids[0])) == 7
        assert client.cancel(ids, reason="done") == 7
        assert [r.status for r in client.wait(ids, timeout=5)] == ["cancelled"] * 7
        client.close()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def test_a_body_of_millions_of_junk_items_is_refused_at_once_without_the_memory_to_list_them(tmp_path: Path) -> None:
    """A list longer than the server takes (``MAX_BODY_LIST``) is refused at its first item past the limit: one
    error, not one per item (25 million integers as spans took ~20 GB to refuse, and the kernel killed the server)."""
    port = free_port()
    proc = start_server(tmp_path / "junk.db", port)
    url = f"http://127.0.0.1:{port}"
    try:
        before = _rss_mb(proc.pid)
        junk = b"[" + b"1," * 25_000_000 + b"1]"
        for path, named in (("/api/spans", "spans"), ("/api/rollouts/enqueue", "requests")):
            body = junk if path == "/api/spans" else b'{"requests": ' + junk + b"}"
            r = httpx.post(url + path, content=body, headers=JSON, timeout=120)
            assert r.status_code == 422 and named in r.json()["error"] and "10000" in r.json()["error"], r.text[:500]
        grown = _rss_mb(proc.pid) - before
        assert grown < 1000, f"the server grew {grown:.0f} MB refusing two 50 MB bodies"
        assert httpx.get(url + "/health", timeout=10).json() == {"status": "ok"}
    finally:
        kill(proc)


def test_a_client_that_leaves_mid_body_leaves_no_traceback_and_the_server_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with AglServer(SqliteStore(tmp_path / "s.db")) as server:
        caplog.set_level(logging.INFO)
        for path in (b"/api/spans", b"/api/rollouts/enqueue"):
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
                head = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                conn.sendall(head + b"Content-Length: 100000\r\n\r\n[{")
            deadline = time.monotonic() + 10
            while "client left during POST " + path.decode() not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        assert caplog.text.count("client left during POST") == 2, caplog.text
        assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}


def test_bad_input_is_4xx_naming_the_problem_and_changes_nothing(tmp_path: Path) -> None:
    with AglServer(SqliteStore(tmp_path / "s.db"), max_body_bytes=200_000) as server:
        with FakeLLM() as fake:
            rid, aid = start_rollout(server, fake.base_url)
        good = Span(rollout_id=rid, attempt_id=aid, kind="tool", name="t").model_dump(mode="json")
        server.store.add_spans([Span.model_validate(good)])
        server.store.add_record(Record(kind="k", data={"x": 1}))
        before = snapshot(server.store)
        bad_kind = [{**good, "span_id": f"sp-new-{i}", "kind": "llm" if i != 3 else "nonsense"} for i in range(5)]
        big = json.dumps([{**good, "span_id": f"sp-big-{i}", "name": "x" * 500} for i in range(500)]).encode()
        g = gw(server, rid, aid)
        cases: list[tuple[str, str, Any, int, str]] = [
            ("POST", "/api/spans", b"[{", 400, "malformed JSON"),
            ("POST", "/api/spans", bad_kind, 422, "spans[3].kind: Input should be 'llm', 'tool'"),
            ("POST", "/api/spans", {"spans": []}, 422, "spans: Input should be a valid array"),
            ("POST", "/api/spans", [{**good, "sequence": "first"}], 422, "spans[0].sequence"),
            ("POST", "/api/spans", big, 413, "over the limit"),
            ("POST", "/api/spans", [good, {**good, "span_id": "sp/1"}], 422, "spans[1].span_id: an id cannot hold '/'"),
            (
                "POST",
                "/api/rollouts/enqueue",
                {"requests": [{"task": 1, "rollout_id": "a/b"}]},
                422,
                "requests[0].rollout_id",
            ),
            ("POST", "/api/rollouts/enqueue", b'{"requests": [', 400, "malformed JSON"),
            (
                "POST",
                "/api/rollouts/enqueue",
                {"requests": [{"task_id": "t"}]},
                422,
                "requests[0].task: Field required",
            ),
            ("POST", "/api/rollouts/enqueue", {"requests": [{"task": 1, "max_attempts": "x"}]}, 422, "max_attempts"),
            (
                "POST",
                "/api/rollouts/enqueue",
                {"requests": [{"task": 1, "resources_version": 9}]},
                404,
                "never published",
            ),
            ("POST", "/api/lease", {}, 422, "worker_id: Field required"),
            ("POST", f"/api/attempts/{aid}/complete", {"status": "done"}, 422, "status: Input should be"),
            ("POST", f"/api/attempts/{aid}/complete", {"status": "timed_out"}, 409, "must be 'succeeded', 'failed'"),
            ("POST", "/api/attempts/at-nope/complete", {"status": "failed"}, 404, "no attempt 'at-nope'"),
            ("GET", "/api/rollouts?limit=many", None, 422, "query parameter limit"),
            ("GET", "/api/rollouts/ro-nope", None, 404, "no rollout 'ro-nope'"),
            ("POST", "/api/rollouts/get", {"rollout_ids": "ro-1"}, 422, "rollout_ids: Input should be a valid array"),
            ("POST", "/api/rollouts/cancel", {"rollout_ids": [rid], "reason": ""}, 422, "reason: String should have"),
            ("POST", "/api/rollouts/cancel", {"rollout_ids": [rid], "reason": 7}, 422, "reason: Input should be"),
            ("POST", "/api/rollouts/wait", {"rollout_ids": ["ro-nope"], "timeout": 0}, 404, "no rollout"),
            ("POST", "/api/rollouts/wait", {"rollout_ids": [rid], "timeout": -1}, 422, "timeout"),
            ("POST", "/api/resources", {"resources": {"m": {"kind": "llm", "model": "x"}}}, 422, "m.llm.base_url"),
            ("POST", "/api/resources", {"resources": {}}, 409, "at least one"),
            ("GET", "/api/resources/seven", None, 422, "path parameter version"),
            ("GET", "/api/resources/99", None, 404, "no resources version 99"),
            ("POST", "/api/records", {"kind": "", "data": {}}, 422, "kind: String should have at least 1"),
            ("POST", "/api/records", {"kind": "k", "data": []}, 422, "data: Input should be an object"),
            ("GET", "/api/records", None, 422, "query parameter kind: Field required"),
            ("POST", g + "/chat/completions", b"{nope", 400, "malformed JSON"),
            ("POST", g + "/chat/completions", [1, 2], 400, "must be a JSON object"),
            ("POST", g + "/chat/completions", big, 413, "over the limit"),
            ("POST", g.replace(aid, "a" * 200) + "/chat/completions", {}, 400, "attempt id is 200 characters long"),
            ("GET", "/api/nowhere", None, 404, "no endpoint GET /api/nowhere"),
        ]
        with httpx.Client(base_url=server.url) as http:
            for method, path, body, status, message in cases:
                content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
                r = http.request(method, path, content=content, headers=JSON)
                assert (r.status_code, message in r.json().get("error", "")) == (status, True), (path, r.text)
            # body sent without Content-Length (chunked) is counted as it streams
            r = http.post("/api/spans", content=iter([big[:150_000], big[150_000:]]), headers=JSON)
            assert r.status_code == 413 and "over the limit" in r.json()["error"]
            r = http.post("/api/spans", content=json.dumps([good]).encode(), headers={"content-type": "text/plain"})
            assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]
            assert raw_request(
                server, b"POST /api/spans HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000\r\n\r\n[]"
            ).startswith(b"HTTP/1.1 413"), "a declared length over the limit is refused before reading the body"
            assert http.get("/health").json() == {"status": "ok"}
        assert snapshot(server.store) == before
        assert fake.requests == []


def test_values_json_cannot_hold_are_refused_naming_the_field_and_nothing_stored(server: AglServer) -> None:
    with FakeLLM() as fake:
        rid, aid = start_rollout(server, fake.base_url)
        good = Span(rollout_id=rid, attempt_id=aid, kind="tool", name="t").model_dump(mode="json")
        server.store.add_spans([Span.model_validate(good)])
        before = snapshot(server.store)

        def span_with(**raw: str) -> str:
            """A list of one span whose given fields are raw JSON text (values ``json.dumps`` would not write)."""
            text = json.dumps([{**good, **{key: f"@{key}@" for key in raw}}])
            for key, value in raw.items():
                text = text.replace(f'"@{key}@"', value)
            return text

        def nested(levels: int) -> str:
            return "[" * levels + "]" * levels

        chat = gw(server, rid, aid) + "/chat/completions"
        cases: list[tuple[str, str, str | None, int, str]] = [
            ("POST", "/api/spans", span_with(start_time="1e400"), 422, "spans[0].start_time: Input should be a finite"),
            ("POST", "/api/spans", span_with(end_time="NaN"), 422, "spans[0].end_time: Input should be a finite"),
            (
                "POST",
                "/api/spans",
                span_with(attributes='{"x": [1, -Infinity]}'),
                422,
                "spans[0].attributes.x[1]: -inf",
            ),
            ("POST", "/api/spans", span_with(attributes=f'{{"n": {2**64}}}'), 422, "spans[0].attributes.n: an integer"),
            ("POST", "/api/spans", span_with(sequence=str(2**63)), 422, "spans[0].sequence: Input should be less than"),
            ("POST", "/api/spans", span_with(attributes=f'{{"d": {nested(70)}}}'), 400, "spans[0].attributes.d[0][0]"),
            ("POST", "/api/spans", span_with(attributes=f'{{"d": {nested(1500)}}}'), 400, "nested too deeply"),
            ("POST", "/api/rollouts/enqueue", '{"requests": [{"task": {"q": NaN}}]}', 422, "requests[0].task.q: nan"),
            (
                "POST",
                "/api/rollouts/enqueue",
                f'{{"requests": [{{"task": 1, "resources_version": {2**63}}}]}}',
                422,
                "requests[0].resources_version: Input should be less than or equal",
            ),
            ("POST", "/api/rollouts/enqueue", '{"requests": [{"task": 1, "max_attempts": "3"}]}', 422, "max_attempts"),
            ("POST", "/api/rollouts/enqueue", nested(1500), 400, "nested too deeply"),
            ("POST", "/api/records", '{"kind": "k", "data": {"x": Infinity}}', 422, "data.x: inf is not a finite"),
            (
                "POST",
                "/api/resources",
                '{"resources": {"m": {"kind": "llm", "base_url": "u", "model": "m", "sampling": {"t": 1e999}}}}',
                422,
                "resources.m.llm.sampling.t: inf",
            ),
            ("POST", f"/api/attempts/{aid}/complete", '{"status": "failed", "final_reward": NaN}', 422, "final_reward"),
            ("POST", "/api/rollouts/wait", '{"rollout_ids": [], "timeout": Infinity}', 422, "timeout: Input should be"),
            ("GET", f"/api/rollouts?offset={2**63}", None, 422, "query parameter offset"),
            ("GET", f"/api/spans?limit={2**63}", None, 422, "query parameter limit"),
            ("GET", f"/api/resources/{2**63}", None, 422, "path parameter version"),
            ("GET", f"/api/resources/{-(2**63) - 1}", None, 422, "path parameter version"),
            ("POST", chat, '{"messages": [{"role": "user", "content": NaN}]}', 422, "body.messages[0].content: nan"),
        ]
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for method, path, body, status, message in cases:
                r = http.request(method, path, content=body, headers=JSON)
                assert (r.status_code, message in r.json()["error"]) == (status, True), (path, r.text)
            assert http.get("/api/spans", params={"rollout_id": rid}).status_code == 200, "what is stored reads back"
        assert snapshot(server.store) == before
        assert fake.requests == []


def test_unexpected_errors_answer_500_with_an_id_and_keep_the_connection(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with AglServer(SqliteStore(db)) as server, socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        refuse_spans(db).close()
        span = Span(rollout_id="ro-1", attempt_id="at-1", kind="tool", name="t").model_dump_json().encode()
        body = b"[" + span + b"]"
        conn.sendall(
            b"POST /api/spans HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status, headers, answer = read_response(conn)
        assert status == 500 and headers.get("connection") != "close"
        message = json.loads(answer)["error"]
        assert "internal server error (id err-" in message and "spans refused" not in message, message
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(conn)[0] == 200, "the same connection still serves"


def test_a_store_that_cannot_write_answers_503_naming_the_cause_until_it_can(server: AglServer) -> None:
    store = server.store
    assert isinstance(store, SqliteStore)
    store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m")})
    before = store.enqueue([RolloutRequest(task={"q": "kept"})])
    with store._lock:
        store._conn.execute("PRAGMA query_only=1")  # what a read-only file or a full disk does to every write
    resp = httpx.post(f"{server.url}/api/rollouts/enqueue", json={"requests": [{"task": {"q": "refused"}}]})
    assert resp.status_code == 503, resp.text
    assert "cannot take writes now" in resp.json()["error"] and "readonly" in resp.json()["error"]
    assert httpx.get(f"{server.url}/api/rollouts/{before[0].rollout_id}").status_code == 200, "reads still served"
    with store._lock:
        store._conn.execute("PRAGMA query_only=0")
    resp = httpx.post(f"{server.url}/api/rollouts/enqueue", json={"requests": [{"task": {"q": "taken"}}]})
    assert resp.status_code == 200, resp.text
    assert [r.task for r in store.list_rollouts(limit=10)] == [{"q": "taken"}, {"q": "kept"}]


def read_response(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length from a raw socket: (status, lower-cased headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(rest) < int(headers["content-length"]):
        rest += conn.recv(65536)
    return int(lines[0].split()[1]), headers, rest


def test_openapi_schema_describes_the_api(server: AglServer) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    paths = schema["paths"]
    for path in (
        "/api/spans",
        "/api/rollouts/enqueue",
        "/api/lease",
        "/api/rollouts/wait",
        "/api/resources",
        "/health",
    ):
        assert path in paths
    assert "/gw/{rollout_id}/{attempt_id}/{resource_name}/v1/chat/completions" in paths
    body = paths["/api/spans"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"type": "array", "items": {"$ref": "#/components/schemas/Span"}, "maxItems": 10_000}
    assert {"Span", "Rollout", "Attempt", "ResourceSet", "Record"} <= set(schema["components"]["schemas"])


# --------------------------------------------------------------------------------------------------- durability


def test_restart_keeps_every_acknowledged_span(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SqliteStore(db)
    with FakeLLM() as fake, AglServer(store) as server:
        rid, aid = start_rollout(server, fake.base_url)
        http = HttpStore(server.url)
        sent = [Span(rollout_id=rid, attempt_id=aid, kind="tool", name=f"t{i}") for i in range(300)]
        assert sum(http.add_spans(sent[i : i + 100]) for i in range(0, 300, 100)) == 300
        assert http.add_spans(sent[:100]) == 0, "re-sending a batch adds nothing"
        client = openai.OpenAI(base_url=gw(server, rid, aid), api_key="x", max_retries=0)
        client.chat.completions.create(model="fake-model", messages=USER)
        http.close()
    store.close()
    with AglServer(SqliteStore(db)) as server:
        got = HttpStore(server.url).query_spans(rollout_id=rid)
    assert {s.span_id for s in got if s.kind == "tool"} == {s.span_id for s in sent}
    assert [s.kind for s in got].count("llm") == 1, "the gateway span was flushed at shutdown"


def test_gateway_span_writer_writes_without_being_flushed(server: AglServer) -> None:
    pipeline = server.app.state.span_pipeline  # type: ignore[union-attr]
    span = Span(rollout_id="ro-1", attempt_id="at-1", kind="llm", name="chat.completions")
    pipeline.put(span)
    deadline = time.monotonic() + 30.0  # the loop ends when the write lands; the bound only stops a hang
    while not server.store.query_spans(rollout_id="ro-1") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [s.span_id for s in server.store.query_spans(rollout_id="ro-1")] == [span.span_id]


def test_http_store_retries_across_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    first = AglServer(SqliteStore(db)).start()
    port = first.port
    http = HttpStore(first.url, retry_for=30)
    first.store.publish_resources({"m": LLM(base_url="http://x/v1", model="m")})
    [ro] = http.enqueue([RolloutRequest(task=1)])
    first.stop()
    first.store.close()

    second = AglServer(SqliteStore(db), port=port)
    restarter = threading.Timer(0.3, second.start)
    restarter.start()
    try:
        span = Span(rollout_id=ro.rollout_id, attempt_id="at-x", kind="reward", name="r")
        assert http.add_spans([span]) == 1
        assert http.get_rollout(ro.rollout_id).status == "queued"
    finally:
        restarter.join()
        second.stop()
        http.close()


def test_http_store_errors() -> None:
    with pytest.raises(StoreError, match="unavailable"):
        HttpStore(f"http://127.0.0.1:{free_port()}", retry_for=0.2).list_rollouts()


def test_http_store_maps_status_codes(server: AglServer) -> None:
    http = HttpStore(server.url)
    with pytest.raises(NotFound, match="no rollout 'ro-nope'"):
        http.get_rollout("ro-nope")
    with pytest.raises(StoreError, match="publish_resources"):
        http.enqueue([RolloutRequest(task=1)])
    assert http.settings == server.store.settings
    http.close()


def test_serve_prints_its_url_and_serves(tmp_path: Path) -> None:
    code = "import sys; from agl.core.server import serve; serve(sys.argv[1], '127.0.0.1', 0)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, f"sqlite:///{tmp_path / 'cli.db'}"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split("listening on ")[1].split()[0]
        assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
