"""MkDocs hooks: the reference pages that are generated from the code at build time, never written by hand.

- ``reference/cli.md``: every ``agl`` command and flag, from the real argparse parser (``agl.cli.build_parser``).
- ``reference/rest.md``: every route of the agl server, from its OpenAPI schema (``create_app`` over an empty store).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    files.append(File.generated(config, "reference/rest.md", content=rest_page()))
    return files


def cli_page() -> str:
    """The ``agl`` commands, each with its usage and a table of its arguments (help text as the parser has it)."""
    from agl.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "Generated from `agl`'s own argument parser (`agl.cli.build_parser`) when the site is built.",
        "",
        f"```text\n{parser.format_usage().strip()}\n```",
        "",
        parser.description or "",
        "",
    ]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    for name, sub in subparsers.choices.items():
        text = helps.get(name) or ""
        lines += [f"## agl {name}", "", text[:1].upper() + text[1:] + ".", ""]
        lines += [f"```text\n{sub.format_usage().strip()}\n```", ""]
        lines += ["| argument | help | default |", "|---|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
            default = "" if action.default in (None, argparse.SUPPRESS) else f"`{action.default}`"
            text = (action.help or "").replace("|", "\\|").replace("[", "\\[").replace("\n", " ")
            lines.append(f"| {names} | {text} | {default} |")
        lines.append("")
    return "\n".join(lines)


def rest_page() -> str:
    """The server's routes, grouped by path, each with its methods, summary and request/response schema names."""
    from agl.core.server import create_app
    from agl.core.store import open_store

    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{Path(folder) / 'docs.db'}")
        try:
            schema: dict[str, Any] = create_app(store).openapi()
        finally:
            store.close()
    lines = [
        "# REST API",
        "",
        "Generated from the agl server's OpenAPI schema when the site is built. A running server also serves it at",
        "`/openapi.json` and as pages at `/docs`. Every route but `/health` needs a token beyond loopback (see the",
        "security how-to); the LLM gateway is the OpenAI-compatible `/v1/...` under each attempt's path.",
        "",
        "| method | path | what it does |",
        "|---|---|---|",
    ]
    for path, operations in sorted(schema["paths"].items()):
        for method, op in operations.items():
            summary = (op.get("description") or op.get("summary") or "").split("\n")[0].replace("|", "\\|")
            lines.append(f"| {method.upper()} | `{path}` | {summary} |")
    lines += ["", "## Schemas", ""]
    for name, body in sorted(schema.get("components", {}).get("schemas", {}).items()):
        fields = ", ".join(f"`{field}`" for field in body.get("properties", {}))
        lines.append(f"- **{name}**: {fields or body.get('type', '')}")
    return "\n".join(lines) + "\n"
