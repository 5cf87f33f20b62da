"""The dashboard behind agl server's auth, its answers to bad parameters, and its server-drawn charts (the pages
themselves are tested in a real browser: tests/test_dashboard_browser.py)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agl.core.server.app import create_app
from agl.core.server.auth import Tokens
from agl.core.store.sqlite import SqliteStore
from agl.core.types import PromptTemplate, RolloutRequest, Span
from agl.dashboard import PAGE_ROUTES, add_dashboard
from agl.dashboard.svg import line_chart

TOKENS = {role: secrets.token_urlsafe(24) for role in ("trainer", "runner", "reader")}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """agl server's app with tokens over a store holding one rollout with one span, and two prompt versions."""
    store = SqliteStore(tmp_path / "agl.db")
    store.publish_resources({"p": PromptTemplate(template="Answer {q}.")})
    store.publish_resources({"p": PromptTemplate(template="Answer {q} carefully.")})
    [ro] = store.enqueue([RolloutRequest(task={"q": 1})])
    leased = store.lease("w")
    assert leased is not None
    span = Span(rollout_id=ro.rollout_id, attempt_id=leased[1].attempt_id, kind="tool", name="lookup")
    store.add_spans([span])
    store.complete_attempt(leased[1].attempt_id, "succeeded", final_reward=1.0)
    app = create_app(store, tokens=Tokens(list(TOKENS.items())), pages=add_dashboard)
    ids = {"rollout_id": ro.rollout_id, "span_id": span.span_id, "name": "style.css"}
    with TestClient(app) as c:
        yield c, ids
    store.close()


def _get(c: TestClient, path: str, role: str | None) -> int:
    headers = {"authorization": f"Bearer {TOKENS[role]}"} if role else {}
    return c.get(path, headers=headers).status_code


def test_every_dashboard_page_needs_a_reader_or_trainer_token(client: tuple[TestClient, dict[str, str]]) -> None:
    c, ids = client
    for template in PAGE_ROUTES:
        path = template.format(**ids)
        assert _get(c, path, None) == 401, path
        assert _get(c, path, "runner") == 403, path
        assert _get(c, path, "reader") == 200, path
        assert _get(c, path, "trainer") == 200, path


def test_dashboard_is_served_at_root_and_shows_the_prompt_diff(client: tuple[TestClient, dict[str, str]]) -> None:
    c, ids = client
    reader = {"authorization": f"Bearer {TOKENS['reader']}"}
    page = c.get("/resources", headers=reader).text
    assert '<span class="del">-Answer {q}.</span>' in page and '<span class="add">+Answer {q} carefully.</span>' in page
    assert ids["rollout_id"] in c.get("/rollouts", headers=reader).text
    assert "no route" not in c.get("/health").text


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/rollouts?status=done", "status"),
        ("/rollouts?mode=prod", "mode"),
        ("/rollouts?page=-1", "page"),
        ("/rollouts?run=run-nope", "run"),
        ("/resources?a=9", "a"),
        ("/resources?page=99999999999999999999", "page"),
        ("/rollouts?page=99999999999999999999", "page"),
        ("/rollouts/{rollout_id}?agents=(", "agents"),
        ("/rollouts/{rollout_id}?attempt=at-nope", "attempt"),
    ],
)
def test_bad_parameter_is_a_400_page_naming_it(
    client: tuple[TestClient, dict[str, str]], path: str, named: str
) -> None:
    c, ids = client
    r = c.get(path.format(**ids), headers={"authorization": f"Bearer {TOKENS['reader']}"})
    assert r.status_code == 400
    message = re.search(r'id="error-message">(.*?)<', r.text)
    assert message is not None and message.group(1).startswith(f"{named}:"), r.text


def test_pages_and_assets_carry_security_headers_that_allow_only_the_dashboards_own_script(
    client: tuple[TestClient, dict[str, str]],
) -> None:
    c, ids = client
    reader = {"authorization": f"Bearer {TOKENS['reader']}"}
    for path in ("/", f"/rollouts/{ids['rollout_id']}", "/rollouts?status=done", "/assets/live.js", "/assets/nope"):
        r = c.get(path, headers=reader)
        csp = r.headers.get("content-security-policy", "")
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, path
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff", path
        assert r.headers["referrer-policy"] == "no-referrer", path
    assert "<script>" not in c.get("/", headers=reader).text, "no inline script: the policy would block it"


