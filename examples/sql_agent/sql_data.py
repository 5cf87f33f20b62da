"""Loading and scoring API for the bundled text-to-SQL dataset.

The dataset (built by ``build_dataset.py`` into ``data/``) is a small,
Spider-style collection of SQLite databases plus natural-language questions
with gold SQL. This module is what the SQL agent and its trainer use:

* :func:`load_split` / :class:`SqlTask` give the questions of a split;
* :func:`schema_text` gives the schema an agent is shown;
* :func:`execute_readonly` runs model-written SQL safely (read-only, time
  limited, single SELECT/WITH statement only);
* :func:`execution_match` is the reward: execution accuracy against the gold
  query; :func:`result_f1` is partial credit (F1 of the result rows) that only
  breaks ties;
* :func:`extract_sql` pulls the SQL out of a free-form model reply.

Only the standard library is used so the module can be imported anywhere.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "DATA_DIR",
    "SPLITS",
    "TIERS",
    "SqlExecutionError",
    "SqlTask",
    "db_path",
    "execute_readonly",
    "execution_match",
    "extract_sql",
    "list_db_ids",
    "load_split",
    "result_f1",
    "schema_text",
]

DATA_DIR: Path = Path(__file__).resolve().parent / "data"
"""Directory holding ``dbs/``, the split files, ``schemas.json`` and ``stats.json``."""

SPLITS: tuple[str, ...] = ("train", "dev", "test", "independent")
"""``train``/``dev``/``test``: generated databases (split by database); ``independent``: hand-written databases and
questions that share none of the generator's templates, schema conventions or domains."""
TIERS: tuple[str, ...] = ("easy", "medium", "join", "hard")

SplitName = Literal["train", "dev", "test", "independent"]

# execution_match compares complete results; this cap only guards memory.
_MATCH_MAX_ROWS = 100_000
# How many SQLite VM instructions run between two checks of the deadline.
_PROGRESS_STEPS = 1_000


class SqlExecutionError(Exception):
    """A query was rejected or failed: sqlite error, timeout, or not a single SELECT.

    ``message`` is meant to be shown back to an agent (e.g. by a checker node),
    so it is short and says what went wrong.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class SqlTask:
    """One question of the dataset.

    ``tier`` is one of :data:`TIERS`: ``easy`` (single table), ``medium``
    (compound filters, ordering, grouping), ``join`` (two tables) and ``hard``
    (joins with grouping/having, nested queries, three-table joins).
    """

    id: str
    db_id: str
    question: str
    gold_sql: str
    tier: str

    def to_dict(self) -> dict[str, str]:
        """Plain dict, the format of one line of the split files."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SqlTask:
        """Build a task from a mapping; unknown keys are ignored."""
        return cls(
            id=str(data["id"]),
            db_id=str(data["db_id"]),
            question=str(data["question"]),
            gold_sql=str(data["gold_sql"]),
            tier=str(data["tier"]),
        )


def load_split(name: SplitName, limit: int | None = None) -> list[SqlTask]:
    """Load the tasks of split ``name`` in file order (already shuffled, mixed DBs/tiers).

    ``limit`` keeps only the first ``limit`` tasks, which is a representative
    sample because the file order is a seeded shuffle.
    """
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
    path = DATA_DIR / f"{name}.jsonl"
    tasks: list[SqlTask] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if limit is not None and len(tasks) >= limit:
                break
            if line.strip():
                tasks.append(SqlTask.from_dict(json.loads(line)))
    return tasks


