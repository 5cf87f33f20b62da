"""Tokens and roles on the agl server, per-attempt gateway keys, API keys that never leave the server, the policy
server's key and weights root, and what an open server may not do. Real servers on 127.0.0.1, real HTTP."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi.routing import APIRoute

import agl
from agl.core.runner import gateway_resources
from agl.core.runner_pool import RunnerPool
from agl.core.server import AglServer
from agl.core.server.auth import OPEN_PATHS, ROUTE_ROLES, TokenFileError, Tokens
from agl.core.store.base import StoreError
from agl.core.store.http import HttpStore
from agl.core.store.sqlite import SqliteStore
from agl.core.types import LLM, REDACTED, PromptTemplate, Record, RolloutRequest, Span
from agl.testing import FakeLLM, FakeReply
from tests.server_process import free_port, server_log, start_server

REPO = Path(__file__).resolve().parents[1]
TRAINER = "trainer-token-0123456789abcdef"
RUNNER = "runner-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
#: A distinctive upstream key: it must never appear in an answer, CLI output or log line.
SECRET = "sk-upstream-SECRET-7f3a9c2e5b1d"
USER: Any = [{"role": "user", "content": "what is two plus two"}]


def all_tokens() -> Tokens:
    return Tokens([("trainer", TRAINER), ("runner", RUNNER), ("reader", READER)])


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM(lambda body: FakeReply(content="four")) as server:
        yield server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AglServer]:
    with AglServer(SqliteStore(tmp_path / "s.db"), tokens=all_tokens()) as srv:
        yield srv


def filled(path: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "1"), path)


def operations(app: Any) -> list[tuple[str, str]]:
    """Every (method, path template) the app routes, from its routes (so a new route cannot be forgotten)."""
    found = [(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in sorted(r.methods)]
    return [(m, p) for m, p in found if p not in OPEN_PATHS]


def key_checking_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Fails unless it was handed its attempt key (never the upstream key or a token) and the gateway takes it."""
    llm = resources["main_llm"]
    if not llm.api_key.startswith("agl-ak-") or "AGL_TOKEN" in os.environ:
        raise AssertionError("the agent saw something other than its attempt key")
    if b"AGL_TOKEN=" in Path("/proc/self/environ").read_bytes():
        raise AssertionError("the runner's token is in the environment block its process started with")
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if reply.choices[0].message.content == "four" else 0.0


# ------------------------------------------------------------------------------------------------- tokens


def test_token_file_format_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# agl tokens\n\ntrainer  {TRAINER}\n  runner {RUNNER}  \nrunner {READER}\n")
    path.chmod(0o600)
    tokens = Tokens.load(path)
    assert tokens.role_of(TRAINER) == "trainer" and tokens.role_of(RUNNER) == tokens.role_of(READER) == "runner"
    assert tokens.role_of("not-a-token-at-all-0000") is None
    assert repr(tokens) == "Tokens(trainer=1, runner=2)" and TRAINER not in repr(tokens)
    for text, problem in [
        (f"admin {TRAINER}", "line 1: unknown role 'admin'"),
        ("trainer short", "line 1: the token is 5 characters; at least 16"),
        (f"# c\ntrainer {TRAINER} extra", "line 2: expected '<role> <token>'"),
        (f"trainer {TRAINER}\nreader {TRAINER}", "the same token is given two roles"),
        ("# only comments\n", "no tokens"),
    ]:
        with pytest.raises(TokenFileError, match=re.escape(problem)) as caught:
            Tokens.parse(text)
        assert TRAINER not in str(caught.value)
    with pytest.raises(TokenFileError, match="cannot read it"):
        Tokens.load(tmp_path / "missing")
    alone = Tokens.configured(None, {"AGL_TOKEN": TRAINER})
    assert alone is not None and alone.role_of(TRAINER) == "trainer"
    both = Tokens.configured(path, {"AGL_TOKEN": "another-trainer-token-000"})
    assert both is not None and both.role_of("another-trainer-token-000") == "trainer" == both.role_of(TRAINER)
    assert Tokens.configured(None, {}) is None


def test_attempt_keys_are_per_attempt_and_survive_a_restart_with_the_same_tokens() -> None:
    tokens = all_tokens()
    key = tokens.attempt_key("ro-1", "at-1")
    assert key.startswith("agl-ak-") and key != tokens.attempt_key("ro-1", "at-2") != tokens.attempt_key("ro-2", "at-1")
    again = Tokens([("reader", READER), ("runner", RUNNER), ("trainer", TRAINER)])  # same tokens, any order
    assert again.is_attempt_key(key, "ro-1", "at-1") and not again.is_attempt_key(key, "ro-1", "at-2")
    assert not Tokens([("trainer", "a-different-trainer-token")]).is_attempt_key(key, "ro-1", "at-1")
    grown = [("reader", "another-reader-token-0000"), ("runner", "another-runner-token-0000")]
    grown += [("trainer", "0-sorts-before-the-old-trainer-token"), ("trainer", TRAINER), ("runner", RUNNER)]
    assert Tokens(grown).is_attempt_key(key, "ro-1", "at-1"), "tokens added to the file keep running attempts' keys"
    assert not Tokens(grown).is_attempt_key(key, "ro-1", "at-2")
    assert not Tokens([("runner", RUNNER), ("reader", READER)]).is_attempt_key(key, "ro-1", "at-1"), "revoked"


