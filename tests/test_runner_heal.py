"""Runners that heal: HttpStore retries, runner supervision (Trainer and ``agl runner``), lost attempts for agl's own
outages, hung agents, spans that could not be stored, broken integrations. Real servers on loopback, real processes."""

from __future__ import annotations

import collections
import contextlib
import math
import os
import re
import select
import signal
import socket
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

import agl
from agl.core.integration_scopes import _integrations
from agl.core.outage import agl_side_failure
from agl.core.server import AglServer
from agl.core.store import Store, StoreSettings, StoreUnavailable
from agl.core.store.http import HttpStore
from agl.core.store.sqlite import SqliteStore
from agl.core.types import ATTR_INTEGRATION, HEADER_UNAVAILABLE, LLM, Record, RolloutRequest
from agl.testing import FakeLLM, FakeReply
from tests.server_process import free_port, kill, start_server
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
AGENT = "tests.agents_heal:heal_agent"


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM(lambda body: "ok") as server:
        yield server


def _runner(
    server_url: str, log: Path, *extra: str, agent: str = AGENT, start: str = "forkserver"
) -> subprocess.Popen[bytes]:
    """``agl runner`` as a real process, its stderr (and its workers') going to ``log``; ``start``: how its pool
    starts runners (``AGL_RUNNER_START``)."""
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "agl.cli", "runner", "--server", server_url, "--agent", agent, *extra],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=REPO,
            env={**os.environ, "AGL_RUNNER_START": start},
        )