def db_path(db_id: str) -> Path:
    """Path of the SQLite file of database ``db_id``."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", db_id):
        raise ValueError(f"invalid db_id {db_id!r}")
    return DATA_DIR / "dbs" / f"{db_id}.sqlite"


def list_db_ids() -> list[str]:
    """All database ids that have a schema entry, sorted."""
    return sorted(_schemas())


@lru_cache(maxsize=1)
def _schemas() -> dict[str, str]:
    with (DATA_DIR / "schemas.json").open(encoding="utf-8") as handle:
        data: dict[str, str] = json.load(handle)
    return data


def schema_text(db_id: str) -> str:
    """Compact ``CREATE TABLE`` statements (one per line) of ``db_id``, as shown to an agent."""
    schemas = _schemas()
    if db_id not in schemas:
        raise KeyError(f"unknown db_id {db_id!r}")
    return schemas[db_id]


# ---------------------------------------------------------------------------
# SQL text helpers
# ---------------------------------------------------------------------------


def _mask_literals(sql: str) -> str:
    """Return ``sql`` with string literals, quoted identifiers and comments blanked out.

    The result has the same length as the input, so positions found in the
    masked text are valid in the original. Used to find keywords, semicolons
    and parentheses that really are SQL syntax.
    """
    out = list(sql)
    i, n = 0, len(sql)
    closers = {"'": "'", '"': '"', "`": "`", "[": "]"}
    while i < n:
        ch = sql[i]
        if ch in closers:
            close = closers[ch]
            j = i + 1
            while j < n:
                if sql[j] == close:
                    # A doubled quote is an escaped quote inside the literal.
                    if close != "]" and j + 1 < n and sql[j + 1] == close:
                        j += 2
                        continue
                    break
                j += 1
            for k in range(i + 1, min(j, n)):
                out[k] = " "
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j == -1 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j == -1 else j + 2
            for k in range(i, j):
                out[k] = " "
            i = j
        else:
            i += 1
    return "".join(out)


def _top_level(masked: str) -> str:
    """Blank out everything inside parentheses of an already masked statement."""
    out = []
    depth = 0
    for ch in masked:
        if ch == "(":
            depth += 1
            out.append(" ")
        elif ch == ")":
            depth = max(depth - 1, 0)
            out.append(" ")
        else:
            out.append(ch if depth == 0 else " ")
    return "".join(out)


def _validate_statement(sql: str) -> str:
    """Check that ``sql`` is one SELECT/WITH statement; return it without trailing ``;``."""
    statement = sql.strip()
    while statement.endswith(";"):
        statement = statement[:-1].rstrip()
    if not statement:
        raise SqlExecutionError("empty query")
    masked = _mask_literals(statement)
    if ";" in masked:
        raise SqlExecutionError("only a single SQL statement is allowed")
    first = re.match(r"[\s(]*([A-Za-z]+)", masked)
    keyword = first.group(1).upper() if first else ""
    if keyword not in ("SELECT", "WITH"):
        raise SqlExecutionError(f"only SELECT or WITH queries are allowed, got {keyword or 'no keyword'!r}")
    return statement


def _has_top_level_order_by(sql: str) -> bool:
    """True when the outermost query has an ORDER BY (not one inside a subquery)."""
    return re.search(r"\bORDER\s+BY\b", _top_level(_mask_literals(sql)), re.IGNORECASE) is not None


# ---------------------------------------------------------------------------
# Execution and scoring
# ---------------------------------------------------------------------------


def execute_readonly(db_id: str, sql: str, timeout_s: float = 2.0, max_rows: int = 200) -> list[tuple[Any, ...]]:
    """Run one SELECT/WITH query on ``db_id`` read-only and return at most ``max_rows`` rows.

    The database is opened with a ``mode=ro`` URI and ``PRAGMA query_only=ON``;
    a progress handler aborts the query once ``timeout_s`` seconds have passed.
    Every failure (rejected statement, sqlite error, timeout) raises
    :class:`SqlExecutionError`.
    """
    statement = _validate_statement(sql)
    path = db_path(db_id)
    if not path.is_file():
        raise FileNotFoundError(f"database file not found: {path}")
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    timed_out = False
    deadline = time.monotonic() + timeout_s

    def _progress() -> int:
        nonlocal timed_out
        if time.monotonic() > deadline:
            timed_out = True
            return 1
        return 0

    try:
        conn.execute("PRAGMA query_only=ON")
        conn.set_progress_handler(_progress, _PROGRESS_STEPS)
        cursor = conn.execute(statement)
        rows = cursor.fetchmany(max_rows)
        return [tuple(row) for row in rows]
    except (sqlite3.Error, sqlite3.Warning) as exc:
        if timed_out:
            raise SqlExecutionError(f"query exceeded the time limit of {timeout_s:g}s") from exc
        raise SqlExecutionError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def _normalize_value(value: Any) -> Any:
    """Make values comparable: floats rounded to 4 decimals, integral floats become ints."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return value
        rounded = round(value, 4)
        if rounded.is_integer():
            return int(rounded)
        return rounded
    return value