# ------------------------------------------------------------------------------------------------- the door


def test_every_route_without_a_valid_token_answers_401(server: AglServer) -> None:
    assert server.app is not None
    ops = operations(server.app)
    assert len(ops) >= 20 and any(p.startswith("/gw/") for _, p in ops)
    for headers in ({}, bearer("not-a-token-of-this-server"), {"authorization": f"Basic {TRAINER}"}):
        for method, path in ops:
            url = server.url + filled(path, {"resource_name": "main_llm"})
            resp = httpx.request(method, url, headers={**headers, "content-type": "application/json"}, content=b"{}")
            assert resp.status_code == 401, (method, path, headers, resp.text)
            assert resp.headers["www-authenticate"].startswith("Bearer")
            assert list(resp.json()) == ["error"] and resp.json()["error"]
    assert httpx.get(server.url + "/health").status_code == 200
    schema = httpx.get(server.url + "/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schema["paths"]["/health"]["get"]["security"] == []
    missing = httpx.get(server.url + "/api/rollouts", timeout=10)
    assert "AGL_TOKEN" in missing.json()["error"] and "Authorization: Bearer" in missing.json()["error"]


def test_each_role_may_do_its_part_only(server: AglServer, fake: FakeLLM) -> None:
    trainer, runner, reader = (HttpStore(server.url, token=t, retry_for=2) for t in (TRAINER, RUNNER, READER))
    try:
        trainer.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="m", api_key=SECRET)})
        trainer.enqueue([RolloutRequest(task={"q": i}) for i in range(2)])
        first = runner.lease("runner-1")
        second = trainer.lease("trainer-as-runner")
        assert first is not None and second is not None
        (ro1, at1), (ro2, at2) = first, second
        span = Span(rollout_id=ro1.rollout_id, attempt_id=at1.attempt_id, kind="reward", name="r")
        assert runner.add_spans([span]) == 1 and runner.heartbeat(at1.attempt_id)  # with the attempt's key
        assert runner.get_resources(ro1.resources_version).resources["main_llm"].api_key == REDACTED
        assert runner.get_rollout(ro1.rollout_id).rollout_id == ro1.rollout_id
        assert runner.settings.heartbeat_timeout > 0 and runner.reap() == 0
        assert reader.query_spans(attempt_id=at1.attempt_id) == [span]
        assert [r.rollout_id for r in reader.get_rollouts([ro2.rollout_id])] == [ro2.rollout_id]
        assert len(reader.list_rollouts()) == 2 and reader.list_attempts(ro1.rollout_id)

        def refused(token: str, method: str, path: str, body: Any = None) -> str:
            resp = httpx.request(method, server.url + path, headers=bearer(token), json=body, timeout=10)
            assert resp.status_code == 403, (token[:6], method, path, resp.text)
            assert list(resp.json()) == ["error"]
            return str(resp.json()["error"])

        publish = {"resources": {"p": {"kind": "prompt_template", "template": "{q}"}}}
        message = refused(RUNNER, "POST", "/api/resources", publish)
        assert "needs a trainer token" in message and "runner role" in message
        refused(RUNNER, "GET", f"/api/spans?attempt_id={at2.attempt_id}")
        refused(RUNNER, "GET", "/api/spans")
        refused(RUNNER, "POST", "/api/rollouts/enqueue", {"requests": [{"task": 1}]})
        refused(RUNNER, "POST", "/api/rollouts/cancel", {"rollout_ids": [ro2.rollout_id]})
        refused(RUNNER, "GET", "/api/rollouts")
        refused(RUNNER, "POST", "/api/records", {"kind": "k"})
        refused(READER, "POST", "/api/resources", publish)
        refused(READER, "POST", "/api/lease", {"worker_id": "w"})
        refused(READER, "POST", f"/api/attempts/{at1.attempt_id}/complete", {"status": "failed"})
        refused(READER, "POST", "/api/spans", [])
        with pytest.raises(StoreError, match="HTTP 403"):
            runner.publish_resources({"p": PromptTemplate(template="{q}")})
        assert runner.complete_attempt(at1.attempt_id, "succeeded", final_reward=1.0)
        assert trainer.cancel([ro2.rollout_id]) == 1
        with pytest.raises(StoreError, match="HTTP 401, no token sent"):
            HttpStore(server.url, token="", retry_for=1).list_rollouts()
    finally:
        for store in (trainer, runner, reader):
            store.close()


