"""Server mode at scale: several ``agl server`` processes over one PostgreSQL database (the session's real server,
``tests/conftest.py``), runners spread across them, and one server killed mid-run."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import agl
from agl.core.runner import gateway_resources
from agl.core.runner_pool import RunnerPool
from agl.core.server import AglServer
from agl.core.server.auth import Tokens
from agl.core.store.base import StoreSettings
from agl.core.store.http import HttpStore
from agl.core.store.postgres import PostgresStore
from agl.core.types import LLM, REDACTED, RolloutRequest
from agl.testing import FakeLLM, FakeReply
from tests import agents_basic
from tests.server_process import free_port, kill, server_log, start_server

TRAINER = "trainer-token-0123456789abcdef"
RUNNER = "runner-token-0123456789abcdef"
SECRET = "sk-upstream-SECRET-7f3a9c2e5b1d"


class _Gate:
    """The fake model's calls, held on demand: a held call waits (bounded) until the gate opens again, and the gate
    knows which tasks' questions are parked in it — so the test can kill server B while one of B's attempts is provably
    inside a model call, instead of hoping a sleep lands the kill mid-attempt."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self._lock = threading.Lock()
        self._parked: Counter[str] = Counter()

    def parked(self) -> set[str]:
        with self._lock:
            return {question for question, n in self._parked.items() if n}

    def __call__(self, body: dict[str, Any]) -> str:
        question = body["messages"][-1]["content"].split()[1]  # "draft: q3" / "final: q3 (draft was ...)"
        time.sleep(0.15)  # a model that takes a moment, so that the run lasts until server B's runners are up
        with self._lock:
            self._parked[question] += 1
        try:
            self.open.wait(120)
        finally:
            with self._lock:
                self._parked[question] -= 1
        return f"the answer is {question.upper()}"


#: The name of server B's runner pool: its workers' ids start with it (``RunnerPool`` names them name-slot-id).
POOL_B = "runner-b"


def _on_b(worker_id: str) -> bool:
    return worker_id.startswith(f"{POOL_B}-")


def _b_running_questions(store: PostgresStore) -> set[str]:
    """The questions of the tasks whose attempts server B's runners are running right now."""
    with store.connection() as conn:
        rows = conn.execute("SELECT rollout_id, worker_id FROM attempts WHERE status = 'running'").fetchall()
    tasks = [store.get_rollout(rollout).task for rollout, worker in rows if _on_b(worker)]
    return {str(task["question"]) for task in tasks if isinstance(task, dict)}


def _b_attempts(store: PostgresStore) -> Counter[str]:
    """How many attempts server B's runners have in each status right now."""
    with store.connection() as conn:
        rows = conn.execute("SELECT worker_id, status FROM attempts").fetchall()
    return Counter(status for worker, status in rows if _on_b(worker))


@pytest.mark.slow
def test_two_servers_four_runners_one_server_killed_every_rollout_completes(tmp_path: Path, postgres_url: str) -> None:
    """2 servers over one database, 2 runners on each, the trainer enqueueing through server A; server B is SIGKILLed
    while one of its runners' attempts is held inside a model call.

    What happens: B's runners can no longer heartbeat or report, so their attempts go stale; server A reaps them
    (``lease`` and ``wait`` reap, by the heartbeat timeout stored in the database) and its runners run them again.
    Every rollout must succeed with a complete trajectory (two calls with token ids, the reward where it landed), and
    no span may be stored twice.
    """
    db = PostgresStore(postgres_url, StoreSettings(heartbeat_timeout=2.0, attempt_timeout=120.0))
    port_a, port_b = free_port(), free_port()
    server_a = start_server(tmp_path / "a", port_a, store=postgres_url)
    server_b = start_server(tmp_path / "b", port_b, store=postgres_url)
    pool_b: RunnerPool | None = None
    tasks = [{"id": f"t{i}", "question": f"q{i}", "answer": f"Q{i}", "stream": i % 2 == 1} for i in range(32)]
    result: dict[str, Any] = {}
    gate = _Gate()
    with FakeLLM(gate) as fake:
        trainer = agl.Trainer(
            n_runners=2,
            store=f"http://127.0.0.1:{port_a}",
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            max_attempts=3,
            progress=False,
        )

        def run() -> None:
            try:
                result["batch"] = trainer.evaluate(agents_basic.two_call_agent, tasks)
            except Exception as exc:
                result["error"] = exc

        try:
            pool_b = RunnerPool(agents_basic.two_call_agent, f"http://127.0.0.1:{port_b}", 2, name=POOL_B).start()
            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            deadline, on_b = time.monotonic() + 180, Counter[str]()
            while time.monotonic() < deadline and "error" not in result and not on_b["succeeded"]:
                on_b = _b_attempts(db)
                time.sleep(0.02)
            assert on_b["succeeded"], f"server B's runners finished a rollout: {result.get('error')!r}"
            gate.open.clear()  # every model call now waits: B's next attempt stops inside one
            held: set[str] = set()
            while time.monotonic() < deadline and not held:
                held = _b_running_questions(db) & gate.parked()
                time.sleep(0.02)
            assert held, "one of server B's attempts is held inside a model call"
            kill(server_b)
            gate.open.set()
            killed_at = time.monotonic()
            worker.join(300)
            assert not worker.is_alive(), "the run finished"
            assert time.monotonic() - killed_at > 1.0, "the run outlived the kill (the kill was mid-run)"
        finally:
            trainer.close()
            if pool_b is not None:
                pool_b.stop(timeout=5)
            kill(server_b)
            kill(server_a)
    assert "error" not in result, f"the run raised: {result.get('error')!r}\n{server_log(tmp_path / 'a').read_text()}"
    batch: agl.RolloutBatch = result["batch"]
    assert [r.status for r in batch.rollouts] == ["succeeded"] * 32, [r.error for r in batch.rollouts]
    assert batch.failures == []
    for traj in batch.trajectories:
        assert len(traj.transitions) == 2 and all(t.response_ids for t in traj.transitions)
        assert [t.reward for t in traj.transitions] == [0.2, 0.0]

    # what the database holds: every attempt of server B's runners cut by the kill was reaped and retried
    attempts = [a for r in batch.rollouts for a in db.list_attempts(r.rollout_id)]
    cut = [a for a in attempts if a.status == "lost"]
    assert cut, "the kill cut attempts in flight"
    assert all(_on_b(a.worker_id) for a in cut), "only server B's runners lost attempts"
    assert any(_on_b(a.worker_id) for a in attempts if a.status == "succeeded"), "B's runners worked before the kill"
    spans = db.query_spans()
    ids = [s.span_id for s in spans]
    assert len(ids) == len(set(ids)), "no span stored twice"
    for ro in batch.rollouts:
        [final] = [a for a in db.list_attempts(ro.rollout_id) if a.status == "succeeded"]
        mine = [s for s in spans if s.attempt_id == final.attempt_id]
        kinds = Counter(s.kind for s in mine)
        assert kinds["llm"] == 2 and kinds["reward"] >= 1, (ro.rollout_id, kinds)
        llm_sequences = sorted(s.sequence for s in mine if s.kind == "llm")
        assert len(set(llm_sequences)) == 2 and all(llm_sequences), "both calls, each once, numbered"
    db.close()


