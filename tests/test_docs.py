"""The documentation site builds strictly (a broken link, anchor, include or docstring reference fails), and its
search finds every public name."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The public namespaces: each has an ``__all__`` and a reference page.
NAMESPACES = (
    "agl",
    "agl.testing",
    "agl.trainers.rl",
    "agl.trainers.sft",
    "agl.trainers.apo",
    "agl.serving",
    "agl.otel",
    "agl.core.store",
    "agl.core.server",
    "agl.dashboard",
    "agl.core.telemetry",
    "agl.integrations.langchain",
    "agl.integrations.openai_agents",
    "agl.integrations.autogen",
    "agl.integrations.crewai",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    return out


def search_locations(site: Path) -> set[str]:
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    return {doc["location"].split("#", 1)[-1] for doc in index["docs"]}


def test_the_site_builds_strictly(site: Path) -> None:
    for page in ("index.html", "quickstart/index.html", "reference/cli/index.html", "reference/rest/index.html"):
        assert (site / page).is_file(), page


def test_every_name_of_every_public_namespace_is_found_by_the_sites_search(site: Path) -> None:
    locations = search_locations(site)
    names = {namespace: importlib.import_module(namespace).__all__ for namespace in NAMESPACES}
    missing = {ns: [n for n in all_ if f"{ns}.{n}" not in locations] for ns, all_ in names.items()}
    assert {ns: names for ns, names in missing.items() if names} == {}


def test_the_cli_page_has_every_command_and_flag_of_the_real_parser(site: Path) -> None:
    import argparse

    from agl.cli import build_parser

    page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        assert f"agl {name}" in page, name
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert f"<code>{flag}</code>" in page, (name, flag)


def test_the_quickstart_page_shows_the_tested_files_not_a_copy(site: Path) -> None:
    page = (site / "quickstart" / "index.html").read_text(encoding="utf-8")
    assert "answer_in_capitals" in page and "make_tiny_model" in page
    assert "--8&lt;--" not in page, "every include resolved"


#: The pages a reader reads (the generated reference pages are built from the code itself).
PAGES = ("README.md", "DESIGN.md", "CHANGELOG.md", *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))
DOTTED = re.compile(r"(?<![\w/.-])agl(?:\.[A-Za-z_]\w*)+")
#: Names under ``agl.`` that are not Python: span attribute and metadata keys, which are string literals in agl/.
KEYS = re.compile(r"""["'](agl\.[\w.]+)["']""")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of agl or an attribute reached from one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError:
            return False
        return True
    return False


def test_every_agl_name_the_docs_mention_exists() -> None:
    keys = {m.group(1) for path in (ROOT / "agl").rglob("*.py") for m in KEYS.finditer(path.read_text("utf-8"))}
    named = {
        (m.group(0).rstrip("."), page) for page in PAGES for m in DOTTED.finditer((ROOT / page).read_text("utf-8"))
    }
    assert sorted((name, page) for name, page in named if name not in keys and not resolves(name)) == []


def test_the_name_check_catches_a_name_that_does_not_exist() -> None:
    assert resolves("agl.trainers.sft.SFT") and resolves("agl.Trainer")
    assert not resolves("agl.SFT") and not resolves("agl.serving.models.no_such_helper")


def test_the_readme_is_short_and_its_python_is_quoted_from_the_tested_quickstart() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 120
    quickstart = "".join(p.read_text("utf-8") for p in sorted((ROOT / "examples" / "quickstart").glob("*.py")))
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert blocks, "the README shows the quickstart's code"
    for block in blocks:
        for line in block.splitlines():
            assert line in quickstart.splitlines(), f"README line not in examples/quickstart: {line!r}"


def mentioned(pattern: re.Pattern[str]) -> list[tuple[str, re.Match[str]]]:
    return [(page, m) for page in PAGES for m in pattern.finditer((ROOT / page).read_text("utf-8"))]


FLAG = re.compile(r"(?<![\w-])(--[a-z][\w.-]*[a-z0-9])")
AGL_COMMAND = re.compile(r"\bagl (server|runner|runs|show|dashboard|migrate|export|import)\b([^`\n|]*)")
DEMO_COMMAND = re.compile(r"scripts/demo\.sh\b([^`\n|#]*)")
EXTRAS = re.compile(r"(?:\bagl|\.|\.whl)\[([a-z0-9, -]+)\]")


def test_every_pip_extra_the_docs_mention_exists() -> None:
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["optional-dependencies"])
    named = {(page, e.strip()) for page, m in mentioned(EXTRAS) for e in m.group(1).split(",") if e.strip()}
    assert sorted((page, e) for page, e in named if e not in extras) == []
    assert EXTRAS.search('pip install -e ".[langgraph,rl]"'), "the pattern finds an extra as the docs write it"


def test_every_flag_the_docs_give_agl_and_the_demo_exists() -> None:
    import argparse
    import contextlib
    import io

    from agl.cli import build_parser
    from examples.sql_agent.train import parse_settings

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    agl_flags = {name: {o for a in p._actions for o in a.option_strings} for name, p in sub.choices.items()}
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        parse_settings(["--help"])
    demo_flags = set(FLAG.findall(help_text.getvalue()))
    assert {"--full", "--method", "--rl.update.loss.negative_weight"} <= demo_flags
    unknown = [
        (page, m.group(1), flag)
        for page, m in mentioned(AGL_COMMAND)
        for flag in FLAG.findall(m.group(2))
        if flag not in agl_flags[m.group(1)]
    ]
    unknown += [(page, "demo", f) for page, m in mentioned(DEMO_COMMAND) for f in FLAG.findall(m.group(1))]
    assert [u for u in unknown if u[1] != "demo" or u[2] not in demo_flags] == []


SNIPPET = re.compile(r'^--8<-- "(examples/[\w/]+\.py)(?::[\w-]+)?"$')


def test_every_python_block_of_the_docs_is_quoted_from_an_example_a_test_runs() -> None:
    """A page's Python is never a hand-kept copy: each block only includes (``--8<--``) files of examples/, and each
    such file is imported by a test that runs it (the README's, a copy of the quickstart, is checked above)."""
    tests = "".join(p.read_text("utf-8") for p in (ROOT / "tests").glob("test_*.py"))
    pages = [p for p in PAGES if p.startswith("docs/")]
    quoted: set[str] = set()
    for page in pages:
        for block in re.findall(r"```python\n(.*?)```", (ROOT / page).read_text("utf-8"), re.DOTALL):
            for line in block.splitlines():
                found = SNIPPET.match(line)
                assert found, f"{page}: a Python line that no test runs: {line!r}"
                quoted.add(found.group(1))
    assert len(quoted) >= 10, sorted(quoted)

    def imported(module: str, text: str) -> bool:
        parent, name = module.rsplit(".", 1)
        return module in text or bool(re.search(rf"from {re.escape(parent)} import [^\n]*\b{name}\b", text))

    examples = {
        str(p.relative_to(ROOT)).removesuffix(".py").replace("/", "."): p for p in ROOT.glob("examples/**/*.py")
    }
    tested = {m for m in examples if imported(m, tests)}
    for path in sorted(quoted):
        module = path.removesuffix(".py").replace("/", ".")
        ran = module in tested or any(imported(module, examples[m].read_text("utf-8")) for m in tested)
        assert ran, f"{path} is quoted by the docs but no test runs it (nor an example a test runs)"