class BreakingProxy:
    """A TCP proxy on loopback in front of a server that breaks chosen connections mid-request.

    Each new connection takes the next planned fault: ``"before"`` reads the request and closes the connection
    without forwarding it (the server never sees it); ``"after"`` forwards the request and closes the connection
    when the server's answer starts (the request was applied, its answer lost). Unplanned connections are piped.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.faults: collections.deque[str] = collections.deque()
        self.broken = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                fault = self.faults.popleft() if self.faults else None
            threading.Thread(target=self._serve, args=(client, fault), daemon=True).start()

    def _serve(self, client: socket.socket, fault: str | None) -> None:
        with client:
            if fault == "before":
                client.recv(65536)
                with self._lock:
                    self.broken += 1
                return
            with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                while True:
                    readable, _, _ = select.select([client, upstream], [], [], 30)
                    if not readable:
                        return
                    for end in readable:
                        data = end.recv(65536)
                        if not data:
                            return
                        if end is upstream and fault == "after":
                            with self._lock:
                                self.broken += 1
                            return
                        (upstream if end is client else client).sendall(data)

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[AglServer, BreakingProxy]]:
    server = AglServer(SqliteStore(tmp_path / "s.db")).start()
    proxy = BreakingProxy(server.port)
    yield server, proxy
    proxy.close()
    server.stop()
    server.store.close()


# ------------------------------------------------------------------------------------------------ HttpStore


@pytest.mark.slow
def test_http_store_retries_a_read_through_a_server_restart(tmp_path: Path) -> None:
    db, port = tmp_path / "s.db", free_port()
    server = start_server(db, port)
    http = HttpStore(f"http://127.0.0.1:{port}", retry_for=60)
    restarted: list[subprocess.Popen[bytes]] = []
    try:
        http.publish_resources({"m": LLM(base_url="http://127.0.0.1:1/v1", model="m")})
        [ro] = http.enqueue([RolloutRequest(task=1)])
        kill(server)
        restart = threading.Timer(1.0, lambda: restarted.append(start_server(db, port)))
        restart.start()
        began = time.monotonic()
        assert http.get_rollout(ro.rollout_id).status == "queued"
        assert time.monotonic() - began >= 0.5, "the read waited for the restarted server"
        restart.join(60)
        assert [r.rollout_id for r in http.list_rollouts()] == [ro.rollout_id]
    finally:
        http.close()
        for proc in [server, *restarted]:
            kill(proc)


def test_http_store_gives_up_naming_the_server_after_retry_for() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    began = time.monotonic()
    with pytest.raises(StoreUnavailable, match=f"agl server at {url} unavailable for 1s"):
        HttpStore(url, retry_for=1.0).get_resources()
    assert 1.0 <= time.monotonic() - began < 10


def test_http_store_resends_a_read_after_connections_broke_mid_request(
    served: tuple[AglServer, BreakingProxy],
) -> None:
    server, proxy = served
    server.store.publish_resources({"m": LLM(base_url="http://127.0.0.1:1/v1", model="m")})
    proxy.faults.extend(["before", "before"])
    http = HttpStore(proxy.url, retry_for=30)
    assert http.get_resources().version == 1
    assert proxy.broken == 2
    http.close()


def test_http_store_enqueue_whose_answer_was_lost_is_resent_and_applied_once(
    served: tuple[AglServer, BreakingProxy],
) -> None:
    server, proxy = served
    server.store.publish_resources({"m": LLM(base_url="http://127.0.0.1:1/v1", model="m")})
    proxy.faults.extend(["after", "before"])
    http = HttpStore(proxy.url, retry_for=30)
    [ro] = http.enqueue([RolloutRequest(task=1)])
    assert proxy.broken == 2, "the answer was lost once, then the resend broke once more before arriving"
    assert [r.rollout_id for r in server.store.list_rollouts()] == [ro.rollout_id], "one rollout, not two"
    http.close()


def test_http_store_publish_and_record_whose_answer_was_lost_are_applied_once(
    served: tuple[AglServer, BreakingProxy],
) -> None:
    server, proxy = served
    http = HttpStore(proxy.url, retry_for=30)
    proxy.faults.append("after")
    rs = http.publish_resources({"m": LLM(base_url="http://127.0.0.1:1/v1", model="m")})
    assert proxy.broken == 1
    assert rs.version == 1 and server.store.get_resources().version == 1, "no second version was published"
    record = Record(kind="metrics", key="0", data={"reward": 0.5})
    proxy.faults.append("after")
    fresh = HttpStore(proxy.url, retry_for=30)  # a new connection takes the fault
    fresh.add_record(record)
    assert proxy.broken == 2
    assert server.store.list_records("metrics") == [record], "the record was stored once"
    http.close()
    fresh.close()


def test_http_store_resent_completion_that_was_applied_changes_nothing(
    served: tuple[AglServer, BreakingProxy],
) -> None:
    server, proxy = served
    server.store.publish_resources({"m": LLM(base_url="http://127.0.0.1:1/v1", model="m")})
    [ro] = server.store.enqueue([RolloutRequest(task=1)])
    http = HttpStore(proxy.url, retry_for=30)
    leased = http.lease("w")
    assert leased is not None
    attempt = leased[1]
    proxy.faults.append("after")
    new = HttpStore(proxy.url, retry_for=30)  # a new connection takes the fault
    assert new.complete_attempt(attempt.attempt_id, "succeeded", final_reward=1.0) is False
    assert proxy.broken == 1
    done = server.store.get_rollout(ro.rollout_id)
    assert done.status == "succeeded" and done.final_reward == 1.0
    http.close()
    new.close()


# --------------------------------------------------------------------------------------- which failures are agl's


def _failure(base_url: str) -> BaseException:
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=5)
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    except Exception as exc:
        return exc
    raise AssertionError("the call succeeded")


def test_only_failed_requests_to_this_runners_server_count_as_agl_outages() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    refused = _failure(f"{closed}/gw/ro-1/at-1/main_llm/v1")
    assert isinstance(refused, openai.APIConnectionError)
    assert agl_side_failure(refused, closed) is not None
    assert agl_side_failure(refused, f"http://127.0.0.1:{free_port()}") is None, "another host is the agent's"
    try:
        raise ValueError("the agent wrapped it") from refused
    except ValueError as wrapped:
        assert agl_side_failure(wrapped, closed) is not None, "found through the exception chain"
    assert agl_side_failure(ValueError("an agent bug"), closed) is None
    assert agl_side_failure(ExceptionGroup("both", [refused, ValueError("bug")]), closed) is None
    assert agl_side_failure(ExceptionGroup("all", [refused]), closed) is not None

    replies = [FakeReply(status=s, error="the model is down") for s in (502, 503, 504, 500)]
    with FakeLLM(replies) as server:
        root = f"http://127.0.0.1:{server.port}"
        for status in (502, 503, 504, 500):
            failure = _failure(server.base_url)
            assert agl_side_failure(failure, root) is None, f"a backend's {status} (passed on) is not agl's"
    gateway = f"{closed}/gw/ro-1/at-1/main_llm/v1/chat/completions"
    marked = httpx.Response(503, headers={HEADER_UNAVAILABLE: "1"}, request=httpx.Request("POST", gateway))
    with pytest.raises(httpx.HTTPStatusError) as agl_refused:
        marked.raise_for_status()
    assert "HTTP 503" in str(agl_side_failure(agl_refused.value, closed)), "agl's own 503 is an outage"
    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        root = f"http://127.0.0.1:{silent.getsockname()[1]}"
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="x", max_retries=0, timeout=0.3)
        with pytest.raises(openai.APITimeoutError) as timed_out:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert agl_side_failure(timed_out.value, root) is None, "timeouts are the agent's"


# ------------------------------------------------------------------------------------------------ agl runner


def _served_store(tmp_path: Path, fake: FakeLLM, **settings: float) -> AglServer:
    store = SqliteStore(tmp_path / "agl.db", StoreSettings(**settings))
    store.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="fake")})
    return AglServer(store).start()


@pytest.mark.slow
def test_agl_runner_replaces_a_killed_worker_and_finishes_every_rollout(tmp_path: Path, fake: FakeLLM) -> None:
    server = _served_store(tmp_path, fake, heartbeat_timeout=2.0)
    marker = tmp_path / "pid"
    tasks = [{"kind": "hang_once", "marker": str(marker)}] + [{"kind": "calls"} for _ in range(4)]
    ids = [r.rollout_id for r in server.store.enqueue([RolloutRequest(task=t) for t in tasks])]
    log = tmp_path / "runner.log"
    runner = _runner(server.url, log, "-n", "1")
    try:
        wait_for(lambda: marker.exists() and marker.read_text(), 120, "the first attempt to hang")
        os.kill(int(marker.read_text()), signal.SIGKILL)
        rollouts = server.store.wait(ids, timeout=180)
        assert [r.status for r in rollouts] == ["succeeded"] * 5
        assert runner.poll() is None, "agl runner kept running"
        attempts = server.store.list_attempts(ids[0])
        assert attempts[0].status == "lost" and attempts[-1].status == "succeeded"
        assert attempts[0].worker_id != attempts[-1].worker_id, "a new worker process took over"
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(60) == 0, "a stop by signal exits 0"
        assert "died (killed by SIGKILL); starting a new one" in log.read_text()
    finally:
        kill(runner)
        server.stop()


@pytest.mark.slow
def test_agl_runner_exits_nonzero_when_every_worker_dies(tmp_path: Path, fake: FakeLLM) -> None:
    server = _served_store(tmp_path, fake)
    server.store.enqueue([RolloutRequest(task={"kind": "calls"})])
    log = tmp_path / "runner.log"
    runner = _runner(server.url, log, "-n", "2", agent="tests.agents_dying:agent", start="spawn")
    try:
        assert runner.wait(180) == 1
        err = log.read_text()
        assert "died 3 times in a row without finishing a rollout (last: exit code 13)" in err and "giving up" in err
    finally:
        kill(runner)
        server.stop()


def test_agl_runner_exits_nonzero_naming_the_module_when_its_import_kills_the_fork_server(
    tmp_path: Path, fake: FakeLLM
) -> None:
    server = _served_store(tmp_path, fake)
    server.store.enqueue([RolloutRequest(task={"kind": "calls"})])
    log = tmp_path / "runner.log"
    runner = _runner(server.url, log, "-n", "2", agent="tests.agents_dying:agent")
    try:
        assert runner.wait(120) == 1
        err = log.read_text()
        assert "agl runner: the fork server of tests.agents_dying exited (exit code 13), so no runner can start" in err
        assert "Traceback" not in err
    finally:
        kill(runner)
        server.stop()


@pytest.mark.slow
def test_agl_runner_exits_nonzero_when_the_server_stays_away(tmp_path: Path, fake: FakeLLM) -> None:
    port = free_port()
    server = start_server(tmp_path / "gone.db", port)
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "runner.log"
    runner = _runner(url, log, "-n", "2", "--retry-for", "2")
    try:
        wait_for(lambda: _polling(runner, port) >= 2, 60, "both workers to wait on the server for work")
        assert runner.poll() is None, "idle runners wait for work"
        kill(server)
        assert runner.wait(120) == 1
        assert f"could not work with the agl server at {url} for 2s" in log.read_text()
    finally:
        kill(runner)
        kill(server)


def _polling(runner: subprocess.Popen[bytes], port: int) -> int:
    """How many of ``runner``'s worker processes hold a connection to the server on ``port``: an idle worker's lease
    request waits there until work is queued, so a worker that holds one is in its loop, waiting for work."""
    import psutil

    try:
        workers = psutil.Process(runner.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    connected = 0
    for worker in workers:
        with contextlib.suppress(psutil.Error):
            held = worker.net_connections(kind="tcp")
            connected += any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED for c in held)
    return connected


def _read_only(store: Store, on: bool) -> None:
    """Make the store's database refuse every write, as a read-only file or disk does (or accept them again)."""
    assert isinstance(store, SqliteStore)
    with store._lock:
        store._conn.execute(f"PRAGMA query_only={int(on)}")


