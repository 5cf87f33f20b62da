"""What the SQL agent knows of the database in front of it: the schema view its prompts show, and the identifier check
that runs before a query does.

A model that sees only ``CREATE TABLE`` lines guesses value formats and, on a schema whose names do not echo the
question's words, guesses names too (``FROM customers`` where the table is ``tblClient``). Two remedies, both read
from the task's own SQLite file:

* :func:`schema_view` renders the schema in one of :data:`SCHEMA_VIEWS`: ``compact`` (the ``CREATE TABLE`` lines
  alone), ``rows`` (each table followed by a few of its rows, as LangChain's ``SQLDatabase.get_table_info`` shows them)
  and ``values`` (``rows``, plus the distinct values of short text columns with few of them: the spelling of a
  category a filter must match).
* :func:`check_identifiers` parses a query with sqlglot and resolves every table and column against the schema, scope
  by scope (aliases, CTEs, subqueries, correlated references, output aliases in ``ORDER BY``). An unknown name becomes
  a message that says what exists and what was probably meant, e.g. ``no column "name" in table "tblClient"; its
  columns are: clientNo, fullName, city; did you mean "fullName"?``. It refuses only what SQLite itself would refuse
  (a double-quoted name that resolves to nothing is a string literal to SQLite, so it passes): the check changes the
  message a failing query gets, never which queries run.
"""

from __future__ import annotations

import difflib
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

from examples.sql_agent.sql_data import db_path, schema_text

SchemaView = Literal["compact", "rows", "values"]
SCHEMA_VIEWS: tuple[SchemaView, ...] = get_args(SchemaView)
DEFAULT_SCHEMA_VIEW: SchemaView = "values"
"""The view the agent shows unless a task names another (``task["schema_view"]``)."""

SAMPLE_ROWS = 3
"""Rows shown per table in the ``rows`` and ``values`` views (LangChain's default)."""
MAX_CELL_CHARS = 40
"""A longer cell is cut to this many characters and marked with an ellipsis."""
MAX_DISTINCT_VALUES = 12
"""A text column with more distinct values than this is not listed in the ``values`` view."""
MAX_VALUE_CHARS = 30
"""Nor is one whose longest value is longer than this (names, free text)."""

Verdict = Literal["ok", "unknown_table", "unknown_column", "unparsed"]


@dataclass(frozen=True)
class Table:
    """One table of a database: its name as declared and its columns in order."""

    name: str
    columns: tuple[str, ...]


@lru_cache(maxsize=256)
def tables(db_id: str) -> tuple[Table, ...]:
    """The tables of ``db_id`` read from its SQLite file, in declaration order."""
    conn = sqlite3.connect(f"{db_path(db_id).as_uri()}?mode=ro", uri=True)
    try:
        names = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        ]
        return tuple(
            Table(name, tuple(r[1] for r in conn.execute(f"PRAGMA table_info({_quote(name)})"))) for name in names
        )
    finally:
        conn.close()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _cell(value: object) -> str:
    text = "NULL" if value is None else str(value)
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"


@lru_cache(maxsize=256)
def schema_view(db_id: str, view: SchemaView = DEFAULT_SCHEMA_VIEW) -> str:
    """The schema of ``db_id`` as the agent's prompts show it in ``view`` (see the module docstring)."""
    if view not in SCHEMA_VIEWS:
        raise ValueError(f"unknown schema view {view!r}; expected one of {SCHEMA_VIEWS}")
    compact = schema_text(db_id)
    if view == "compact":
        return compact
    declared = {t.name.casefold(): t for t in tables(db_id)}
    conn = sqlite3.connect(f"{db_path(db_id).as_uri()}?mode=ro", uri=True)
    parts: list[str] = []
    try:
        for line in compact.splitlines():
            parts.append(line)
            table = declared.get(_declared_name(line).casefold())
            if table is None:
                continue
            rows = conn.execute(f"SELECT * FROM {_quote(table.name)} LIMIT {SAMPLE_ROWS}").fetchall()
            body = "\n".join("\t".join(_cell(v) for v in row) for row in rows)
            parts.append(f"/* {len(rows)} rows from {table.name}:\n" + "\t".join(table.columns) + f"\n{body}\n*/")
            if view == "values":
                parts.extend(_value_lines(conn, table))
    finally:
        conn.close()
    return "\n".join(parts)


def _declared_name(create_line: str) -> str:
    """The table name of a ``CREATE TABLE name (...)`` line (quoted or not)."""
    rest = create_line.split("(", 1)[0].split(None, 2)[-1].strip()
    return rest[1:-1].replace('""', '"') if rest[:1] in {'"', "`", "["} else rest


def _value_lines(conn: sqlite3.Connection, table: Table) -> list[str]:
    """``-- table.column values: 'a', 'b'`` for each text column of ``table`` with few, short distinct values that
    repeat (a category a filter must spell exactly)."""
    lines = []
    rows = conn.execute(f"SELECT COUNT(*) FROM {_quote(table.name)}").fetchone()[0]
    keys = {r[3] for r in conn.execute(f"PRAGMA foreign_key_list({_quote(table.name)})")}
    for column in table.columns:
        if column in keys:
            continue  # the referenced table's rows show a key's values
        values = conn.execute(
            f"SELECT DISTINCT {_quote(column)} FROM {_quote(table.name)} WHERE typeof({_quote(column)}) = 'text' "
            f"LIMIT {MAX_DISTINCT_VALUES + 1}"
        ).fetchall()
        texts = sorted(str(v[0]) for v in values)
        if not texts or len(texts) > MAX_DISTINCT_VALUES or max(map(len, texts)) > MAX_VALUE_CHARS:
            continue
        if len(texts) == rows:
            continue  # every row has its own value: a key or a name, not a category
        listed = ", ".join("'" + t.replace("'", "''") + "'" for t in texts)
        lines.append(f"-- {table.name}.{column} values: {listed}")
    return lines


