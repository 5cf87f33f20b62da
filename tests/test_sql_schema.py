"""The SQL agent reads the schema in front of it: schema views drawn from the task's own database, and an identifier
check that names what exists before SQLite runs a query (examples/sql_agent/schema.py)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.core.store import open_store
from agl.testing import FakeLLM
from examples.sql_agent.agent import ATTR_IDENTIFIER_CHECK, run_sql, sql_agent
from examples.sql_agent.schema import MAX_CELL_CHARS, SAMPLE_ROWS, SCHEMA_VIEWS, check_identifiers, schema_view, tables
from examples.sql_agent.sql_data import SPLITS, SqlExecutionError, db_path, execute_readonly, list_db_ids, load_split
from examples.sql_agent.train import Settings, eval_cache_path, held_out_tasks


def test_check_names_an_unknown_table_and_column_with_what_exists_and_the_likely_meaning() -> None:
    table = check_identifiers("SELECT stnName FROM station", "bikeshare")
    assert table.verdict == "unknown_table" and not table.ok
    assert table.message == (
        'no table "station"; the tables are: tblStation, tblBike, tblRide, tblService; did you mean "tblStation"?'
    )
    qualified = check_identifiers("SELECT s.nme FROM tblStation AS s", "bikeshare")
    assert qualified.verdict == "unknown_column"
    assert qualified.message == (
        'no column "nme" in table "tblStation"; its columns are: stnCode, stnName, district, dockCount; '
        'did you mean "stnName"?'
    )
    bare = check_identifiers("SELECT name FROM tblStation JOIN tblBike ON homeStn = stnCode", "bikeshare")
    assert bare.verdict == "unknown_column"
    assert bare.message.startswith('no column "name" in the tables of its FROM clause (tblStation: stnCode, ')
    assert "tblBike: bikeNo, model" in bare.message and bare.message.endswith('did you mean "stnName"?')
    assert check_identifiers("SELECT rideRef FROM tblRide WHERE (SELECT 1 FROM tblBike WHERE bogus = 1)", "bikeshare")


@pytest.mark.parametrize("split", SPLITS)
def test_every_gold_query_of_every_split_passes_the_check(split: str) -> None:
    verdicts = {t.id: check_identifiers(t.gold_sql, t.db_id).verdict for t in load_split(split)}  # type: ignore[arg-type]
    assert verdicts and {tid: v for tid, v in verdicts.items() if v != "ok"} == {}


QUERIES = [
    # (query on bikeshare, SQLite runs it)
    ('SELECT stnName FROM tblStation WHERE district = "Downtown"', True),  # a double-quoted literal, to SQLite
    ("SELECT district AS d, COUNT(*) AS n FROM tblStation GROUP BY d HAVING n > 1 ORDER BY n", True),
    ("SELECT b.bikeNo FROM tblBike b WHERE EXISTS (SELECT 1 FROM tblRide r WHERE r.bikeNo = b.bikeNo)", True),
    ("SELECT stnName FROM tblStation WHERE stnCode NOT IN (SELECT homeStn FROM tblBike)", True),
    ("WITH busy AS (SELECT fromStn, COUNT(*) AS rides FROM tblRide GROUP BY fromStn) SELECT rides FROM busy", True),
    ("SELECT x.total FROM (SELECT SUM(fareCents) AS total FROM tblRide) AS x", True),
    ("SELECT STNNAME FROM TBLSTATION", True),  # SQLite's names are case-insensitive
    ("SELECT district FROM tblRide", False),
    ("SELECT r.district FROM tblRide r", False),
    ("SELECT rides FROM busy", False),
    ("SELECT b.bikeNo FROM tblBike b WHERE EXISTS (SELECT 1 FROM tblRide r WHERE r.bikeNo = b.missing)", False),
    ("WITH busy AS (SELECT fromStn FROM tblRide) SELECT rides FROM busy", False),
]


@pytest.mark.parametrize(("query", "runs"), QUERIES)
def test_the_check_refuses_exactly_what_sqlite_refuses(query: str, runs: bool) -> None:
    try:
        execute_readonly("bikeshare", query)
        ran = True
    except SqlExecutionError:
        ran = False
    assert ran is runs, "the case itself is wrong"
    assert check_identifiers(query, "bikeshare").ok is runs


def test_a_query_sqlglot_cannot_parse_is_left_to_sqlite() -> None:
    assert check_identifiers("SELEC stnName FROM", "bikeshare").verdict == "unparsed"


def shown(value: object) -> str:
    """A cell as a view shows it."""
    text = "NULL" if value is None else str(value)
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"


@pytest.mark.parametrize("view", [v for v in SCHEMA_VIEWS if v != "compact"])
def test_sample_rows_and_values_in_a_prompt_come_from_the_tasks_own_database(view: str) -> None:
    listed_any = False
    for db_id in list_db_ids():
        text = schema_view(db_id, view)
        conn = sqlite3.connect(db_path(db_id))
        try:
            for table in tables(db_id):
                block = re.search(rf"/\* (\d+) rows from {re.escape(table.name)}:\n(.*?)\n\*/", text, re.DOTALL)
                assert block is not None, f"{db_id}.{table.name}: no sample rows"
                header, *rows = block.group(2).split("\n")
                assert header.split("\t") == list(table.columns)
                stored = conn.execute(f'SELECT * FROM "{table.name}" LIMIT {SAMPLE_ROWS}').fetchall()
                assert int(block.group(1)) == len(stored)
                assert rows == ["\t".join(shown(v) for v in row) for row in stored]
            for table_name, column, values in re.findall(r"^-- (\w+)\.(\w+) values: (.*)$", text, re.MULTILINE):
                listed_any = True
                listed = {v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", values)}
                stored_values = {r[0] for r in conn.execute(f'SELECT DISTINCT "{column}" FROM "{table_name}"')}
                assert listed and listed <= stored_values, f"{db_id}: {table_name}.{column}"
        finally:
            conn.close()
    assert listed_any == (view == "values")


def test_the_compact_view_is_the_create_table_lines_alone() -> None:
    assert "rows from" not in schema_view("bikeshare", "compact")
    assert schema_view("bikeshare", "compact").count("CREATE TABLE") == len(tables("bikeshare"))
    with pytest.raises(ValueError, match="unknown schema view 'wide'"):
        schema_view("bikeshare", "wide")


def test_run_sql_explains_an_unknown_column_and_leaves_it_to_sqlite_without_the_check() -> None:
    with pytest.raises(SqlExecutionError, match='did you mean "stnName"'):
        run_sql.invoke({"db_id": "bikeshare", "query": "SELECT name FROM tblStation"})
    with pytest.raises(SqlExecutionError, match="no such column: name"):
        run_sql.invoke({"db_id": "bikeshare", "query": "SELECT name FROM tblStation", "check_names": False})


def test_evaluation_cache_key_covers_the_schema_view_and_the_check(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    tasks = held_out_tasks(4, seed=0)
    key = eval_cache_path(Settings(out=tmp_path), model, tasks, {})
    assert key != eval_cache_path(Settings(out=tmp_path, schema_view="compact"), model, tasks, {})
    assert key != eval_cache_path(Settings(out=tmp_path, check_names=False), model, tasks, {})


def test_the_rewriter_gets_the_checks_message_and_the_verdict_is_a_span_attribute(tmp_path: Path) -> None:
    task = next(t for t in load_split("independent") if t.id == "bikeshare-4").to_dict()
    rewriter_saw: list[str] = []

    def model(body: dict[str, Any]) -> str:
        system = str(body["messages"][0]["content"])
        if system.startswith("You check"):
            return "CORRECT"
        if "does not answer" in system:
            rewriter_saw.append(str(body["messages"][-1]["content"]))
            return "SELECT rideRef FROM tblRide WHERE fromStn = toStn"
        return "SELECT rideRef FROM tblRide WHERE fromStation = toStn"

    with FakeLLM(model) as fake:
        trainer = agl.Trainer(
            n_runners=1,
            store=f"sqlite:///{tmp_path}/eval.db",
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            agents="writer|rewriter",
        )
        batch = trainer.evaluate(sql_agent, [task])
    assert batch.rewards == [1.0]
    assert len(rewriter_saw) == 1 and 'no column "fromStation" in the tables of its FROM clause' in rewriter_saw[0]
    assert 'did you mean "fromStn"?' in rewriter_saw[0] and "Error: " in rewriter_saw[0]
    store = open_store(f"sqlite:///{tmp_path}/eval.db")
    spans = store.query_spans(rollout_id=batch.rollouts[0].rollout_id)
    verdicts = [s.attributes[ATTR_IDENTIFIER_CHECK] for s in spans if ATTR_IDENTIFIER_CHECK in s.attributes]
    assert verdicts == ["unknown_column", "ok"]


def test_repair_demonstrations_show_the_checks_message_and_train_only_the_gold_fix(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from agl.serving.models import make_tiny_model
    from examples.sql_agent.train import name_guess, repair_demonstrations

    assert [name_guess(n) for n in ("tblStation", "customerNo", '"order date"', "fk_client")] == [
        "station",
        "customer",
        "date",
        "client",
    ]
    tokenizer = AutoTokenizer.from_pretrained(make_tiny_model(tmp_path / "tiny"))
    tasks = load_split("train", 40)
    samples = repair_demonstrations(tokenizer, tasks, "rows")
    assert len(samples) >= 10, "a gold query gives a repair wherever its guessed name does not exist"
    golds = {t.gold_sql for t in tasks}
    for sample in samples:
        cut = sample.completion_mask.index(1)
        assert set(sample.completion_mask[cut:]) == {1}
        prompt = str(tokenizer.decode(sample.input_ids[:cut]))
        assert "does not answer the question" in prompt and "rows from" in prompt
        assert re.search(r"Error: no (table|column) \"", prompt), prompt[-300:]
        assert str(tokenizer.decode(sample.input_ids[cut:], skip_special_tokens=True)).strip() in golds