@pytest.mark.slow
def test_agl_runner_outlives_a_read_only_database_then_gives_up_nonzero(tmp_path: Path, fake: FakeLLM) -> None:
    server = _served_store(tmp_path, fake)
    first = [r.rollout_id for r in server.store.enqueue([RolloutRequest(task={"kind": "calls"}) for _ in range(3)])]
    _read_only(server.store, True)
    log = tmp_path / "runner.log"
    runner = _runner(server.url, log, "-n", "1", "--retry-for", "8")
    try:
        wait_for(lambda: "cannot take writes now" in log.read_text(), 120, "the runner to meet the read-only database")
        assert runner.poll() is None, "the runner outlives a store that fails for less than --retry-for"
        _read_only(server.store, False)
        assert [r.status for r in server.store.wait(first, timeout=120)] == ["succeeded"] * 3
        assert runner.poll() is None
        later = [r.rollout_id for r in server.store.enqueue([RolloutRequest(task={"kind": "calls"})])]
        _read_only(server.store, True)
        assert runner.wait(120) == 1, "a runner that gives up exits non-zero"
        assert f"could not work with the agl server at {server.url} for 8s" in log.read_text()
        _read_only(server.store, False)
        assert server.store.get_rollouts(later)[0].status == "queued", "the rollout waits for the next runner"
    finally:
        kill(runner)
        server.stop()


