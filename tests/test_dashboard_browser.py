"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` + ``chromedriver``, driven by Selenium)
loads every page of ``agl dashboard`` (a real process) over a SQLite store that real Trainer runs filled: an APO fit
with the fake LLM as agent model and optimizer, and an evaluation whose rollouts fail in three ways. It asserts on
the DOM, clicks from a run to a rollout to a span, sees a live page pick up a new rollout, and saves a screenshot of
every page under ``test-artifacts/dashboard/`` (kept by the test run; ``docs/dashboard.png`` is its
``03-rollout.png``).

Chromium missing is a failure naming the packages, never a skip: ``scripts/test.sh`` installs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import agl
from agl.core.store.sqlite import SqliteStore
from agl.core.types import RolloutRequest
from agl.testing import FakeLLM, FakeReply
from agl.trainers.apo import APO, APOConfig
from tests import agents_dashboard, agents_failures
from tests.server_process import free_port

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "test-artifacts" / "dashboard"
START = "Answer. Q: {question}"
BETTER = "Think carefully. Answer. Q: {question}"
TRAIN = [{"id": f"math{i}", "question": f"math-{i}"} for i in range(2)]
FAILING = ["agent_exception", "llm_error", "tool_error"]
WAIT_S = 15.0


def agent_model(body: dict[str, Any]) -> FakeReply:
    text = body["messages"][-1]["content"]
    if text == "task llm_error":
        return FakeReply(status=500, error="backend overloaded")
    return FakeReply(content=f"the answer is {len(text)}")


def optimizer_model(body: dict[str, Any]) -> FakeReply:
    text = body["messages"][-1]["content"]
    if "Critique of the current prompt" not in text:
        return FakeReply(content="The prompt never asks the agent to think carefully.")
    return FakeReply(content=f'<prompt name="system_prompt">\n{BETTER}\n</prompt>')


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store an APO fit (2 iterations, a better prompt published) and a failing evaluation filled."""
    folder = tmp_path_factory.mktemp("dashboard")
    path = folder / "agl.db"
    with FakeLLM(agent_model) as model, FakeLLM(optimizer_model) as optimizer:
        resources = {
            "main_llm": agl.LLM(base_url=model.base_url, model="fake"),
            "optimizer_llm": agl.LLM(base_url=optimizer.base_url, model="optimizer"),
            "system_prompt": agl.PromptTemplate(template=START, agent="solver"),
        }
        cfg = APOConfig(
            prompts=["system_prompt"],
            beam_width=1,
            branch_factor=1,
            minibatch_size=2,
            rollout_budget=12,
            validation="off",
        )
        trainer = agl.Trainer(
            algorithm=APO(cfg),
            n_runners=2,
            store=f"sqlite:///{path}",
            resources=resources,
            max_attempts=1,
            allow_capture_failures=True,
            progress=False,
        )
        with trainer:  # the Trainer records each fit and evaluate as a run
            result = trainer.fit(agents_dashboard.prompt_agent, TRAIN)
            assert result.resources.resources["system_prompt"].template == BETTER  # type: ignore[union-attr]
            tasks = [{"id": kind, "kind": kind, "direct_url": model.base_url} for kind in FAILING]
            trainer.evaluate(agents_failures.failing_agent, tasks)
    return path


@pytest.fixture(scope="module")
def dashboard(store_path: Path) -> Iterator[str]:
    """``agl dashboard`` serving the store, as its own process; its URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agl.cli", "dashboard", "--store", f"sqlite:///{store_path}", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                if httpx.get(url + "/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise RuntimeError(f"agl dashboard did not come up on {url}: {out}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail(
            "the dashboard's browser test needs Debian's chromium and chromium-driver packages "
            "(scripts/test.sh installs them: apt-get install -y chromium chromium-driver)"
        )
    return browser, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.set_page_load_timeout(30)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield chrome
    finally:
        chrome.quit()