def test_a_runner_settles_and_writes_into_the_attempts_it_leased_only(server: AglServer, fake: FakeLLM) -> None:
    """Heartbeat, complete and span writes take the attempt's key (sent by the client that leased it), never a runner
    token: agent code that reads its runner's token cannot settle another runner's attempt or write into it."""
    trainer, mine, theirs = (HttpStore(server.url, token=t, retry_for=2) for t in (TRAINER, RUNNER, RUNNER))
    trainer.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="m", api_key=SECRET)})
    trainer.enqueue([RolloutRequest(task={"q": i}) for i in range(2)])
    (ro1, at1), (ro2, at2) = mine.lease("mine"), theirs.lease("theirs")  # type: ignore[misc]
    their_key = theirs.attempt_key(at2.attempt_id)

    def post(path: str, headers: dict[str, str], body: Any) -> httpx.Response:
        return httpx.post(server.url + path, json=body, headers=headers, timeout=10)

    def as_attempt(key: str, rollout: str, attempt: str) -> dict[str, str]:
        return {**bearer(key), "x-agl-rollout-id": rollout, "x-agl-attempt-id": attempt}

    complete = f"/api/attempts/{at1.attempt_id}/complete"
    win = {"status": "succeeded", "final_reward": 1e6}
    refused = post(complete, bearer(RUNNER), win)
    assert refused.status_code == 403 and "attempt's key" in refused.json()["error"]
    assert post(f"/api/attempts/{at1.attempt_id}/heartbeat", bearer(RUNNER), None).status_code == 403
    assert post(complete, as_attempt(their_key, ro2.rollout_id, at2.attempt_id), win).status_code == 401
    assert post(complete, as_attempt(their_key, ro1.rollout_id, at1.attempt_id), win).status_code == 401
    forged = Span(rollout_id=ro1.rollout_id, attempt_id=at1.attempt_id, kind="reward", name="r")
    body = [forged.model_dump(mode="json")]
    assert post("/api/spans", bearer(RUNNER), body).status_code == 403
    wrong = post("/api/spans", as_attempt(their_key, ro2.rollout_id, at2.attempt_id), body)
    assert wrong.status_code == 403 and "spans[0]: an attempt's key writes spans of that attempt only" in wrong.text
    made_up = [{**body[0], "rollout_id": "ro-made-up", "attempt_id": at2.attempt_id}]
    assert post("/api/spans", as_attempt(their_key, ro2.rollout_id, at2.attempt_id), made_up).status_code == 403
    with pytest.raises(StoreError, match="HTTP 403"):
        theirs.add_spans([forged])  # their client holds no key for it: it sends the token, which is refused
    assert server.store.query_spans(rollout_id=ro1.rollout_id) == []
    # each client settles its own attempt with that attempt's key
    own = Span(rollout_id=ro1.rollout_id, attempt_id=at1.attempt_id, kind="reward", name="r")
    assert mine.add_spans([own]) == 1 and mine.heartbeat(at1.attempt_id)
    assert mine.complete_attempt(at1.attempt_id, "succeeded", final_reward=0.5)
    assert theirs.complete_attempt(at2.attempt_id, "failed", error="x")
    assert [r.final_reward for r in trainer.get_rollouts([ro1.rollout_id])] == [0.5]
    for store in (trainer, mine, theirs):
        store.close()


def test_gateway_takes_the_attempt_key_of_its_own_attempt_only(tmp_path: Path, fake: FakeLLM) -> None:
    db = tmp_path / "gw.db"
    with AglServer(SqliteStore(db), tokens=all_tokens()) as server:
        trainer, runner = HttpStore(server.url, token=TRAINER), HttpStore(server.url, token=RUNNER)
        trainer.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="m", api_key=SECRET)})
        trainer.enqueue([RolloutRequest(task={"q": i}) for i in range(2)])
        (ro1, at1), (ro2, at2) = runner.lease("w1"), runner.lease("w2")  # type: ignore[misc]
        key = runner.attempt_key(at1.attempt_id)
        assert key.startswith("agl-ak-") and key != runner.attempt_key(at2.attempt_id)
        resources = gateway_resources(runner.get_resources(ro1.resources_version).resources, server.url, ro1, at1, key)
        llm = resources["main_llm"]
        assert llm.api_key == key and llm.base_url.startswith(f"{server.url}/gw/{ro1.rollout_id}/{at1.attempt_id}/")
        reply = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0).chat.completions.create(
            model=llm.model, messages=USER
        )
        assert reply.choices[0].message.content == "four"
        assert fake.requests[-1].headers["authorization"] == f"Bearer {SECRET}", "the gateway sends the real key"

        def status(rollout: str, attempt: str, headers: dict[str, str]) -> int:
            url = f"{server.url}/gw/{rollout}/{attempt}/main_llm/v1/chat/completions"
            return httpx.post(url, json={"messages": USER}, headers=headers, timeout=30).status_code

        assert status(ro2.rollout_id, at2.attempt_id, bearer(key)) == 401, "another attempt's key"
        assert status(ro2.rollout_id, at1.attempt_id, bearer(key)) == 401, "its attempt under another rollout"
        assert status(ro1.rollout_id, at1.attempt_id, {}) == 401
        assert status(ro1.rollout_id, at1.attempt_id, bearer(RUNNER)) == 403
        assert status(ro1.rollout_id, at1.attempt_id, bearer(READER)) == 403
        assert status(ro2.rollout_id, at2.attempt_id, bearer(TRAINER)) == 200
        models = httpx.get(f"{server.url}/gw/{ro1.rollout_id}/{at1.attempt_id}/main_llm/v1/models", headers=bearer(key))
        assert models.status_code == 200
        trainer.close()
        runner.close()
    # a server restarted with the same tokens takes the keys of attempts that still run
    with AglServer(SqliteStore(db), tokens=Tokens([("reader", READER), ("trainer", TRAINER), ("runner", RUNNER)])) as s:
        assert status_at(s.url, ro1.rollout_id, at1.attempt_id, key) == 200
    with AglServer(SqliteStore(db), tokens=Tokens([("trainer", "a-different-trainer-token")])) as s:
        assert status_at(s.url, ro1.rollout_id, at1.attempt_id, key) == 401


