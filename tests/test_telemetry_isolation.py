"""One framework's telemetry never sees another's data: a runner enters only the integrations of the frameworks its
agent uses, and switches off what those frameworks send to their vendors on their own.

Rollouts run in real runner processes (``RunnerPool``, which the Trainer and ``agl runner`` both supervise through;
real framework packages; FakeLLM over HTTP) whose environment routes any outbound HTTP(S) through a recording proxy
on loopback, which is also the OTLP endpoint: an export to CrewAI's telemetry service, OpenAI's trace ingest or an
OTLP collector configured from the environment would reach it. Requests to loopback (the agl server, FakeLLM) go
direct. ``PYTHONPROFILEIMPORTTIME`` makes the runner processes log every module they import.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.core.integration_scopes import late_import_error, resolve_integrations
from agl.core.runner import AgentFn
from agl.core.runner_pool import RunnerPool
from agl.core.server import AglServer
from agl.core.store.sqlite import SqliteStore
from agl.core.telemetry import quiet_framework_telemetry
from agl.core.types import LLM, Rollout, RolloutRequest, Span
from agl.testing import FakeLLM
from tests import agents_autogen, agents_openai_agents, agents_telemetry
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
PROBE = "telemetry.probe"

#: Switches a test environment may carry (tests/agents_crewai.py sets some in the pytest process): runner processes
#: here start without them, so only agl's own defaults are in force.
_SCRUBBED = (
    "AGL_KEEP_FRAMEWORK_TELEMETRY",
    "CREWAI_DISABLE_TELEMETRY",
    "CREWAI_DISABLE_TRACKING",
    "CREWAI_TRACING_ENABLED",
    "OTEL_SDK_DISABLED",
    "OPENAI_AGENTS_DISABLE_TRACING",
    "AUTOGEN_DISABLE_RUNTIME_TRACING",
    "LANGSMITH_TRACING",
    "LANGCHAIN_TRACING_V2",
)


class _Recorder(BaseHTTPRequestHandler):
    """Records every request; refuses proxy tunnels (so a TLS export fails at once), accepts everything else."""

    server: _Receiver

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.seen.append(f"{self.command} {self.path}")

    def do_CONNECT(self) -> None:
        self._record()
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.close_connection = True

    def _ok(self) -> None:
        self._record()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _ok


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _outbound_env(receiver: _Receiver) -> dict[str, str]:
    """Every outbound HTTP(S) request and OTLP export to ``receiver``; loopback direct."""
    env = {name: receiver.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
    env.update({name.lower(): value for name, value in env.items()})
    env.update(
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OPENAI_API_KEY="sk-agl-test",  # the OpenAI Agents SDK's exporter sends traces when it has a key
        CREWAI_TESTING="true",  # no first-run prompt; CrewAI's telemetry does not read it
    )
    return env


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Receiver]:
    """The recording proxy / OTLP endpoint, and this process's environment set up for the runners it spawns."""
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    for name in _SCRUBBED:
        monkeypatch.delenv(name, raising=False)
    for name, value in _outbound_env(server).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # spawned runners inherit it; this process is running
    # a fresh interpreter per runner, so its import log shows every module it imported (a runner forked from the
    # fork server starts with agl's runner side already imported: test_runner_lifecycle checks what it holds)
    monkeypatch.setenv("AGL_RUNNER_START", "spawn")
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Finished:
    """Rollouts one runner process ran, what it logged, and how long it took to exit once asked to stop."""

    store: SqliteStore
    rollouts: list[Rollout]
    log: str
    shutdown_s: float

    def spans(self, rollout: Rollout, kind: str | None = None) -> list[Span]:
        """The spans of the rollout's last attempt."""
        last = self.store.list_attempts(rollout.rollout_id)[-1].attempt_id
        return [s for s in self.store.query_spans(rollout_id=rollout.rollout_id, kind=kind) if s.attempt_id == last]

    def probe(self, rollout: Rollout) -> dict[str, Any]:
        [span] = [s for s in self.spans(rollout, "custom") if s.name == PROBE]
        return dict(span.attributes["agl.object"])

    def imported(self, prefix: str) -> list[str]:
        """Modules named ``prefix`` or under it that the runner process imported (from its import-time log)."""
        names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", self.log, re.MULTILINE)
        return sorted({n for n in names if n == prefix or n.startswith(prefix + ".")})


