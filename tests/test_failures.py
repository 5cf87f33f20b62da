"""The failure taxonomy on rollouts a real Trainer run stored: each kind produced by a real agent, runners and the
gateway in front of the fake LLM, then classified from the SQLite store alone; and ``agl runs --failures``."""

from __future__ import annotations

import _thread
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.cli import main
from agl.core.failures import FAILURE_KINDS, failure_breakdown, rollout_failure
from agl.core.store.sqlite import SqliteStore
from agl.testing import FakeLLM, FakeReply
from tests import agents_failures

KINDS = ["ok", *FAILURE_KINDS]


def _reply(body: dict[str, Any]) -> FakeReply:
    if body["messages"][-1]["content"] == "task llm_error":
        return FakeReply(status=500, error="backend overloaded")
    return FakeReply(content="fine")


@pytest.fixture(scope="module")
def failed_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A store holding one rollout per task kind, run by a real Trainer (2 runners, 1 try each)."""
    folder = tmp_path_factory.mktemp("failures")
    with FakeLLM(_reply) as fake:
        trainer = agl.Trainer(
            n_runners=2,
            store=f"sqlite:///{folder}/agl.db",
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            max_attempts=1,
            heartbeat_timeout=3.0,
            attempt_timeout=6.0,
            allow_capture_failures=True,
            progress=False,
        )
        with trainer:
            tasks = [{"id": kind, "kind": kind, "direct_url": fake.base_url} for kind in KINDS if kind != "cancelled"]
            batch = trainer.evaluate(agents_failures.failing_agent, tasks)
            ids = {r.task_id or "": r.rollout_id for r in batch.rollouts}
            ids["cancelled"] = _interrupted_batch(trainer, fake.base_url)
    yield folder / "agl.db", ids


def _interrupted_batch(trainer: agl.Trainer, base_url: str) -> str:
    """Run a batch whose agent hangs and interrupt it as Ctrl-C does (KeyboardInterrupt in the main thread) once its
    rollout is running; returns the rollout's id.

    Python's own Ctrl-C handler is put in place for the batch: a process a non-interactive shell starts in the
    background (``cmd &``, as a CI job may) inherits SIGINT ignored, and ``interrupt_main`` then does nothing."""
    store = trainer._store
    assert store is not None
    before = {r.rollout_id for r in store.list_rollouts(limit=100)}
    interrupted = threading.Event()

    def interrupt_when_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(r.rollout_id not in before for r in store.list_rollouts(status="running", limit=100)):
                interrupted.set()
                _thread.interrupt_main()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=interrupt_when_running, daemon=True)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        watcher.start()
        with pytest.raises(KeyboardInterrupt):
            trainer.evaluate(agents_failures.failing_agent, [{"id": "cancelled", "kind": "cancelled"}])
        watcher.join(5)
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert interrupted.is_set(), "the hanging rollout never ran"
    [new] = [r for r in store.list_rollouts(limit=100) if r.rollout_id not in before]
    return new.rollout_id


def test_each_stored_failure_is_classified_as_the_kind_it_was(failed_store: tuple[Path, dict[str, str]]) -> None:
    path, ids = failed_store
    store = SqliteStore(path)
    got = {kind: rollout_failure(store, store.get_rollout(ids[kind])) for kind in KINDS}
    assert got["ok"] is None
    assert {kind: f.kind for kind, f in got.items() if f is not None} == {k: k for k in FAILURE_KINDS}
    llm_error = got["llm_error"]
    assert llm_error is not None and llm_error.status == 500 and "backend overloaded" in llm_error.detail
    tool_error = got["tool_error"]
    assert tool_error is not None and "lookup" in tool_error.detail and "no row 7" in tool_error.detail
    agent_exception = got["agent_exception"]
    assert agent_exception is not None and "could not parse the answer" in agent_exception.detail
    capture = got["capture_failure"]
    assert capture is not None and "no LLM call was captured" in capture.detail
    cancelled = got["cancelled"]
    assert cancelled is not None and "interrupted (KeyboardInterrupt)" in cancelled.detail, cancelled


def test_a_batch_cancelled_for_rollout_timeout_is_a_timeout_with_the_reason(tmp_path: Path) -> None:
    """No runner works for the store: the Trainer cancels the batch after ``rollout_timeout`` and says so."""
    trainer = agl.Trainer(
        n_runners=0,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": agl.LLM(base_url="http://127.0.0.1:9", model="fake")},
        rollout_timeout=0.5,
        allow_capture_failures=True,
        progress=False,
    )
    with trainer:
        [rollout] = trainer.evaluate(agents_failures.failing_agent, [{"id": "t", "kind": "ok"}]).rollouts
    store = SqliteStore(tmp_path / "agl.db")
    failure = rollout_failure(store, store.get_rollout(rollout.rollout_id))
    assert failure is not None and failure.kind == "timeout", failure
    assert "rollout_timeout: no rollout of the batch finished" in failure.detail


def test_breakdown_counts_per_round_with_one_example_per_kind(failed_store: tuple[Path, dict[str, str]]) -> None:
    path, ids = failed_store
    found = failure_breakdown(SqliteStore(path))
    assert found.rollouts == len(KINDS)
    assert dict(found.counts) == {kind: 1 for kind in FAILURE_KINDS}
    assert {kind: ex.rollout_id for kind, ex in found.examples.items()} == {k: ids[k] for k in FAILURE_KINDS}
    [only_round] = found.rounds.values()
    assert only_round.resources_version == 1 and only_round.failed == len(FAILURE_KINDS)


def test_cli_runs_failures_prints_counts_and_examples(
    failed_store: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, ids = failed_store
    assert main(["runs", "--failures", "--store", f"sqlite:///{path}"]) == 0
    out = capsys.readouterr().out
    assert f"{len(KINDS)} finished rollout(s), {len(FAILURE_KINDS)} failed" in out
    for kind in FAILURE_KINDS:
        line = next(
            x for x in out.splitlines() if x.strip().startswith(f"{kind}:") or x.strip().startswith(f"{kind} (")
        )
        assert ids[kind] in line
    assert "llm_error (HTTP 500)" in out