def _shot(chrome: Any, name: str) -> None:
    chrome.save_screenshot(str(SHOTS / f"{name}.png"))


def _navigate(chrome: Any, action: Any) -> None:
    """Run ``action`` (a click or submit that loads another page) and wait until the new page has loaded.

    WebDriver does not promise that a click returns after the navigation it starts: on a busy machine the next
    lookup can still see the old page (or hit it as it goes away). A mark left on the old page's window, gone from
    the new one, then the new one's ``readyState``, say the new page is there. The mark is read by script, not
    through an element of the old page: asking about an element as its page goes away can fail with Chrome's
    "node does not belong to the document" instead of the stale reference WebDriver's own check expects, so an
    error while the page changes is read as "not yet"."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    chrome.execute_script("window.__aglOldPage = true")
    action()
    WebDriverWait(chrome, WAIT_S, ignored_exceptions=(WebDriverException,)).until(
        lambda b: b.execute_script("return window.__aglOldPage === undefined && document.readyState === 'complete'")
    )


def _rows(chrome: Any, table: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return chrome.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")


def test_click_from_run_to_rollout_to_span(dashboard: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard + "/")
    runs = _rows(browser, "runs")
    assert len(runs) == 2
    fit = next(r for r in runs if "fit" in r.text.split())
    assert "APO" in fit.text and "succeeded" in fit.text and "v1–v" in fit.text
    _shot(browser, "01-runs")

    _navigate(browser, fit.find_element(By.CSS_SELECTOR, "td a").click)
    assert "/rollouts?run=run-" in browser.current_url
    rows = _rows(browser, "all")
    assert len(rows) == 6, "start prompt and its child on 2 tasks, then the child alone again"
    rewards = sorted(r.find_element(By.CSS_SELECTOR, ".reward").text for r in rows)
    assert rewards == ["0"] * 2 + ["1"] * 4
    _shot(browser, "02-rollouts-of-run")

    rewarded = next(r for r in rows if r.find_element(By.CSS_SELECTOR, ".reward").text == "1")
    _navigate(browser, rewarded.find_element(By.CSS_SELECTOR, "td a").click)
    assert browser.find_element(By.ID, "rollout-status").text == "succeeded"
    tree = browser.find_element(By.ID, "span-tree").text
    for name in ("chat", "calculator", "tool_ok"):
        assert name in tree, f"span {name!r} missing from the tree:\n{tree}"
    transitions = _rows(browser, "transitions")
    assert [t.find_elements(By.TAG_NAME, "td")[1].text for t in transitions] == ["solver", "checker"]
    assert [t.find_elements(By.TAG_NAME, "td")[4].text for t in transitions] == ["0.25", "0"]
    assert browser.find_element(By.ID, "rewards").text == "0.25"

    field = browser.find_element(By.NAME, "agents")
    field.send_keys("solver")
    _navigate(browser, field.submit)
    transitions = _rows(browser, "transitions")
    assert [t.find_elements(By.TAG_NAME, "td")[1].text for t in transitions] == ["solver"]
    selected = browser.find_elements(By.CSS_SELECTOR, "#span-tree li.span.selected > .agent")
    assert [s.text for s in selected] == ["[solver]"], "only the selected agent's call is highlighted"
    _shot(browser, "03-rollout")

    _navigate(browser, browser.find_element(By.LINK_TEXT, "calculator").click)
    assert browser.find_element(By.ID, "span-title").text == "tool: calculator"
    assert '"gen_ai.tool.call.result"' in browser.find_element(By.ID, "attributes").text
    _shot(browser, "04-span")


def test_curves_plot_the_metrics_and_apo_candidates(dashboard: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard + "/curves")
    chart = browser.find_element(By.CSS_SELECTOR, 'figure[data-metric="best_mean"] path.series')
    d = chart.get_attribute("d") or ""
    assert d.startswith("M") and d.count("L") == 1, f"best_mean at iterations 1 and 2 is one segment: {d}"
    candidates = _rows(browser, "candidates")
    assert len(candidates) == 2 and "Think carefully" in browser.find_element(By.ID, "candidates").text
    assert browser.find_element(By.CSS_SELECTOR, "#apo-chart path.series")
    _shot(browser, "05-curves")


def test_resources_diff_shows_the_published_prompt_change(dashboard: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard + "/resources?a=1")
    added = browser.find_elements(By.CSS_SELECTOR, 'pre.diff[data-prompt="system_prompt"] .add')
    removed = browser.find_elements(By.CSS_SELECTOR, 'pre.diff[data-prompt="system_prompt"] .del')
    assert [a.text for a in added] == [f"+{BETTER}"] and [r.text for r in removed] == [f"-{START}"]
    assert "fake @ http://127.0.0.1" in browser.find_element(By.ID, "versions").text
    assert "api_key" not in browser.page_source
    _shot(browser, "06-resources")


def test_failures_and_errors_first(dashboard: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard + "/failures")
    kinds = {r.get_attribute("data-kind"): r.text for r in _rows(browser, "failure-counts")}
    assert sorted(kinds) == sorted(FAILING), kinds
    assert "HTTP 500" in kinds["llm_error"] and "no row 7" in kinds["tool_error"]
    _shot(browser, "07-failures")

    browser.get(dashboard + "/rollouts")
    failed = _rows(browser, "failed")
    texts = [r.text for r in failed]
    assert len(texts) == 3 and all("failed" in t for t in texts), texts
    browser.find_element(By.CSS_SELECTOR, "select[name=status] option[value=failed]").click()
    _navigate(browser, browser.find_element(By.CSS_SELECTOR, "form.filters button").click)
    assert len(_rows(browser, "all")) == 3 and not browser.find_elements(By.ID, "failed")
    _shot(browser, "08-rollouts-failed")


def test_live_page_shows_a_new_rollout_without_reload(dashboard: str, browser: Any, store_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(dashboard + "/rollouts?status=queued")
    assert not _rows(browser, "all")
    store = SqliteStore(store_path)
    try:
        [queued] = store.enqueue([RolloutRequest(task={"q": "late"}, task_id="late-task")])
        WebDriverWait(browser, WAIT_S).until(
            lambda b: any(queued.rollout_id in r.text for r in b.find_elements(By.CSS_SELECTOR, "#all tbody tr"))
        )
        store.cancel([queued.rollout_id])
    finally:
        store.close()


def test_a_token_protected_server_opens_in_the_browser_from_the_link_it_prints(
    store_path: Path, browser: Any, tmp_path: Path
) -> None:
    """`agl server` with its default token: the pages answer a login form; the ?token= link it prints keeps the token
    in a cookie and leaves it out of the address; the other pages then open from that cookie alone."""
    import re

    from selenium.webdriver.common.by import By

    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "AGL_TOKEN"}, "AGL_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-m", "agl.cli", "server", "--store", f"sqlite:///{store_path}", "--port", str(port)]
    proc = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        link = re.search(r"the dashboard: (http://\S+/\?token=(\S+))", lines[1])
        assert link, lines
        url = f"http://127.0.0.1:{port}"
        browser.delete_all_cookies()
        browser.get(url + "/rollouts")
        assert browser.find_element(By.ID, "login") and "needs a token" in browser.page_source
        _shot(browser, "10-login")
        browser.get(link.group(1))
        assert browser.current_url == url + "/", "the token left the address bar"
        assert browser.find_elements(By.CSS_SELECTOR, "table") and "needs a token" not in browser.page_source
        cookie = browser.get_cookie("agl_token")
        assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        browser.get(url + "/rollouts")
        assert _rows(browser, "all"), "the cookie opens the other pages"
        assert httpx.get(url + "/api/rollouts", cookies={"agl_token": link.group(2)}).status_code == 401, (
            "the cookie is for the pages, never the API"
        )
    finally:
        browser.delete_all_cookies()
        proc.terminate()
        proc.wait(30)