def run_runner(
    tmp: Path,
    capfd: pytest.CaptureFixture[str],
    fake: FakeLLM,
    agent: AgentFn | str,
    tasks: list[dict[str, Any]],
    integrations: Sequence[str] = (),
) -> Finished:
    """Run ``tasks`` on one runner process for ``agent``; stop it once they are done."""
    store = SqliteStore(tmp / "agl.db")
    store.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="fake")})
    empty_looks: list[str] = []  # leases that found the queue empty
    lease = store.lease

    def lease_and_record(worker_id: str) -> Any:
        got = lease(worker_id)
        if got is None:
            empty_looks.append(worker_id)
        return got

    store.lease = lease_and_record  # type: ignore[method-assign]
    server = AglServer(store).start()
    try:
        ids = [r.rollout_id for r in store.enqueue([RolloutRequest(task=t) for t in tasks])]
        pool = RunnerPool(agent, server.url, 1, integrations=integrations).start()
        try:
            rollouts = store.wait(ids, timeout=240)
            looked = len(empty_looks)
            wait_for(lambda: len(empty_looks) > looked, 60, "the worker to be back to asking for work")
            asked = time.monotonic()
            pool.stop(timeout=60)
            shutdown_s = time.monotonic() - asked
        finally:
            pool.stop(timeout=1)
    finally:
        server.stop()
    return Finished(SqliteStore(tmp / "agl.db"), rollouts, capfd.readouterr().err, shutdown_s)


def _quiet(receiver: _Receiver, finished: Finished) -> None:
    assert receiver.seen == [], f"telemetry left the runner: {receiver.seen[:5]}"
    # an exporter that cannot reach its service holds the process for its timeout at exit (OpenTelemetry's OTLP
    # exporters: 10 s); a quiet runner stops in under a second, 2.6 s measured on 2 cores beside a 12 GB training job
    assert finished.shutdown_s < 5.0, f"the runner took {finished.shutdown_s:.1f}s to stop"


def _autogen_tasks() -> list[dict[str, Any]]:
    return [{"id": "t0", "a": 1, "b": 10, "mode": "run"}, {"id": "t1", "a": 2, "b": 20, "mode": "stream"}]


def _captured_autogen(done: Finished, rollout: Rollout) -> bool:
    """The rollout's AutoGen calls were captured: 5 gateway spans tagged with their agents, and the agents' spans."""
    tagged = sorted(s.agent or "" for s in done.spans(rollout, "llm"))
    agents = sorted(s.name for s in done.spans(rollout, "agent"))
    return tagged == ["critic", "researcher", "solver", "solver", "writer"] and agents == sorted(set(tagged))


@pytest.mark.slow
def test_autogen_rollout_imports_no_other_framework_and_exports_nothing(
    tmp_path: Path, receiver: _Receiver, capfd: pytest.CaptureFixture[str]
) -> None:
    with FakeLLM(agents_autogen.reply) as fake:  # the agent as the Trainer sends it: a function (pickled)
        done = run_runner(tmp_path, capfd, fake, agents_autogen.autogen_agent, _autogen_tasks())
    assert [r.status for r in done.rollouts] == ["succeeded", "succeeded"]
    assert all(_captured_autogen(done, r) for r in done.rollouts)
    assert done.imported("autogen_core"), "the import log works"
    assert done.imported("crewai") == [], "an AutoGen runner never imports CrewAI"
    assert done.imported("agents") == [] and done.imported("langchain_core") == []
    _quiet(receiver, done)