def status_at(url: str, rollout: str, attempt: str, key: str) -> int:
    gw = f"{url}/gw/{rollout}/{attempt}/main_llm/v1/chat/completions"
    return httpx.post(gw, json={"messages": USER}, headers=bearer(key), timeout=30).status_code


# ------------------------------------------------------------------------------------------------- secrets


def test_no_answer_cli_output_or_log_line_holds_an_api_key(
    server: AglServer, fake: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    trainer, runner = HttpStore(server.url, token=TRAINER), HttpStore(server.url, token=RUNNER)
    llm = LLM(base_url=fake.base_url, model="m", api_key=SECRET)
    assert SECRET not in repr(llm) and SECRET not in str(llm)
    published = trainer.publish_resources({"main_llm": llm, "prompt": PromptTemplate(template="{q}")})
    assert published.resources["main_llm"].api_key == REDACTED and SECRET not in repr(published)
    [ro] = trainer.enqueue([RolloutRequest(task={"q": 1})])
    lease = httpx.post(server.url + "/api/lease", json={"worker_id": "w"}, headers=bearer(RUNNER)).json()
    rollout_id, attempt_id, key = lease["rollout"]["rollout_id"], lease["attempt"]["attempt_id"], lease["attempt_key"]
    gw = f"{server.url}/gw/{rollout_id}/{attempt_id}/main_llm/v1"
    chat = httpx.post(gw + "/chat/completions", json={"messages": USER}, headers=bearer(key), timeout=30)
    assert chat.status_code == 200 and fake.requests[-1].headers["authorization"] == f"Bearer {SECRET}"
    message = Span(rollout_id=rollout_id, attempt_id=attempt_id, kind="message", name="m")
    trainer.add_spans([message])
    assert trainer.complete_attempt(attempt_id, "succeeded", final_reward=1.0)
    trainer.add_record(Record(kind="metrics", key="0", data={"r": 1}))
    server.flush()
    assert server.store.get_resources().resources["main_llm"].api_key == SECRET, "the store keeps the real key"

    ids = {"rollout_id": rollout_id, "attempt_id": attempt_id, "version": "1", "resource_name": "main_llm"}
    ids.update(span_id=message.span_id, name="style.css")  # the dashboard's pages (agl.dashboard.PAGE_ROUTES)
    bodies = [lease, chat.text]
    assert server.app is not None
    for method, path in operations(server.app):
        if method != "GET":
            continue
        params = {"kind": "metrics"} if path == "/api/records" else None
        resp = httpx.get(server.url + filled(path, ids), params=params, headers=bearer(TRAINER), timeout=30)
        assert resp.status_code == 200 or path.startswith("/gw/"), (path, resp.text)  # a finished attempt: 409
        bodies.append(resp.text)
    for path, body in (("/api/rollouts/get", {"rollout_ids": [ro.rollout_id]}), ("/api/rollouts/wait", {
        "rollout_ids": [ro.rollout_id], "timeout": 0})):  # fmt: skip
        bodies.append(httpx.post(server.url + path, json=body, headers=bearer(READER), timeout=30).text)
    assert all(SECRET not in b for b in bodies)
    assert any(REDACTED in b for b in bodies), "the resources were among the answers"

    env = {k: v for k, v in os.environ.items() if k != "AGL_TOKEN"}
    for args in (["runs"], ["show", rollout_id]):
        cli = [sys.executable, "-m", "agl.cli", *args, "--store", server.url]
        done = subprocess.run(cli, env={**env, "AGL_TOKEN": READER}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert rollout_id in done.stdout and SECRET not in done.stdout + done.stderr
        refused = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "AGL_TOKEN" in refused.stderr and SECRET not in refused.stderr
    assert SECRET not in caplog.text and TRAINER not in caplog.text and key not in caplog.text
    trainer.close()
    runner.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_backend_that_repeats_the_key_in_its_error_gives_it_to_neither_the_agent_nor_the_span(
    server: AglServer, stream: bool
) -> None:
    """Hosted APIs answer a wrong key with ``Incorrect API key provided: sk-...``; the gateway relays that answer
    to the agent and records it on the span, so it scrubs the key from both."""
    echo = f"Incorrect API key provided: {SECRET}. You can find your API key at https://example.invalid."
    with FakeLLM(lambda body: FakeReply(status=401, error=echo)) as backend:
        trainer = HttpStore(server.url, token=TRAINER)
        trainer.publish_resources({"main_llm": LLM(base_url=backend.base_url, model="m", api_key=SECRET)})
        trainer.enqueue([RolloutRequest(task={"q": 1})])
        lease = httpx.post(server.url + "/api/lease", json={"worker_id": "w"}, headers=bearer(RUNNER)).json()
        rollout_id, attempt_id = lease["rollout"]["rollout_id"], lease["attempt"]["attempt_id"]
        gw = f"{server.url}/gw/{rollout_id}/{attempt_id}/main_llm/v1"
        body = {"messages": USER, "stream": stream}
        chat = httpx.post(gw + "/chat/completions", json=body, headers=bearer(lease["attempt_key"]), timeout=30)
        assert backend.requests[-1].headers["authorization"] == f"Bearer {SECRET}", "the backend got the real key"
    assert chat.status_code == 401 and "Incorrect API key provided: <api_key withheld by agl>" in chat.text
    assert SECRET not in chat.text
    server.flush()
    [span] = server.store.query_spans(rollout_id=rollout_id)
    assert span.status == "error" and "Incorrect API key provided" in json.dumps(span.attributes)
    assert SECRET not in span.model_dump_json()
    trainer.close()


def test_a_republished_redacted_key_keeps_the_real_one_and_goes_nowhere_else(server: AglServer) -> None:
    trainer = HttpStore(server.url, token=TRAINER)
    trainer.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m", api_key=SECRET)})
    fetched = trainer.get_resources()
    assert fetched.resources["main_llm"].api_key == REDACTED
    again = trainer.publish_resources({**fetched.resources, "prompt": PromptTemplate(template="{q}")})
    assert again.version == 2
    kept = server.store.get_resources(2).resources["main_llm"]
    assert isinstance(kept, LLM) and kept.api_key == SECRET
    moved = fetched.resources["main_llm"].model_copy(update={"base_url": "http://attacker.invalid/v1"})
    with pytest.raises(StoreError, match=r"resources\.main_llm\.api_key: '<redacted>'"):
        trainer.publish_resources({"main_llm": moved})
    renamed = {"other_llm": fetched.resources["main_llm"]}
    with pytest.raises(StoreError, match=r"resources\.other_llm\.api_key"):
        trainer.publish_resources(renamed)
    assert server.store.get_resources().version == 2, "a refused publish changes nothing"
    # a new key replaces the old one as usual
    trainer.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m", api_key="sk-new-key")})
    assert server.store.get_resources(3).resources["main_llm"].api_key == "sk-new-key"  # type: ignore[union-attr]
    trainer.close()


def test_a_backend_url_carrying_credentials_is_refused_naming_the_field(server: AglServer) -> None:
    """Reads redact ``api_key`` only, so a key inside ``base_url`` would be readable back: refused at the door."""
    body = {"main_llm": {"kind": "llm", "base_url": f"https://user:{SECRET}@api.example/v1", "model": "m"}}
    refused = httpx.post(f"{server.url}/api/resources", json={"resources": body}, headers=bearer(TRAINER), timeout=10)
    assert refused.status_code == 422 and "resources.main_llm.llm.base_url" in refused.text, refused.text
    assert SECRET not in refused.text
    assert "give the key as api_key" in refused.text
    with pytest.raises(ValueError, match="base_url"):
        LLM(base_url="https://token@api.example/v1", model="m")
    with pytest.raises(StoreError):
        server.store.get_resources()  # nothing was published


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://internal/admin?", "query or fragment"),
        ("http://internal/v1#frag", "query or fragment"),
        ("http://0177.0.0.1:1/v1", "not a URL the gateway can call"),
        ("http://10.0.0.300:1/v1", "not a URL the gateway can call"),
        ("http://" + "a" * 64 + "/v1", "is no DNS name"),
        ("http://a..b/v1", "is no DNS name"),
        ("file:///etc/passwd", "http:// or https://"),
    ],
)
def test_a_backend_url_the_gateway_could_not_call_as_a_prefix_is_refused_naming_the_field(
    server: AglServer, url: str, says: str
) -> None:
    """A query or fragment would cut off the paths clients append (``/admin?/chat/completions`` fetches ``/admin``);
    a host httpx cannot parse would fail only at call time, unrecorded: both are refused when published."""
    body = {"main_llm": {"kind": "llm", "base_url": url, "model": "m"}}
    refused = httpx.post(f"{server.url}/api/resources", json={"resources": body}, headers=bearer(TRAINER), timeout=10)
    assert refused.status_code == 422 and "resources.main_llm.llm.base_url" in refused.text, refused.text
    assert says in refused.text
    with pytest.raises(StoreError):
        server.store.get_resources()  # nothing was published
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