def _normalize_rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(_normalize_value(v) for v in row) for row in rows]


def execution_match(pred_sql: str, gold_sql: str, db_id: str, timeout_s: float = 2.0) -> bool:
    """Execution accuracy: does ``pred_sql`` return the same result as ``gold_sql`` on ``db_id``?

    Results are compared as multisets of rows (row order ignored) unless the
    gold query has a top-level ORDER BY, in which case order matters. Floats
    are rounded to 4 decimals and ``3 == 3.0``. A prediction that fails to
    execute scores False; a failing gold query raises :class:`SqlExecutionError`
    because it is a dataset bug.
    """
    gold = _normalize_rows(execute_readonly(db_id, gold_sql, timeout_s, _MATCH_MAX_ROWS))
    try:
        pred = _normalize_rows(execute_readonly(db_id, pred_sql, timeout_s, _MATCH_MAX_ROWS))
    except SqlExecutionError:
        return False
    if _has_top_level_order_by(gold_sql):
        return pred == gold
    return Counter(pred) == Counter(gold)


def result_f1(pred_sql: str, gold_sql: str, db_id: str, timeout_s: float = 2.0) -> float:
    """Partial credit: the F1 of the rows ``pred_sql`` returns against the gold query's rows, as multisets (values
    normalised as in :func:`execution_match`; row order ignored). 0.0 when the prediction fails to run or returns
    nothing; 1.0 exactly when the two results are equal as multisets.

    Meant only to break ties between rollouts whose final rewards are equal (``GRPOConfig(tie_break=True)``): it
    rewards queries whose rows come closer to the answer, so on its own it could be gamed (a query returning every
    row has full recall), but it never outweighs a right answer.
    """
    gold = Counter(_normalize_rows(execute_readonly(db_id, gold_sql, timeout_s, _MATCH_MAX_ROWS)))
    try:
        pred = Counter(_normalize_rows(execute_readonly(db_id, pred_sql, timeout_s, _MATCH_MAX_ROWS)))
    except SqlExecutionError:
        return 0.0
    overlap = sum((pred & gold).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / sum(pred.values()), overlap / sum(gold.values())
    return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------------------
# Reply parsing
# ---------------------------------------------------------------------------

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CTE_START = r"\bWITH\s+(?:RECURSIVE\s+)?[A-Za-z_]\w*\s*(?:\([^)]*\))?\s*AS\s*\("


def _strip_sql(sql: str) -> str:
    sql = sql.strip()
    while sql.endswith(";"):
        sql = sql[:-1].rstrip()
    return sql


def extract_sql(text: str) -> str:
    """Pull the SQL query out of a model reply.

    Order of preference: a fenced block tagged ``sql``; any other fenced block
    (an unterminated fence, as in a truncated reply, runs to the end of the
    text); otherwise the text from the first ``SELECT`` (or CTE ``WITH``) up to
    the first semicolon or the end. Uppercase keywords are preferred over
    lowercase ones so that prose like "select the rows" is skipped. Trailing
    semicolons and whitespace are removed. When nothing looks like SQL the
    stripped text is returned (and will fail to execute).
    """
    blocks = _FENCE_RE.findall(text)
    for lang, body in blocks:
        if lang.lower() in ("sql", "sqlite") and body.strip():
            return _strip_sql(body)
    for _lang, body in blocks:
        if body.strip():
            return _strip_sql(body)
    for flags in (0, re.IGNORECASE):
        starts = [
            m.start()
            for m in (re.search(r"\bSELECT\b", text, flags), re.search(_CTE_START, text, flags))
            if m is not None
        ]
        if starts:
            rest = text[min(starts) :]
            semicolon = _mask_literals(rest).find(";")
            if semicolon != -1:
                rest = rest[:semicolon]
            return _strip_sql(rest)
    return _strip_sql(text)