def test_the_standalone_dashboard_answers_loopback_host_names_only(tmp_path: Path) -> None:
    """``agl dashboard`` listens on loopback without tokens: a page reaching it under its own domain is refused."""
    from agl.dashboard import create_dashboard_app

    store = SqliteStore(tmp_path / "d.db")
    with TestClient(create_dashboard_app(store, host_names=[])) as c:
        refused = c.get("/", headers={"host": "attacker.example"})
        assert refused.status_code == 403 and "Host header" in refused.text
        assert c.get("/", headers={"host": "127.0.0.1:4848"}).status_code == 200
    store.close()


def test_curves_page_shows_odd_apo_candidate_records_instead_of_failing_for_every_reader(
    client: tuple[TestClient, dict[str, str]],
) -> None:
    c, _ = client
    odd = [
        {"id": "c1", "iteration": 1},  # no status
        {"id": "c2", "iteration": "two", "status": 3, "rewards": {"t": ["x", 1.0]}, "prompts": ["not", "a", "dict"]},
        {"id": "c3", "iteration": 2, "status": "accepted", "rewards": [1], "val_rewards": {"t": 7}},
    ]
    trainer = {"authorization": f"Bearer {TOKENS['trainer']}"}
    for data in odd:
        record = {"kind": "apo_candidate", "key": data["id"], "data": data}
        assert c.post("/api/records", json=record, headers=trainer).status_code == 200
    page = c.get("/curves", headers={"authorization": f"Bearer {TOKENS['reader']}"})
    assert page.status_code == 200, page.text
    assert all(f"<td>{i}</td>" in page.text for i in ("c1", "c2", "c3")) and "accepted" in page.text


def test_unknown_rollout_and_asset_are_404(client: tuple[TestClient, dict[str, str]]) -> None:
    c, _ = client
    reader = {"authorization": f"Bearer {TOKENS['reader']}"}
    assert c.get("/rollouts/ro-nope", headers=reader).status_code == 404
    assert c.get("/assets/..%2Fapp.py", headers=reader).status_code == 404


def test_line_chart_draws_each_series_in_x_order_and_skips_non_finite_values() -> None:
    svg = line_chart("reward", {"train": [(2, 1.0), (0, 0.0), (1, float("nan")), (1, 0.5)]}, width=148, height=150)
    [d] = re.findall(r'class="series" data-series="train" d="([^"]+)"', svg)
    points = [tuple(map(float, p[1:].split(","))) for p in d.split()]
    assert [p[0] for p in points] == [48.0, 93.0, 138.0], "x from the left edge of the plot to the right one"
    assert points[0][1] > points[1][1] > points[2][1], "higher reward is drawn higher"
    assert "no values" in line_chart("empty", {"train": [(0, float("inf"))]})


def test_local_dashboard_reads_a_remote_server_with_a_reader_token(tmp_path: Path) -> None:
    """``AGL_TOKEN=<reader> agl dashboard --store http://server``: the pages, read through the store API."""
    from agl.core.server import AglServer
    from agl.core.store.http import HttpStore
    from agl.dashboard import create_dashboard_app

    store = SqliteStore(tmp_path / "agl.db")
    store.publish_resources({"p": PromptTemplate(template="Answer {q}.")})
    [ro] = store.enqueue([RolloutRequest(task={"q": 1}, task_id="remote-task")])
    with AglServer(store, tokens=Tokens(list(TOKENS.items()))) as server:
        remote = HttpStore(server.url, token=TOKENS["reader"])
        with TestClient(create_dashboard_app(remote)) as c:
            for path in ("/", "/rollouts", f"/rollouts/{ro.rollout_id}", "/curves", "/resources", "/failures"):
                r = c.get(path)
                assert r.status_code == 200, (path, r.text)
            assert "remote-task" in c.get("/rollouts").text
        remote.close()