# ------------------------------------------------------------------------------------------------ Trainer


@pytest.mark.slow
def test_hung_agent_past_attempt_timeout_is_replaced_and_its_rollout_retried(tmp_path: Path, fake: FakeLLM) -> None:
    marker = tmp_path / "pid"
    trainer = agl.Trainer(
        n_runners=1,
        store=f"sqlite:///{tmp_path}/agl.db",
        attempt_timeout=6.0,
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    began = time.monotonic()
    batch = trainer.evaluate(AGENT, [{"kind": "hang_once", "marker": str(marker)}])
    assert time.monotonic() - began < 240
    [ro] = batch.rollouts
    assert ro.status == "succeeded"
    attempts = SqliteStore(tmp_path / "agl.db").list_attempts(ro.rollout_id)
    assert attempts[0].status == "timed_out" and attempts[-1].status == "succeeded"
    assert attempts[0].worker_id != attempts[-1].worker_id, "the hung runner was replaced"
    with pytest.raises(ProcessLookupError):
        os.kill(int(marker.read_text()), 0)  # the hung process is gone


def test_trainer_rollout_timeout_is_finite_by_default(tmp_path: Path) -> None:
    trainer = agl.Trainer(
        store=f"sqlite:///{tmp_path}/agl.db", max_attempts=2, attempt_timeout=100, heartbeat_timeout=5
    )
    assert trainer.rollout_timeout == 2 * (100 + 5) + 60
    assert math.isfinite(agl.Trainer(store=f"sqlite:///{tmp_path}/agl.db").rollout_timeout)
    assert agl.Trainer(store=f"sqlite:///{tmp_path}/agl.db", rollout_timeout=math.inf).rollout_timeout == math.inf


def test_batch_nobody_works_on_ends_after_rollout_timeout(tmp_path: Path, fake: FakeLLM) -> None:
    trainer = agl.Trainer(
        n_runners=0,
        store=f"sqlite:///{tmp_path}/agl.db",
        rollout_timeout=1.5,
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    began = time.monotonic()
    batch = trainer.evaluate(AGENT, [{"kind": "calls"}, {"kind": "calls"}])
    assert 1.5 <= time.monotonic() - began < 30
    assert [r.status for r in batch.rollouts] == ["cancelled", "cancelled"]


@pytest.mark.slow
def test_agent_that_lost_the_gateway_during_a_restart_is_retried_as_a_lost_attempt(
    tmp_path: Path, fake: FakeLLM
) -> None:
    db, port = tmp_path / "srv.db", free_port()
    server = start_server(db, port)
    ready, go, failed = tmp_path / "ready", tmp_path / "go", tmp_path / "failed"
    trainer = agl.Trainer(
        n_runners=1,
        store=f"http://127.0.0.1:{port}",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    result: dict[str, Any] = {}
    run = threading.Thread(
        target=lambda: result.update(
            batch=trainer.evaluate(
                AGENT, [{"kind": "call_after_go", "ready": str(ready), "go": str(go), "failed": str(failed)}]
            )
        )
    )
    run.start()
    try:
        wait_for(ready.exists, 120, "the agent to start")
        kill(server)
        go.write_text("now")
        wait_for(failed.exists, 120, "the agent's call to find the gateway gone")
        server = start_server(db, port)
        run.join(180)
        assert not run.is_alive()
        [ro] = result["batch"].rollouts
        assert ro.status == "succeeded"
        attempts = SqliteStore(db).list_attempts(ro.rollout_id)
        assert [a.status for a in attempts] == ["lost", "succeeded"]
        assert "could not reach agl" in (attempts[0].error or "")
    finally:
        go.write_text("now")
        run.join(60)
        kill(server)


@pytest.mark.slow
def test_spans_the_server_refused_mark_the_attempt_incomplete(tmp_path: Path, fake: FakeLLM) -> None:
    server = AglServer(SqliteStore(tmp_path / "small.db"), max_body_bytes=64 * 1024).start()
    try:
        trainer = agl.Trainer(
            n_runners=1,
            store=server.url,
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            allow_capture_failures=True,
            progress=False,
        )
        batch = trainer.evaluate(AGENT, [{"kind": "big_message", "size": 200_000}, {"kind": "calls"}])
        big, small = batch.rollouts
        assert big.status == "failed" and small.status == "succeeded"
        assert re.search(r"attempt incomplete: .*\d+ spans? could not be stored", big.error or "")
    finally:
        server.stop()


@pytest.mark.slow
def test_integration_whose_activate_raises_is_skipped_with_a_warning_and_a_span(
    tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site"
    dist = site / "agl_broken_integrations-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: agl-broken-integrations\nVersion: 0.1\n")
    broken = {  # named for modules every runner process imports: integrations of frameworks in use are entered
        "json": "tests.agents_heal:activate_raises",
        "csv": "tests.agents_heal:activate_raises_on_enter",
        "uuid": "tests.no_such_integration_module:activate",
    }
    lines = "".join(f"{framework} = {target}\n" for framework, target in broken.items())
    (dist / "entry_points.txt").write_text(f"[agl.integrations]\n{lines}")
    monkeypatch.syspath_prepend(str(site))  # runner processes are spawned with this sys.path
    _integrations.cache_clear()
    trainer = agl.Trainer(
        n_runners=1,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    batch = trainer.evaluate(AGENT, [{"kind": "calls"}, {"kind": "calls"}])
    _integrations.cache_clear()
    assert [r.status for r in batch.rollouts] == ["succeeded", "succeeded"]
    store = SqliteStore(tmp_path / "agl.db")
    for ro in batch.rollouts:
        spans = store.query_spans(rollout_id=ro.rollout_id, kind="exception")
        named = {s.attributes.get(ATTR_INTEGRATION): s.attributes["exception.message"] for s in spans}
        assert set(broken.values()) <= set(named)
        assert named["tests.agents_heal:activate_raises"] == "activate() of this integration is broken"
    err = capfd.readouterr().err
    for target in broken.values():
        assert err.count(f"integration {target} ") == 1, "warned once per runner process"
