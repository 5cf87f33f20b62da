"""Tests for the bundled text-to-SQL dataset and its loading/scoring API."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # make `examples` importable however pytest is started
    sys.path.insert(0, str(ROOT))

from examples.sql_agent import build_dataset  # noqa: E402
from examples.sql_agent.schema import tables  # noqa: E402
from examples.sql_agent.sql_data import (  # noqa: E402
    DATA_DIR,
    SPLITS,
    TIERS,
    SqlExecutionError,
    SqlTask,
    db_path,
    execute_readonly,
    execution_match,
    extract_sql,
    list_db_ids,
    load_split,
    result_f1,
    schema_text,
)

DB = "sports"  # any bundled database works for the behavioural tests


@pytest.fixture(scope="module")
def all_tasks() -> dict[str, list[SqlTask]]:
    return {split: load_split(split) for split in SPLITS}


# ---------------------------------------------------------------------------
# Dataset content
# ---------------------------------------------------------------------------


def test_sizes(all_tasks: dict[str, list[SqlTask]]) -> None:
    tasks = [t for ts in all_tasks.values() for t in ts]
    db_ids = {t.db_id for t in tasks}
    independent = {t.db_id for t in all_tasks["independent"]}
    assert len(db_ids) >= 8
    assert len(tasks) >= 600
    for db_id in db_ids:
        assert db_path(db_id).is_file()
        assert sum(t.db_id == db_id for t in tasks) >= (10 if db_id in independent else 60)
    assert len(all_tasks["independent"]) >= 40


def test_ids_unique_and_well_formed(all_tasks: dict[str, list[SqlTask]]) -> None:
    tasks = [t for ts in all_tasks.values() for t in ts]
    assert len({t.id for t in tasks}) == len(tasks)
    for t in tasks:
        prefix, _, number = t.id.rpartition("-")
        assert prefix == t.db_id and number.isdigit()
        assert t.tier in TIERS
        assert t.question.strip() and t.gold_sql.strip()


def test_split_by_database(all_tasks: dict[str, list[SqlTask]]) -> None:
    owners: dict[str, set[str]] = {}
    for split, tasks in all_tasks.items():
        for t in tasks:
            owners.setdefault(t.db_id, set()).add(split)
    shared = {db: splits for db, splits in owners.items() if len(splits) > 1}
    assert not shared
    stats = json.loads((DATA_DIR / "stats.json").read_text())
    for split, tasks in all_tasks.items():
        assert sorted({t.db_id for t in tasks}) == stats["splits"][split]["db_ids"]
        assert len(tasks) == stats["splits"][split]["questions"]


def test_training_set_spans_many_databases_and_conventions() -> None:
    stats = json.loads((DATA_DIR / "stats.json").read_text())
    train = stats["splits"]["train"]
    assert len(train["db_ids"]) >= 40 and train["questions"] >= 2000
    assert train["rephrased"] >= 0.45 * train["questions"], "about half of the questions rephrased"
    smallest, largest = train["tables_per_db"]
    assert smallest <= 3 and 9 <= largest <= 15
    styles = {stats["databases"][db_id]["style"] for db_id in train["db_ids"]}
    assert len(styles) >= 30, "conventions differ from database to database"
    text = "\n".join(schema_text(db_id) for db_id in train["db_ids"])
    for convention in (r"(_no|No) INT(EGER)? PRIMARY KEY", r"(_ref|Ref) INT", r"\b(fk_|fk[A-Z])", r"FOREIGN KEY \("):
        assert re.search(convention, text), convention
    assert " VARCHAR(80)" in text and " FLOAT" in text, "ANSI type names"


def test_training_databases_draw_names_no_question_word_gives_away() -> None:
    stats = json.loads((DATA_DIR / "stats.json").read_text())
    train = stats["splits"]["train"]["db_ids"]
    styles = " | ".join(stats["databases"][db_id]["style"] for db_id in train)
    for convention in ("upper", "spaced", "tables tbl<x>", "tables t_<x>", "tables <x>_data", "synonyms", "legacy"):
        assert convention in styles, convention
    text = "\n".join(schema_text(db_id) for db_id in train)
    assert re.search(r'CREATE TABLE "[a-z]+ [a-z ]+" \(', text), "a quoted table name with a space"
    assert re.search(r"CREATE TABLE [A-Z]+_[A-Z_]+ \(", text), "an UPPER_SNAKE table"
    assert re.search(r"CREATE TABLE (tbl[A-Z]\w+|t_\w+|\w+_data) \(", text), "a table prefix or suffix"
    assert re.search(r"\b([Cc]lients?|CLIENTS?|[Tt]own|TOWN)\b", text), "a synonym of the question's word"
    questions = {t.db_id: t for t in load_split("train")}
    spaced = next(db_id for db_id in train if "spaced" in stats["databases"][db_id]["style"])
    assert '"' in questions[spaced].gold_sql, "the gold queries of a spaced schema quote its names"


def test_training_data_never_holds_a_dev_test_or_independent_database(all_tasks: dict[str, list[SqlTask]]) -> None:
    stats = json.loads((DATA_DIR / "stats.json").read_text())
    held_out = {db_id for split in ("dev", "test", "independent") for db_id in stats["splits"][split]["db_ids"]}
    held_out_domains = {s for db_id in held_out for s in stats["databases"][db_id].get("sources", [db_id])}
    train_ids = set(stats["splits"]["train"]["db_ids"])
    assert train_ids == {t.db_id for t in all_tasks["train"]} and not train_ids & held_out
    for db_id in train_ids:
        sources = set(stats["databases"][db_id]["sources"])
        assert sources and not sources & held_out_domains, f"{db_id} is built from a held-out domain"
    train_tables = [table_names(d) for d in train_ids]
    for db_id in held_out:
        tables = table_names(db_id)
        assert not any(tables <= mine for mine in train_tables), f"a training database holds {db_id}'s tables"
    independent = {name for db_id in stats["splits"]["independent"]["db_ids"] for name in table_names(db_id)}
    assert not independent & set().union(*train_tables), "a generated table takes a hand-written database's name"


def table_names(db_id: str) -> set[str]:
    """The case-folded table names of ``db_id``, read from its file (quoted names included)."""
    return {t.name.casefold() for t in tables(db_id)}


def test_every_tier_in_every_split(all_tasks: dict[str, list[SqlTask]]) -> None:
    for split, tasks in all_tasks.items():
        counts = Counter(t.tier for t in tasks)
        assert set(counts) == set(TIERS), split
        # Simple questions must be a good share so a tiny model can learn.
        assert counts["easy"] / len(tasks) >= 0.25


def test_gold_queries_execute_and_mostly_nonempty(all_tasks: dict[str, list[SqlTask]]) -> None:
    tasks = [t for ts in all_tasks.values() for t in ts]
    nonempty = 0
    for t in tasks:
        rows = execute_readonly(t.db_id, t.gold_sql, timeout_s=5.0, max_rows=10_000)
        nonempty += bool(rows)
        # The gold query trivially matches itself (also exercises the ORDER BY path).
        assert execution_match(t.gold_sql, t.gold_sql, t.db_id)
    assert nonempty / len(tasks) >= 0.9


def test_schema_text_lists_every_table() -> None:
    assert len(list_db_ids()) >= 8
    for db_id in list_db_ids():
        text = schema_text(db_id)
        with closing(sqlite3.connect(db_path(db_id))) as conn:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert 3 <= len(tables) <= 15
        for table in tables:
            assert f"CREATE TABLE {table} (" in text or f'CREATE TABLE "{table}" (' in text
        assert "REFERENCES" in text
    with pytest.raises(KeyError):
        schema_text("no_such_db")


def test_load_split_limit_and_roundtrip() -> None:
    first = load_split("dev", limit=5)
    assert len(first) == 5
    assert first == load_split("dev")[:5]
    task = first[0]
    assert SqlTask.from_dict({**task.to_dict(), "extra": 1}) == task
    assert set(task.to_dict()) == {"id", "db_id", "question", "gold_sql", "tier"}
    with pytest.raises(ValueError):
        load_split("validation")  # type: ignore[arg-type]
    assert SPLITS == ("train", "dev", "test", "independent")


def test_generated_databases_vary_their_schema_conventions() -> None:
    train_dbs = {t.db_id for t in load_split("train")}
    schemas = {db_id: schema_text(db_id) for db_id in train_dbs}
    text = "\n".join(schemas.values())
    assert "department_id" in text and "DeptId" in text and "airlineId" in text, "snake, Pascal and camel case"
    assert "CREATE TABLE Department (" in text and "CREATE TABLE departments (" in text, "singular and plural"
    assert "DepartmentId INTEGER PRIMARY KEY" in text and "(id INTEGER PRIMARY KEY" in text, "key styles"
    assert re.search(r"\b(order_yr|orderYr|OrderYr|ORDER_YR)\b", text), "abbreviated column words"
    assert "CREATE TABLE orders (" in text, "a singular that is an SQL keyword (order) stays plural"
    widths = {len(line.split(", ")) for s in schemas.values() for line in s.splitlines()}
    assert max(widths) - min(widths) >= 4, "schema size varies (distractor columns)"
    questions = [t.question for t in load_split("train")]
    assert any(q[0].islower() for q in questions) and any(q.startswith("Question: ") for q in questions)


def test_independent_group_is_hand_written_apart_from_the_generator(all_tasks: dict[str, list[SqlTask]]) -> None:
    independent = all_tasks["independent"]
    assert len(independent) >= 40 and len({t.db_id for t in independent}) >= 3
    generated = {t.db_id for split in ("train", "dev", "test") for t in all_tasks[split]}
    generated_tables = {name for db_id in generated for name in table_names(db_id)}
    for db_id in {t.db_id for t in independent}:
        assert db_id not in generated
        assert not table_names(db_id) & generated_tables, f"{db_id} shares table names with the generator"
    template_sql = {t.gold_sql.split(" FROM ")[0] for split in ("train", "dev", "test") for t in all_tasks[split]}
    assert sum(t.gold_sql.split(" FROM ")[0] in template_sql for t in independent) < len(independent) / 4
    for t in independent:
        rows = execute_readonly(t.db_id, t.gold_sql, timeout_s=5.0, max_rows=10_000)
        assert rows and any(v is not None for row in rows for v in row), t.id


def test_independent_question_with_unusable_gold_stops_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "independent"
    source.mkdir()
    for sql_file in build_dataset.INDEPENDENT_DIR.glob("*.sql"):
        (source / sql_file.name).write_text(sql_file.read_text())
    bad = {"db_id": "harbor", "tier": "easy", "question": "?", "gold_sql": "SELECT * FROM PORT WHERE 1 = 0"}
    (source / "questions.jsonl").write_text(json.dumps(bad) + "\n")
    monkeypatch.setattr(build_dataset, "INDEPENDENT_DIR", source)
    (tmp_path / "dbs").mkdir()
    with pytest.raises(ValueError, match="line 1: the gold query gives no usable result"):
        build_dataset.independent_databases(tmp_path / "dbs")


# ---------------------------------------------------------------------------
# execute_readonly / execution_match
# ---------------------------------------------------------------------------


def test_result_f1_gives_partial_credit_for_overlapping_rows() -> None:
    gold = "SELECT name FROM teams"
    assert result_f1("SELECT name FROM teams ORDER BY name DESC", gold, DB) == 1.0
    n = len(execute_readonly(DB, gold))
    some = n // 4
    f1 = result_f1(f"SELECT name FROM teams LIMIT {some}", gold, DB)
    assert f1 == pytest.approx(2 * 1.0 * (some / n) / (1.0 + some / n))
    assert result_f1("SELECT conference FROM teams", gold, DB) == 0.0, "no row in common"
    assert result_f1("SELECT nope FROM teams", gold, DB) == 0.0, "a query that fails earns nothing"
    assert result_f1("SELECT name FROM teams WHERE 1 = 0", gold, DB) == 0.0


def test_order_insensitive_without_order_by() -> None:
    gold = "SELECT name FROM teams"
    assert execution_match("SELECT name FROM teams ORDER BY name DESC", gold, DB)
    assert not execution_match("SELECT name FROM teams LIMIT 3", gold, DB)
    # Multisets: duplicates count.
    assert not execution_match("SELECT DISTINCT conference FROM teams", "SELECT conference FROM teams", DB)


def test_order_sensitive_with_top_level_order_by() -> None:
    gold = "SELECT name FROM teams ORDER BY stadium_cap DESC"
    assert execution_match("SELECT name FROM teams ORDER BY stadium_cap DESC", gold, DB)
    assert not execution_match("SELECT name FROM teams ORDER BY stadium_cap ASC", gold, DB)
    assert not execution_match("SELECT name FROM teams", gold, DB)
    # An ORDER BY inside a subquery does not make the comparison order-sensitive.
    nested = "SELECT name FROM (SELECT name FROM teams ORDER BY stadium_cap DESC LIMIT 5)"
    assert execution_match(
        "SELECT name FROM (SELECT name, stadium_cap FROM teams ORDER BY stadium_cap DESC LIMIT 5) ORDER BY name",
        nested,
        DB,
    )


def test_float_and_int_normalisation() -> None:
    assert execution_match("SELECT 3.0", "SELECT 3", DB)
    assert execution_match("SELECT 0.1 + 0.2", "SELECT 0.3", DB)
    assert execution_match("SELECT 2.00001", "SELECT 2", DB)
    assert not execution_match("SELECT 3.1", "SELECT 3", DB)
    assert not execution_match("SELECT '3'", "SELECT 3", DB)


def test_failing_prediction_is_false() -> None:
    gold = "SELECT COUNT(*) FROM teams"
    assert not execution_match("SELECT COUNT(*) FROM no_such_table", gold, DB)
    assert not execution_match("this is not sql", gold, DB)
    assert not execution_match("", gold, DB)
    with pytest.raises(SqlExecutionError, match="no such column"):
        execute_readonly(DB, "SELECT nope FROM teams")


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM teams",
        "DROP TABLE teams",
        "UPDATE teams SET name = 'x'",
        "INSERT INTO teams (name) VALUES ('x')",
        "PRAGMA table_info(teams)",
        "ATTACH DATABASE ':memory:' AS other",
        "SELECT 1; DELETE FROM teams",
        "WITH t AS (SELECT 1) DELETE FROM teams",
    ],
)
def test_non_select_rejected(sql: str) -> None:
    before = execute_readonly(DB, "SELECT COUNT(*) FROM teams")
    with pytest.raises(SqlExecutionError):
        execute_readonly(DB, sql)
    assert not execution_match(sql, "SELECT COUNT(*) FROM teams", DB)
    assert execute_readonly(DB, "SELECT COUNT(*) FROM teams") == before


def test_select_details() -> None:
    assert execute_readonly(DB, "SELECT ';' AS s;  ") == [(";",)]
    assert execute_readonly(DB, "  with x AS (SELECT 1) SELECT * FROM x") == [(1,)]
    assert len(execute_readonly(DB, "SELECT name FROM players", max_rows=7)) == 7


def test_timeout_on_runaway_recursive_cte() -> None:
    sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    start = time.monotonic()
    with pytest.raises(SqlExecutionError, match="time limit"):
        execute_readonly(DB, sql, timeout_s=0.3)
    assert time.monotonic() - start < 5.0
    assert not execution_match(sql, "SELECT 1", DB, timeout_s=0.3)


# ---------------------------------------------------------------------------
# extract_sql
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```sql\nSELECT name FROM teams;\n```", "SELECT name FROM teams"),
        (
            "Plan:\n```\nnot this\n```\nAnswer:\n```SQL\nSELECT 1;\n```",
            "SELECT 1",
        ),
        ("Here you go:\n```\nSELECT a\nFROM b\n```\nDone.", "SELECT a\nFROM b"),
        ("The query is SELECT COUNT(*) FROM teams; it counts teams.", "SELECT COUNT(*) FROM teams"),
        ("SELECT name FROM t WHERE x = 'a;b';", "SELECT name FROM t WHERE x = 'a;b'"),
        ("I will select the rows. SELECT id FROM t", "SELECT id FROM t"),
        ("select id from t;;  ", "select id from t"),
        (
            "Use a CTE: WITH s AS (SELECT 1 AS v) SELECT v FROM s;",
            "WITH s AS (SELECT 1 AS v) SELECT v FROM s",
        ),
        ("```sql\nSELECT 1 -- truncated reply", "SELECT 1 -- truncated reply"),
        ("  no query here  ", "no query here"),
    ],
)
def test_extract_sql(text: str, expected: str) -> None:
    assert extract_sql(text) == expected


# ---------------------------------------------------------------------------
# Build script
# ---------------------------------------------------------------------------


def _dump(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as conn:
        return list(conn.iterdump())


def test_build_is_deterministic_and_matches_committed_data(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    stats_a = build_dataset.build(first)
    stats_b = build_dataset.build(second)
    assert stats_a == stats_b
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl", "independent.jsonl", "schemas.json"):
        data = (first / name).read_bytes()
        assert data == (second / name).read_bytes(), name
        assert data == (DATA_DIR / name).read_bytes(), f"{name} is stale: rerun build_dataset.py"
    for db_file in sorted((first / "dbs").glob("*.sqlite")):
        assert _dump(db_file) == _dump(second / "dbs" / db_file.name)
        assert _dump(db_file) == _dump(DATA_DIR / "dbs" / db_file.name)
    total = sum(p.stat().st_size for p in (DATA_DIR / "dbs").glob("*.sqlite"))
    assert total < 8_000_000