@pytest.mark.slow
def test_crewai_rollout_is_captured_with_crewai_telemetry_off(
    tmp_path: Path, receiver: _Receiver, capfd: pytest.CaptureFixture[str]
) -> None:
    with FakeLLM(agents_telemetry.reply) as fake:
        done = run_runner(tmp_path, capfd, fake, "tests.agents_telemetry_crewai:crewai_agent", [{"id": "t0"}])
    [rollout] = done.rollouts
    assert rollout.status == "succeeded" and rollout.final_reward == 1.0
    [llm] = done.spans(rollout, "llm")
    assert llm.agent == agents_telemetry.CREW_ROLE, "the gateway's span is tagged from CrewAI's capture"
    assert [s.name for s in done.spans(rollout, "agent")] == [agents_telemetry.CREW_ROLE]
    assert done.probe(rollout) == {"crewai_telemetry_ready": False, "crewai_provider_is_global": False}
    assert done.imported("crewai") and done.imported("autogen_core") == []
    _quiet(receiver, done)


@pytest.mark.slow
def test_openai_agents_rollout_is_captured_without_the_sdk_export(
    tmp_path: Path, receiver: _Receiver, capfd: pytest.CaptureFixture[str]
) -> None:
    tasks = [{"id": "t0", "a": 1, "b": 10, "mode": "sync"}, {"id": "t1", "a": 2, "b": 20, "mode": "async"}]
    with FakeLLM(agents_openai_agents.reply) as fake:
        done = run_runner(tmp_path, capfd, fake, "tests.agents_openai_agents:openai_agents_agent", tasks)
    assert [r.status for r in done.rollouts] == ["succeeded", "succeeded"]
    for rollout in done.rollouts:
        agents = {s.name for s in done.spans(rollout, "agent")}
        assert agents == {"researcher", "writer", "triage", "solver"}, "the SDK's spans reached agl"
    assert done.imported("crewai") == [] and done.imported("autogen_core") == []
    _quiet(receiver, done)


@pytest.mark.slow
def test_user_tracer_provider_is_left_in_place(
    tmp_path: Path, receiver: _Receiver, capfd: pytest.CaptureFixture[str]
) -> None:
    with FakeLLM(agents_autogen.reply) as fake:
        done = run_runner(tmp_path, capfd, fake, "tests.agents_telemetry_otel:user_otel_agent", _autogen_tasks()[:1])
    [rollout] = done.rollouts
    assert rollout.status == "succeeded" and _captured_autogen(done, rollout)
    probe = done.probe(rollout)
    assert probe["user_provider_is_global"] is True
    assert any(name.startswith("invoke_agent") for name in probe["spans"]), "AutoGen's own spans reach the user"
    _quiet(receiver, done)


@pytest.mark.slow
def test_framework_imported_inside_the_agent_is_never_a_silent_success(
    tmp_path: Path, receiver: _Receiver, capfd: pytest.CaptureFixture[str]
) -> None:
    with FakeLLM(agents_autogen.reply) as fake:
        done = run_runner(tmp_path, capfd, fake, "tests.agents_telemetry:lazy_autogen_agent", _autogen_tasks())
    assert [r.status for r in done.rollouts] == ["succeeded", "succeeded"]
    attempts = [a for r in done.rollouts for a in done.store.list_attempts(r.rollout_id)]
    [lost] = [a for a in attempts if a.status != "succeeded"]
    assert lost.status == "lost" and lost.number == 1, "the first attempt, which imported AutoGen, runs again"
    assert late_import_error(["autogen_core"]) in (lost.error or "")
    assert len(attempts) == 3 and all(_captured_autogen(done, r) for r in done.rollouts), "captured from then on"
    assert "was first imported while the agent ran" in done.log, "the runner's log says so"
    _quiet(receiver, done)