def test_server_with_tokens_over_postgres(postgres_url: str) -> None:
    """Roles, redacted keys (and the previous key kept on a redacted republish) and per-attempt gateway keys work the
    same over a PostgreSQL store: none of it lives in the store."""
    store = PostgresStore(postgres_url)
    with (
        FakeLLM(lambda body: FakeReply(content="four")) as fake,
        AglServer(store, tokens=Tokens([("trainer", TRAINER), ("runner", RUNNER)])) as server,
    ):
        trainer, runner = HttpStore(server.url, token=TRAINER), HttpStore(server.url, token=RUNNER)
        trainer.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="m", api_key=SECRET)})
        again = trainer.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="m", api_key=REDACTED)})
        assert again.version == 2 and again.resources["main_llm"].api_key == REDACTED  # type: ignore[union-attr]
        assert store.get_resources(2).resources["main_llm"].api_key == SECRET, "the stored key was kept"  # type: ignore[union-attr]
        trainer.enqueue([RolloutRequest(task={"q": 1})])
        ro, at = runner.lease("w1")  # type: ignore[misc]
        key = runner.attempt_key(at.attempt_id)
        llm = gateway_resources(runner.get_resources(ro.resources_version).resources, server.url, ro, at, key)[
            "main_llm"
        ]
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+2"}])
        assert reply.choices[0].message.content == "four"
        assert fake.requests[-1].headers["authorization"] == f"Bearer {SECRET}"
        assert runner.complete_attempt(at.attempt_id, "succeeded", final_reward=1.0)
        server.flush()
        [span] = store.query_spans(attempt_id=at.attempt_id, kind="llm")
        assert SECRET not in span.model_dump_json()
        publish = {"resources": {"p": {"kind": "prompt_template", "template": "{q}"}}}
        denied = httpx.post(f"{server.url}/api/resources", json=publish, headers={"authorization": f"Bearer {RUNNER}"})
        assert denied.status_code == 403
        assert httpx.get(f"{server.url}/api/rollouts", timeout=10).status_code == 401
        trainer.close()
        runner.close()
    store.close()


def test_agl_server_serves_a_postgres_store_and_hides_its_password(tmp_path: Path, postgres_url: str) -> None:
    """``agl server --store postgresql://...``: the URL printed without its password; the schema made once."""
    with_password = postgres_url.replace("agl@", "agl:not-checked-pw@", 1)  # trust authentication ignores it
    port = free_port()
    server = start_server(tmp_path / "pg", port, store=with_password)
    try:
        store = HttpStore(f"http://127.0.0.1:{port}", retry_for=5)
        store.publish_resources({"p": agl.PromptTemplate(template="{q}")})
        [ro] = store.enqueue([RolloutRequest(task={"q": 1})])
        store.close()
    finally:
        kill(server)
    log = server_log(tmp_path / "pg").read_text()
    assert "not-checked-pw" not in log and "agl:***@127.0.0.1" in log, log
    direct = PostgresStore(postgres_url)
    assert direct.get_rollout(ro.rollout_id).status == "queued"
    direct.close()
    assert os.path.exists(tmp_path / "pg.server.log")


def test_embedded_trainer_over_a_postgres_store_serves_it_to_its_runners(postgres_url: str) -> None:
    """``Trainer(store="postgresql://...")`` runs the server in its process over the database, like SQLite."""
    gate = _Gate()
    with FakeLLM(gate) as fake:
        trainer = agl.Trainer(
            n_runners=2,
            store=postgres_url,
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            progress=False,
        )
        tasks = [{"id": f"t{i}", "question": f"q{i}", "answer": f"Q{i}"} for i in range(4)]
        batch = trainer.evaluate(agents_basic.two_call_agent, tasks)
    assert [r.status for r in batch.rollouts] == ["succeeded"] * 4
    assert all(len(t.transitions) == 2 and t.transitions[0].response_ids for t in batch.trajectories)
    stored = PostgresStore(postgres_url)
    assert len(stored.query_spans(kind="llm")) == 8
    stored.close()