@dataclass(frozen=True)
class IdentifierCheck:
    """The verdict of :func:`check_identifiers` and, unless ``ok``, the message a rewriter is shown."""

    verdict: Verdict
    message: str = ""

    @property
    def ok(self) -> bool:
        """True unless the query names a table or column the database does not have (an unparsed query passes)."""
        return self.verdict in ("ok", "unparsed")


def _suggest(name: str, candidates: list[str]) -> str:
    """``; did you mean "x"?`` for the closest candidate (case-insensitive), or nothing."""
    folded = {c.casefold(): c for c in candidates}
    close = difflib.get_close_matches(name.casefold(), list(folded), n=1, cutoff=0.5)
    return f'; did you mean "{folded[close[0]]}"?' if close else ""


def check_identifiers(sql: str, db_id: str) -> IdentifierCheck:
    """Resolve every table and column ``sql`` names against ``db_id``'s schema (see the module docstring)."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError
    from sqlglot.optimizer.scope import Scope, traverse_scope

    declared = {t.name.casefold(): t for t in tables(db_id)}
    try:
        tree = sqlglot.parse_one(sql, dialect="sqlite")
        scopes = traverse_scope(tree)
    except (SqlglotError, RecursionError, ValueError):
        return IdentifierCheck("unparsed")
    all_tables = [t.name for t in declared.values()]
    for scope in scopes:
        for source in scope.sources.values():
            if isinstance(source, exp.Table) and source.name.casefold() not in declared:
                return IdentifierCheck(
                    "unknown_table",
                    f'no table "{source.name}"; the tables are: {", ".join(all_tables)}'
                    + _suggest(source.name, all_tables),
                )

    def outputs(source: object) -> list[str] | None:
        """The names a source offers: a table's columns, a subquery's or CTE's output names (None: any name)."""
        if isinstance(source, exp.Table):
            return list(declared[source.name.casefold()].columns)
        if isinstance(source, Scope) and isinstance(source.expression, exp.Query):
            selects = source.expression.named_selects
            return None if "*" in selects or not selects else list(selects)
        return None

    for scope in scopes:
        selects = scope.expression.expressions if isinstance(scope.expression, exp.Select) else []
        aliases = {e.alias.casefold() for e in selects if isinstance(e, exp.Alias)}  # SQLite accepts them anywhere
        for column in scope.columns:
            if isinstance(column.this, exp.Star) or column.name == "":
                continue
            if isinstance(scope.expression, exp.Select) and column.find_ancestor(exp.Select) is not scope.expression:
                continue  # sqlglot lists an IN subquery's columns in the enclosing scope too: its own scope checks them
            name = column.name
            quoted = bool(column.this.args.get("quoted"))
            if column.table:
                found = _lookup_source(scope, column.table)
                if found is None:
                    if quoted:
                        continue
                    return IdentifierCheck(
                        "unknown_table", f'"{column.table}.{name}" names no table or alias of its FROM clause'
                    )
                names = outputs(found)
                if names is None or name.casefold() in {n.casefold() for n in names}:
                    continue
                if quoted:
                    continue
                owner = found.name if isinstance(found, exp.Table) else column.table
                return IdentifierCheck(
                    "unknown_column",
                    f'no column "{name}" in table "{owner}"; its columns are: {", ".join(names)}'
                    + _suggest(name, names),
                )
            if name.casefold() in aliases or _resolves(scope, name, outputs):
                continue
            if quoted:
                continue  # SQLite reads a double-quoted name that resolves to nothing as a string literal
            offered = [
                (label, names)
                for label, names in ((_label(s), outputs(s)) for s in scope.sources.values())
                if names is not None
            ]
            listing = "; ".join(f"{label}: {', '.join(names)}" for label, names in offered)
            candidates = [n for _, names in offered for n in names] or [c for t in declared.values() for c in t.columns]
            return IdentifierCheck(
                "unknown_column",
                f'no column "{name}" in the tables of its FROM clause ({listing})' + _suggest(name, candidates),
            )
    return IdentifierCheck("ok")


def _label(source: object) -> str:
    from sqlglot import exp

    return source.name if isinstance(source, exp.Table) else "a subquery"


def _lookup_source(scope: object, alias: str) -> object | None:
    """The source named ``alias`` in ``scope`` or an enclosing scope (a correlated reference), case-insensitively."""
    current = scope
    folded = alias.casefold()
    while current is not None:
        for key, source in current.sources.items():  # type: ignore[attr-defined]
            if key.casefold() == folded:
                return source
        current = current.parent  # type: ignore[attr-defined]
    return None


def _resolves(scope: object, name: str, outputs: object) -> bool:
    """Whether unqualified ``name`` is offered by a source of ``scope`` or of an enclosing scope (or a source offers
    any name: a ``SELECT *`` subquery)."""
    folded = name.casefold()
    current = scope
    while current is not None:
        for source in current.sources.values():  # type: ignore[attr-defined]
            names = outputs(source)  # type: ignore[operator]
            if names is None or folded in {n.casefold() for n in names}:
                return True
        current = current.parent  # type: ignore[attr-defined]
    return False