@pytest.mark.slow
def test_declared_integration_captures_a_framework_imported_inside_the_agent(
    tmp_path: Path, receiver: _Receiver, capfd: pytest.CaptureFixture[str]
) -> None:
    with FakeLLM(agents_autogen.reply) as fake:
        agent = "tests.agents_telemetry:lazy_autogen_agent"
        done = run_runner(tmp_path, capfd, fake, agent, _autogen_tasks()[:1], integrations=["autogen"])
    [rollout] = done.rollouts
    assert [a.status for a in done.store.list_attempts(rollout.rollout_id)] == ["succeeded"]
    assert _captured_autogen(done, rollout)
    assert done.imported("crewai") == []
    _quiet(receiver, done)


def test_crewai_imported_before_agl_gets_its_telemetry_switched_off_on_activation(receiver: _Receiver) -> None:
    """A process where crewai was imported with its telemetry on (as in a runner that re-imports a trainer script's
    ``__main__``): installing the integration turns it off, and OpenTelemetry spans of other libraries (AutoGen's)
    no longer reach CrewAI's exporter, so the process neither sends them nor waits on them at exit."""
    script = """
import json, sys, time
import crewai
from crewai.telemetry import Telemetry
from opentelemetry import trace
before = {"ready": Telemetry().ready, "global": trace.get_tracer_provider() is Telemetry().provider}
import agl.integrations.crewai as integration
integration.install()
for i in range(20):  # what AutoGen's agents and tools record on the global provider
    with trace.get_tracer("autogen").start_as_current_span(f"invoke_agent a{i}"):
        pass
print(json.dumps({"before": before, "ready": Telemetry().ready}), flush=True)
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"before": {"ready": True, "global": True}, "ready": False}
    assert [s for s in receiver.seen if "telemetry.crewai.com" in s] == [], "no span reached CrewAI's service"


def test_framework_switches_are_defaults_and_can_be_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREWAI_DISABLE_TELEMETRY", raising=False)
    monkeypatch.delenv("AGL_KEEP_FRAMEWORK_TELEMETRY", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    assert quiet_framework_telemetry() == {"CREWAI_DISABLE_TELEMETRY": "true"}
    assert os.environ["CREWAI_DISABLE_TELEMETRY"] == "true" and "OTEL_SDK_DISABLED" not in os.environ
    monkeypatch.setenv("CREWAI_DISABLE_TELEMETRY", "false")  # the user's own choice stays
    assert quiet_framework_telemetry() == {} and os.environ["CREWAI_DISABLE_TELEMETRY"] == "false"
    monkeypatch.delenv("CREWAI_DISABLE_TELEMETRY")
    monkeypatch.setenv("AGL_KEEP_FRAMEWORK_TELEMETRY", "1")
    assert quiet_framework_telemetry() == {} and "CREWAI_DISABLE_TELEMETRY" not in os.environ


def test_openai_agents_default_exporter_is_removed_unless_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.tracing import get_trace_provider
    from agents.tracing.processors import default_processor

    from agl.integrations import openai_agents

    def processors() -> tuple[Any, ...]:
        return tuple(get_trace_provider()._multi_processor._processors)  # type: ignore[attr-defined]

    monkeypatch.setenv("AGL_KEEP_FRAMEWORK_TELEMETRY", "1")
    get_trace_provider().register_processor(default_processor())
    openai_agents.install()
    assert default_processor() in processors() and openai_agents._PROCESSOR in processors()
    monkeypatch.delenv("AGL_KEEP_FRAMEWORK_TELEMETRY")
    openai_agents.install()
    assert default_processor() not in processors() and openai_agents._PROCESSOR in processors()


def test_declared_integrations_are_checked_by_name() -> None:
    assert resolve_integrations(["autogen", "crewai", "openai_agents", "langchain"]) == (
        "autogen_core",
        "crewai",
        "agents",
        "langchain_core",
    )
    assert resolve_integrations(["agents", "openai_agents"]) == ("agents",)
    with pytest.raises(ValueError, match=r"unknown 'crew'; installed: .*crewai"):
        resolve_integrations(["crew"])
    with pytest.raises(ValueError, match="unknown 'nope'"):
        agl.Trainer(n_runners=0, integrations=["nope"])
