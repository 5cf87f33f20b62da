"""Fault suite: a real `agl server` process killed with SIGKILL and restarted while runners and gateway calls are live.

What must hold: a gateway call the agent saw answered is in the store whatever happens to the server afterwards, and a
rollout caught by a server crash either succeeds with everything training needs or fails naming the fault, never a
silent partial success.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import agl
from agl.core.store.http import HttpStore
from agl.core.store.sqlite import SqliteStore
from agl.core.types import ATTR_RESPONSE_IDS, HEADER_SEQUENCE, RolloutRequest
from agl.testing import FakeLLM
from tests import agents_basic
from tests.server_process import REPO, free_port, kill, start_server

pytestmark = pytest.mark.slow


def _call(client: httpx.Client, url: str, text: str, sequence: int, stream: bool) -> str:
    """One chat completion through the gateway, read to its end as an agent would; returns the reply's text."""
    body = {"model": "fake", "messages": [{"role": "user", "content": text}], "stream": stream}
    headers = {HEADER_SEQUENCE: str(sequence)}
    if not stream:
        resp = client.post(url, json=body, headers=headers)
        resp.raise_for_status()
        return str(resp.json()["choices"][0]["message"]["content"])
    parts = []
    with client.stream("POST", url, json=body, headers=headers) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def test_every_answered_gateway_call_survives_a_kill_9_of_the_server(tmp_path: Path) -> None:
    """Three rounds of: two calls answered (one streamed), then SIGKILL at once. Every answered call is stored."""
    db = tmp_path / "agl.db"
    port = free_port()
    answered: list[tuple[int, str]] = []
    with FakeLLM(lambda body: f"reply to {body['messages'][-1]['content']}") as fake:
        server = start_server(db, port)
        try:
            store = HttpStore(f"http://127.0.0.1:{port}")
            store.publish_resources({"main_llm": agl.LLM(base_url=fake.base_url, model="fake")})
            store.enqueue([RolloutRequest(task={"q": "kill"})])
            leased = store.lease("fault-worker")
            assert leased is not None
            rollout, attempt = leased
            store.close()
            url = f"http://127.0.0.1:{port}/gw/{rollout.rollout_id}/{attempt.attempt_id}/main_llm/v1/chat/completions"
            for round_ in range(3):
                with httpx.Client(timeout=30) as client:
                    for k, stream in enumerate((False, True)):
                        seq = 1 + 2 * round_ + k
                        text = _call(client, url, f"call {seq}", seq, stream)
                        answered.append((seq, text))
                kill(server)
                server = start_server(db, port)
        finally:
            kill(server)
    spans = SqliteStore(db).query_spans(attempt_id=attempt.attempt_id, kind="llm")
    stored = sorted((s.sequence, s.attributes["gen_ai.output.messages"][0]["content"]) for s in spans)
    assert stored == sorted(answered), "every answered call is in the store, once"
    assert all(s.status == "ok" and s.attributes.get(ATTR_RESPONSE_IDS) for s in spans)


def test_a_server_crash_mid_run_leaves_no_silent_partial_rollout(tmp_path: Path) -> None:
    """SIGKILL the server while 2 runners work through 16 two-call rollouts, restart it 1.5 s later.

    Every rollout must succeed (an attempt cut by the crash is retried as lost), with both of its calls carrying
    exact token ids and its reward where it landed (the capture check would raise on a silently partial one).
    """
    db = tmp_path / "agl.db"
    port = free_port()
    with FakeLLM(lambda body: f"the answer is {body['messages'][-1]['content'].split()[-1].upper()}") as fake:
        server = start_server(db, port)
        trainer = agl.Trainer(
            n_runners=2,
            store=f"http://127.0.0.1:{port}",
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            progress=False,
        )
        tasks = [{"id": f"t{i}", "question": f"q{i}", "answer": f"Q{i}", "stream": i % 2 == 1} for i in range(16)]
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["batch"] = trainer.evaluate(agents_basic.two_call_agent, tasks)
            except Exception as exc:
                result["error"] = exc

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        try:
            deadline = time.monotonic() + 120
            while len(fake.requests) < 8 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(fake.requests) >= 8, "the run got going"
            kill(server)
            time.sleep(1.5)
            server = start_server(db, port)
            worker.join(300)
            assert not worker.is_alive(), "the run finished"
        finally:
            trainer.close()
            kill(server)
    assert "error" not in result, f"the run raised: {result.get('error')!r}"
    batch: agl.RolloutBatch = result["batch"]
    assert len(batch.rollouts) == 16 and all(r.finished for r in batch.rollouts)
    assert batch.failures == []
    assert [r.status for r in batch.rollouts] == ["succeeded"] * 16, [r.error for r in batch.rollouts]
    for traj in batch.trajectories:
        assert len(traj.transitions) == 2 and all(t.response_ids for t in traj.transitions)
        assert [t.reward for t in traj.transitions] == [0.2, 0.0]


AGENT = "tests.agents_heal:heal_agent"


def _slow_reply(body: dict[str, Any]) -> str:
    time.sleep(0.1)  # so that the kill lands mid-run
    return "ok"


def test_a_default_server_killed_and_restarted_keeps_the_clients_started_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agl server` with no flags (its store's token), SIGKILLed while `agl runner -n 2` works through 30 two-call
    rollouts, restarted on the same store 3 s later: the runners and the trainer's HttpStore started before the kill
    carry on with no token copied by hand, every rollout succeeds and every call its agent saw answered is stored."""
    home = tmp_path / "home"
    monkeypatch.setenv("AGL_HOME", str(home))
    monkeypatch.delenv("AGL_TOKEN", raising=False)
    db = tmp_path / "agl.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "runner.log"
    env = {**{k: v for k, v in os.environ.items() if k != "AGL_TOKEN"}, "AGL_HOME": str(home)}
    with FakeLLM(_slow_reply) as fake:
        server = start_server(db, port, home=home)
        store = HttpStore(url, retry_for=60)
        runner: subprocess.Popen[bytes] | None = None
        try:
            assert httpx.get(url + "/api/rollouts", timeout=10).status_code == 401, "not open: it has a token"
            store.publish_resources({"main_llm": agl.LLM(base_url=fake.base_url, model="fake")})
            ids = [r.rollout_id for r in store.enqueue([RolloutRequest(task={"kind": "calls"}) for _ in range(30)])]
            with log.open("wb") as err:
                runner = subprocess.Popen(
                    [sys.executable, "-m", "agl.cli", "runner", "--server", url, "-n", "2", "--agent", AGENT],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    cwd=REPO,
                    env=env,
                )
            deadline = time.monotonic() + 120
            while len(fake.requests) < 10 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(fake.requests) >= 10, "the run got going"
            kill(server)
            time.sleep(3)
            server = start_server(db, port, home=home)
            rollouts = store.wait(ids, timeout=240)
            assert [r.status for r in rollouts] == ["succeeded"] * 30, log.read_text()[-3000:]
            assert runner.poll() is None, "the runners started before the kill are still working"
            assert "HTTP 401" not in log.read_text() and "token" not in log.read_text()
        finally:
            if runner is not None:
                kill(runner)
            store.close()
            kill(server)
    stored = SqliteStore(db)
    for rollout_id in ids:
        last = stored.list_attempts(rollout_id)[-1]
        spans = stored.query_spans(attempt_id=last.attempt_id, kind="llm")
        assert sorted(s.status for s in spans) == ["ok", "ok"], "both calls of the attempt that succeeded are stored"