# ------------------------------------------------------------------------------------------------- open servers


def test_a_loopback_server_refuses_requests_naming_another_host_as_dns_rebinding_sends_them(tmp_path: Path) -> None:
    """A web page that points its own domain at 127.0.0.1 reaches a loopback server from the user's browser, with
    its domain in the Host header: refused, whatever the path; loopback names (any port) and --allow-host pass."""
    with AglServer(SqliteStore(tmp_path / "s.db"), allow_hosts=["agl.internal"]) as server:
        port = server.port
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example", "10.0.0.1"):
            for path in ("/api/rollouts", "/health", "/api/resources/latest"):
                r = httpx.get(server.url + path, headers={"host": host}, timeout=10)
                assert r.status_code == 403 and "Host header" in r.text and "--allow-host" in r.text, (host, r.text)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "agl.internal:80"):
            assert httpx.get(server.url + "/api/rollouts", headers={"host": host}, timeout=10).status_code == 200
    with AglServer(SqliteStore(tmp_path / "t.db"), host="127.0.0.1", tokens=all_tokens()) as guarded:
        r = httpx.get(guarded.url + "/api/rollouts", headers={"host": "attacker.example", **bearer(READER)}, timeout=10)
        assert r.status_code == 403, "with tokens too: a page must not learn even which paths exist"