def test_standalone_dashboard_refuses_to_listen_beyond_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    from agl.cli import main

    assert main(["dashboard", "--store", "sqlite:///unused.db", "--host", "0.0.0.0"]) == 2
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err


def test_the_agent_filter_takes_agents_nested_in_the_one_named(tmp_path: Path) -> None:
    """``?agent=solver`` lists the rollouts whose model calls came from ``solver`` or an agent inside it, as
    ``agents="solver"`` selects them for training; other agents' rollouts are left out."""
    store = SqliteStore(tmp_path / "agl.db")
    store.publish_resources({"p": PromptTemplate(template="{q}")})
    made: dict[str, str] = {}
    for agent in ("solver/critic", "planner", "solverx"):
        [ro] = store.enqueue([RolloutRequest(task={"q": agent}, task_id=f"task-{agent.replace('/', '-')}")])
        leased = store.lease("w")
        assert leased is not None
        store.add_spans(
            [Span(rollout_id=ro.rollout_id, attempt_id=leased[1].attempt_id, kind="llm", name="chat", agent=agent)]
        )
        store.complete_attempt(leased[1].attempt_id, "succeeded", final_reward=1.0)
        made[agent] = f"task-{agent.replace('/', '-')}"
    reader = {"authorization": f"Bearer {TOKENS['reader']}"}
    with TestClient(create_app(store, tokens=Tokens(list(TOKENS.items())), pages=add_dashboard)) as c:
        page = c.get("/rollouts?agent=solver", headers=reader).text
    assert made["solver/critic"] in page
    assert made["planner"] not in page and made["solverx"] not in page
    store.close()


def _run_page_rollouts(store: SqliteStore, run_id: str) -> set[str]:
    """The rollout ids the dashboard's page of one run lists (read with a reader token, as a browser would)."""
    app = create_app(store, tokens=Tokens(list(TOKENS.items())), pages=add_dashboard)
    with TestClient(app) as c:
        r = c.get(f"/rollouts?run={run_id}", headers={"authorization": f"Bearer {TOKENS['reader']}"})
    assert r.status_code == 200, r.text
    return set(re.findall(r'data-rollout="([^"]+)"', r.text))


def test_two_evaluates_on_one_version_each_list_only_their_own_rollouts(tmp_path: Path) -> None:
    """Two ``evaluate`` calls with the same resources version and mode: each run's page lists exactly the rollouts it
    enqueued (rollouts carry their run's id); a run recorded before rollouts carried one keeps the version rule."""
    import agl
    from agl.core.runs import RUN_KIND, list_runs
    from agl.core.types import Record
    from agl.testing import FakeLLM, FakeReply
    from tests import agents_basic

    with FakeLLM(lambda body: FakeReply(content="the answer is Q")) as fake:
        trainer = agl.Trainer(
            n_runners=1,
            store=f"sqlite:///{tmp_path}/agl.db",
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            progress=False,
        )
        with trainer:
            tasks = [{"id": f"t{i}", "question": f"q{i}", "answer": "Q"} for i in range(2)]
            first = {r.rollout_id for r in trainer.evaluate(agents_basic.two_call_agent, tasks).rollouts}
            second = {r.rollout_id for r in trainer.evaluate(agents_basic.two_call_agent, tasks[:1]).rollouts}
    store = SqliteStore(tmp_path / "agl.db")
    [untagged] = store.enqueue([RolloutRequest(task={"q": "old"}, mode="test")])
    old = {"kind": "evaluate", "algorithm": "Baseline", "status": "succeeded", "started_at": 1.0, "ended_at": 2.0}
    old.update(first_version=1, last_version=1, modes=["test"], error=None)
    store.add_record(Record(kind=RUN_KIND, key="run-old", data=old))
    newer, older = [r for r in list_runs(store) if r.run_id != "run-old"]
    assert _run_page_rollouts(store, older.run_id) == first
    assert _run_page_rollouts(store, newer.run_id) == second
    assert _run_page_rollouts(store, "run-old") == {untagged.rollout_id}, "only the rollouts no run tagged"
    store.close()