def test_the_default_server_makes_a_token_for_its_user_that_local_clients_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agl server` with no tokens: not open. Its trainer token is in a file only the user can read, which agl's
    clients use for loopback URLs; a process without it gets 401; the file goes when the server stops."""
    home = tmp_path / "home"
    env = {**{k: v for k, v in os.environ.items() if k != "AGL_TOKEN"}, "AGL_HOME": str(home)}
    port = free_port()
    cli = [sys.executable, "-m", "agl.cli", "server", "--store", f"sqlite:///{tmp_path / 'd.db'}", "--port", str(port)]
    proc = subprocess.Popen(cli, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        link = re.search(rf"the dashboard: {re.escape(url)}/\?token=(\S+)", lines[1])
        assert "tokens: Tokens(trainer=1)" in lines[0] and link, lines
        token = link.group(1)
        path = home / "servers" / f"loopback-{port}.token"
        assert path.read_text().split()[0] == token and str(path) in lines[1]
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert httpx.get(url + "/api/rollouts", timeout=30).status_code == 401, "another process, no token: refused"
        monkeypatch.setenv("AGL_HOME", str(home))
        monkeypatch.delenv("AGL_TOKEN", raising=False)
        for local in (url, f"http://localhost:{port}"):
            client = HttpStore(local, retry_for=5)
            assert client.list_rollouts() == [], "agl's client found the token of the server on that port"
            client.close()
        runs = subprocess.run(
            [sys.executable, "-m", "agl.cli", "runs", "--store", url], env=env, cwd=REPO, capture_output=True, text=True
        )
        assert runs.returncode == 0, runs.stderr
        path.chmod(0o644)
        with pytest.raises(StoreError, match="HTTP 401"):
            HttpStore(url, retry_for=5).list_rollouts()  # a file others can read is not trusted
        path.chmod(0o600)
    finally:
        proc.terminate()
        proc.wait(30)
    assert not path.exists(), "the token file goes with the server"
    assert token not in server_log_text(proc)


def test_a_default_server_keeps_its_stores_token_across_restarts_until_the_operator_rotates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token of a default server is its store's: a restart on the same store keeps it (a client holding it
    carries on), another store has another one, and ``--rotate-token`` makes a new one that the old one no longer
    opens. A client that took its token from the local file follows the rotation; one given the old token is refused,
    saying so."""
    home = tmp_path / "home"
    monkeypatch.setenv("AGL_HOME", str(home))
    monkeypatch.delenv("AGL_TOKEN", raising=False)
    db, port = tmp_path / "kept.db", free_port()
    url = f"http://127.0.0.1:{port}"

    def token_now() -> str:
        return (home / "servers" / f"loopback-{port}.token").read_text().split()[0]

    proc = start_server(db, port, home=home)
    first = token_now()
    kept = list((home / "stores").iterdir())
    assert len(kept) == 1 and stat.S_IMODE(kept[0].stat().st_mode) == 0o600 and first in kept[0].read_text()
    assert str(db.resolve()) in kept[0].read_text(), "the file says which store it belongs to"
    holder, follower = HttpStore(url, token=first, retry_for=30), HttpStore(url, retry_for=30)
    assert holder.list_rollouts() == [] and follower.list_rollouts() == []
    proc.kill()
    proc.wait(30)
    proc = start_server(db, port, home=home)
    try:
        assert token_now() == first and holder.list_rollouts() == [], "a restart on the same store keeps the token"
    finally:
        proc.terminate()
        proc.wait(30)
    other = start_server(tmp_path / "other.db", port, home=home)
    try:
        assert token_now() != first, "another store has a token of its own"
    finally:
        other.terminate()
        other.wait(30)
    proc = start_server(db, port, "--rotate-token", home=home)
    try:
        assert token_now() != first
        with pytest.raises(StoreError, match="HTTP 401"):
            holder.list_rollouts()
        assert follower.list_rollouts() == [], "a client that took the local file's token takes the new one"
    finally:
        proc.terminate()
        proc.wait(30)
    proc = start_server(db, port, "--token-file", str(_token_file(tmp_path)), home=home)
    try:
        with pytest.raises(StoreError, match=r"it runs with --token-file or AGL_TOKEN \(give this client"):
            HttpStore(url, retry_for=30).list_rollouts()
    finally:
        proc.terminate()
        proc.wait(30)
    holder.close()
    follower.close()


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.txt"
    path.write_text(f"trainer {TRAINER}\n")
    path.chmod(0o600)
    return path


def test_ctrl_c_stops_agl_server_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    port = free_port()
    proc = start_server(tmp_path / "c.db", port)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) in (0, 130)
    said = server_log(tmp_path / "c.db").read_text()
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert said.rstrip().splitlines()[-1] == "agl server: stopped (Ctrl-C)", said


def server_log_text(proc: subprocess.Popen[str]) -> str:
    """What the server printed after its first two lines (the only ones that may show the token)."""
    return proc.stdout.read() if proc.stdout else ""


def test_an_open_server_listens_on_loopback_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--token-file.*AGL_TOKEN"):
        AglServer(SqliteStore(tmp_path / "a.db"), host="0.0.0.0").start()
    env = {k: v for k, v in os.environ.items() if k != "AGL_TOKEN"}
    db = tmp_path / "cli.db"
    cli = [sys.executable, "-m", "agl.cli", "server", "--store", f"sqlite:///{db}", "--host", "0.0.0.0", "--port", "0"]
    done = subprocess.run(cli, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--token-file" in done.stderr and "AGL_TOKEN" in done.stderr and not db.exists()
    with_token = {**env, "AGL_TOKEN": TRAINER}
    unlisted = subprocess.run(cli, env=with_token, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert unlisted.returncode == 2 and not db.exists(), "beyond loopback the backends must be named"
    assert "--allow-backend PATTERN" in unlisted.stderr and "--allow-any-backend" in unlisted.stderr
    pipes: Any = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen([*cli, "--allow-any-backend"], env=with_token, cwd=REPO, **pipes)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        bound = re.search(r"listening on http://0\.0\.0\.0:(\d+) ", line)
        assert bound, line
        port = int(bound.group(1))
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/api/rollouts", timeout=30).status_code == 401
        ok = httpx.get(f"http://127.0.0.1:{port}/api/rollouts", headers=bearer(TRAINER), timeout=30)
        assert ok.status_code == 200 and TRAINER not in line
    finally:
        proc.terminate()
        proc.wait(30)
    assert TRAINER not in (proc.stderr.read() if proc.stderr else "")


def test_a_store_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "private.db")
    store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m", api_key=SECRET)})
    files = sorted(tmp_path.glob("private.db*"))
    assert {f.name for f in files} >= {"private.db", "private.db-wal", "private.db-shm"}
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files), [oct(f.stat().st_mode) for f in files]
    store.close()


# ------------------------------------------------------------------------------------------------- end to end


def test_trainer_and_runner_tokens_run_a_protected_server_end_to_end(
    tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool takes its runner token from AGL_TOKEN, as `agl runner` does; the runner process it spawns has the
    token with its arguments only, never in its own environment block (the agent checks /proc/self/environ)."""
    token_file = tmp_path / "tokens"
    token_file.write_text(f"trainer {TRAINER}\nrunner {RUNNER}\n")
    token_file.chmod(0o600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path / "e2e.db", port, "--token-file", str(token_file))
    monkeypatch.setenv("AGL_TOKEN", RUNNER)
    pool = RunnerPool("tests.test_auth:key_checking_agent", url, 1, start_method="spawn").start()
    assert os.environ["AGL_TOKEN"] == RUNNER, "the pool's own process keeps its environment"
    monkeypatch.delenv("AGL_TOKEN")
    try:
        trainer = agl.Trainer(
            n_runners=1,  # one with the trainer token, one (the pool above) with the runner token
            store=url,
            token=TRAINER,
            resources={"main_llm": LLM(base_url=fake.base_url, model="m", api_key=SECRET)},
            progress=False,
        )
        with trainer:
            batch = trainer.evaluate(key_checking_agent, [{"q": f"q{i}"} for i in range(6)])
            from agl.core.context import TrainContext

            assert trainer._store is not None
            ctx = TrainContext(trainer, trainer._store)
            latest = ctx.latest_resources()
            assert latest.resources["main_llm"].api_key == SECRET, "the trainer fills in keys it published"
            ctx.publish_changes({"prompt": PromptTemplate(template="{q}")})
        assert batch.summary["succeeded"] == 6 and batch.summary["mean_reward"] == 1.0, batch.rollouts
        assert {r.headers["authorization"] for r in fake.requests} == {f"Bearer {SECRET}"}
        stored = SqliteStore(tmp_path / "e2e.db").get_resources()
        assert stored.version == 2 and stored.resources["main_llm"].api_key == SECRET  # type: ignore[union-attr]
    finally:
        pool.stop()
        server.terminate()
        server.wait(30)
    assert SECRET not in server_log(tmp_path / "e2e.db").read_text()


def test_embedded_trainer_runs_its_server_with_tokens(tmp_path: Path, fake: FakeLLM) -> None:
    trainer = agl.Trainer(
        n_runners=1,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": LLM(base_url=fake.base_url, model="m", api_key=SECRET)},
        progress=False,
    )
    with trainer:
        batch = trainer.evaluate(key_checking_agent, [{"q": "a"}, {"q": "b"}])
        assert trainer.server_url is not None
        assert httpx.get(trainer.server_url + "/api/rollouts", timeout=30).status_code == 401
    assert batch.summary["succeeded"] == 2 and batch.summary["mean_reward"] == 1.0
    assert {r.headers["authorization"] for r in fake.requests} == {f"Bearer {SECRET}"}


# ------------------------------------------------------------------------------------------------- serving


def test_policy_server_needs_its_key_and_loads_weights_from_its_root_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agl.serving import PolicyServer, make_tiny_model

    tiny = make_tiny_model(tmp_path / "tiny", seed=0)
    monkeypatch.delenv("AGL_POLICY_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"0\.0\.0\.0 without an api_key"):
        PolicyServer(tiny, seed=0, host="0.0.0.0").start()  # open beyond loopback: refused before it listens
    root = tmp_path / "weights"
    root.mkdir()
    key = "policy-key-0123456789abcdef"
    with PolicyServer(tiny, seed=0, api_key=key, weights_root=root) as policy:
        base = policy.base_url.removesuffix("/v1")
        routes = [(m, r.path) for r in policy._build_app().routes if isinstance(r, APIRoute) for m in r.methods]
        assert len(routes) >= 4
        for method, path in routes:
            for headers in ({}, bearer("wrong-key-0123456789")):
                resp = httpx.request(method, base + path, headers=headers, json={}, timeout=30)
                assert resp.status_code == 401, (method, path, resp.text)
                assert resp.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(base + "/v1/models", headers=bearer(key), timeout=30).status_code == 200

        def load(path: Path) -> httpx.Response:
            body = {"path": str(path), "version": "v1"}
            return httpx.post(base + "/v1/load_weights", json=body, headers=bearer(key), timeout=120)

        outside = make_tiny_model(tmp_path / "outside", seed=1)
        (root / "escape").symlink_to(outside)
        for path in (outside, root / "escape", root / ".." / "outside"):
            resp = load(path)
            assert resp.status_code == 403 and resp.json()["error"]["param"] == "path", resp.text
        assert policy.weights_version == "v0"
        inside = load(make_tiny_model(root / "v1", seed=1))
        assert inside.status_code == 200 and policy.weights_version == "v1"

        # the gateway reaches it with the key published as the LLM's api_key
        with AglServer(SqliteStore(tmp_path / "gw.db"), tokens=all_tokens()) as server:
            server.store.publish_resources({"policy": LLM(base_url=policy.base_url, model="policy", api_key=key)})
            server.store.enqueue([RolloutRequest(task=1)])
            leased = server.store.lease("w")
            assert leased is not None
            ro, at = leased
            gw = f"{server.url}/gw/{ro.rollout_id}/{at.attempt_id}/policy/v1/chat/completions"
            body = {"messages": USER, "max_tokens": 2}
            assert httpx.post(gw, json=body, headers=bearer(TRAINER), timeout=120).status_code == 200
    with PolicyServer(tiny, seed=0) as unrooted:
        resp = httpx.post(f"{unrooted.base_url}/load_weights", json={"path": str(root / "v1"), "version": "v2"})
        assert resp.status_code == 403 and resp.json()["error"]["param"] == "path"


def test_vllm_gets_a_key_through_its_environment_not_its_command_line() -> None:
    from agl.serving.vllm import VllmServer

    server = VllmServer("/models/m", port=8123)
    assert len(server.api_key) >= 32 and server.environment()["VLLM_API_KEY"] == server.api_key
    assert server.api_key not in " ".join(server.command_line)
    assert server.headers == bearer(server.api_key)
    assert VllmServer("/models/m", port=8123).api_key != server.api_key
    assert VllmServer("/models/m", port=8123, api_key="given-key").environment()["VLLM_API_KEY"] == "given-key"


def test_route_roles_name_routes_that_exist(server: AglServer) -> None:
    assert server.app is not None
    assert set(ROUTE_ROLES) <= set(operations(server.app)), "a stale entry in ROUTE_ROLES"


@pytest.mark.parametrize("token", ["not-a-token-of-this-server", READER])
def test_agl_runner_with_a_refused_token_exits_at_once_naming_it(server: AglServer, tmp_path: Path, token: str) -> None:
    """A refused token is not an outage: the runner does not retry it for ``--retry-for``; it gives up at once."""
    log = tmp_path / "runner.log"
    env = {**os.environ, "AGL_TOKEN": token}
    cli = [
        sys.executable,
        "-m",
        "agl.cli",
        "runner",
        "--server",
        server.url,
        "--agent",
        "tests.test_auth:key_checking_agent",
    ]
    with log.open("wb") as err:
        runner = subprocess.Popen(
            [*cli, "--retry-for", "600"], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        assert runner.wait(120) == 1
    finally:
        runner.kill()
        runner.wait(30)
    text = log.read_text()
    assert "refused the runner's token" in text and ("HTTP 401" in text or "HTTP 403" in text), text[-2000:]
    assert token not in text
