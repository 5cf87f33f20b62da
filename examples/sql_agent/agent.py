"""A LangGraph SQL agent: writer → execute → checker → rewriter, looping at most ``max_turns`` rewrites.

It is an ordinary LangGraph program: it runs without agl (``python -m examples.sql_agent.agent --base-url ...``).
Inside an agl rollout the LangChain integration captures it with no change: node names (``writer``, ``checker``,
``rewriter``) become agent names, the ``run_sql`` tool becomes tool spans, and ``agl.emit_reward`` is a no-op outside
a rollout. With the task's gold query known, each executed query's partial credit (``result_f1``) is emitted as
the tie-break reward of the call that wrote it (``agl.TIE_BREAK_REWARD``; LightningRL uses it only with
``GRPOConfig(tie_break=True)``, and only in groups whose final rewards are all equal).

The writer and rewriter see the schema in the task's ``schema_view`` (``schema.SCHEMA_VIEWS``: with sample rows and
category values by default), and ``run_sql`` resolves a query's names against the schema before SQLite runs it
(``schema.check_identifiers``): an unknown table or column comes back as a message naming what exists and what was
probably meant, and the verdict is recorded as the ``sql.identifier_check`` attribute of a message span.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import agl
from examples.sql_agent.schema import DEFAULT_SCHEMA_VIEW, SCHEMA_VIEWS, check_identifiers, schema_view
from examples.sql_agent.sql_data import (
    SqlExecutionError,
    execute_readonly,
    execution_match,
    extract_sql,
    result_f1,
)

WRITER_PROMPT = (
    "You are an expert SQLite developer. Given a database schema and a question, write one SQLite query that answers "
    "it. Reply with only the SQL query."
)
CHECKER_PROMPT = (
    "You check SQL queries. Given a question, a query and its result, reply CORRECT if the result answers the "
    "question, otherwise reply WRONG and say why in one sentence."
)
REWRITER_PROMPT = (
    "You are an expert SQLite developer. The query below does not answer the question. Write a corrected SQLite "
    "query. Reply with only the SQL query."
)
MAX_TURNS = 2
CHECKER_MAX_TOKENS = 16
ATTR_IDENTIFIER_CHECK = "sql.identifier_check"
"""The message span's attribute holding ``check_identifiers``' verdict on a query run_sql was given."""


def writer_messages(question: str, schema: str, prompt: str = WRITER_PROMPT) -> list[dict[str, str]]:
    """The writer's chat messages, exactly as the graph sends them (demonstrations are built from the same)."""
    return [
        {"role": "system", "content": prompt},
        {"role": "user", "content": f"Schema:\n{schema}\n\nQuestion: {question}"},
    ]


def rewriter_messages(
    question: str, schema: str, sql: str, problem: str, prompt: str = REWRITER_PROMPT
) -> list[dict[str, str]]:
    """The rewriter's chat messages, exactly as the graph sends them: ``problem`` is ``Error: <message>`` when the
    query failed (the identifier check's message included), else ``Result:`` and its first rows."""
    return [
        {"role": "system", "content": prompt},
        {"role": "user", "content": f"Schema:\n{schema}\n\nQuestion: {question}\nQuery: {sql}\n{problem}"},
    ]


class SqlState(TypedDict, total=False):
    """What flows between nodes."""

    question: str
    db_id: str
    schema: str
    gold_sql: str  # only for the tie-break reward; never shown to a model
    sql: str
    result: str
    error: str | None
    verdict: str
    turns: int


@tool
def run_sql(db_id: str, query: str, check_names: bool = True) -> str:
    """Run a read-only SQLite query on database ``db_id`` and return up to 10 result rows; with ``check_names``, a
    query naming a table or column the database lacks fails first with a message saying what exists."""
    if check_names:
        check = check_identifiers(query, db_id)
        agl.emit_message(f"identifier check: {check.verdict}", **{ATTR_IDENTIFIER_CHECK: check.verdict})
        if not check.ok:
            raise SqlExecutionError(check.message)
    rows = execute_readonly(db_id, query, timeout_s=2.0, max_rows=50)
    shown = "\n".join(str(tuple(r)) for r in rows[:10])
    more = f"\n... ({len(rows)} rows in all)" if len(rows) > 10 else ""
    return (shown + more) if rows else "(no rows)"


def _prompt(resources: dict[str, Any], name: str, default: str) -> str:
    res = resources.get(name)
    return res.template if isinstance(res, agl.PromptTemplate) else default


def build_graph(
    llm: ChatOpenAI, resources: dict[str, Any] | None = None, max_turns: int = MAX_TURNS, check_names: bool = True
) -> Any:
    """The compiled graph; ``resources`` may carry ``writer_prompt`` / ``rewriter_prompt`` / ``checker_prompt``;
    ``check_names`` False leaves unknown names to SQLite's own error (the agent before the identifier check)."""
    res = resources or {}
    writer_prompt = _prompt(res, "writer_prompt", WRITER_PROMPT)
    checker_prompt = _prompt(res, "checker_prompt", CHECKER_PROMPT)
    rewriter_prompt = _prompt(res, "rewriter_prompt", REWRITER_PROMPT)

    checker_llm = llm.bind(max_tokens=CHECKER_MAX_TOKENS)

    def writer(state: SqlState) -> SqlState:
        msg = llm.invoke(writer_messages(state["question"], state["schema"], writer_prompt))
        return {"sql": extract_sql(str(msg.content)), "turns": 0}

    def execute(state: SqlState) -> SqlState:
        if state.get("gold_sql"):  # partial credit for the call that wrote this query (it lands on that call)
            agl.emit_reward(result_f1(state["sql"], state["gold_sql"], state["db_id"]), name=agl.TIE_BREAK_REWARD)
        try:
            result = run_sql.invoke({"db_id": state["db_id"], "query": state["sql"], "check_names": check_names})
        except SqlExecutionError as exc:
            return {"result": "", "error": exc.message}
        return {"result": str(result), "error": None}

    def checker(state: SqlState) -> SqlState:
        msg = checker_llm.invoke(
            [
                SystemMessage(checker_prompt),
                HumanMessage(f"Question: {state['question']}\nQuery: {state['sql']}\nResult:\n{state['result'][:800]}"),
            ]
        )
        text = str(msg.content).strip().upper()
        return {"verdict": "correct" if re.match(r"\W*CORRECT", text) else "wrong"}

    def rewriter(state: SqlState) -> SqlState:
        problem = f"Error: {state['error']}" if state.get("error") else f"Result:\n{state['result'][:800]}"
        msg = llm.invoke(rewriter_messages(state["question"], state["schema"], state["sql"], problem, rewriter_prompt))
        return {"sql": extract_sql(str(msg.content)), "turns": state.get("turns", 0) + 1}

    def after_execute(state: SqlState) -> str:
        if state.get("error"):
            return "rewriter" if state.get("turns", 0) < max_turns else END
        return "checker"

    def after_check(state: SqlState) -> str:
        if state["verdict"] == "correct" or state.get("turns", 0) >= max_turns:
            return END
        return "rewriter"

    g = StateGraph(SqlState)
    g.add_node("writer", writer)
    g.add_node("execute", execute)
    g.add_node("checker", checker)
    g.add_node("rewriter", rewriter)
    g.add_edge(START, "writer")
    g.add_edge("writer", "execute")
    g.add_conditional_edges("execute", after_execute, ["checker", "rewriter", END])
    g.add_conditional_edges("checker", after_check, ["rewriter", END])
    g.add_edge("rewriter", "execute")
    return g.compile()


def make_llm(resources: dict[str, Any]) -> ChatOpenAI:
    """The chat model from the ``main_llm`` resource (inside agl its base_url is the gateway)."""
    llm = resources["main_llm"]
    sampling = dict(llm.sampling)
    return ChatOpenAI(
        base_url=llm.base_url,
        api_key=llm.api_key,
        model=llm.model,
        temperature=sampling.pop("temperature", 0.0),
        max_completion_tokens=sampling.pop("max_tokens", 160),  # the field's init name (sent as max_tokens)
        max_retries=1,
        timeout=600,
        model_kwargs=sampling,
    )


def solve(task: dict[str, Any], resources: dict[str, Any]) -> SqlState:
    """Run the graph on one task and return its final state. Besides the question, the task may set ``max_turns``,
    ``schema_view`` (a name of ``schema.SCHEMA_VIEWS``) and ``check_names`` (False: no identifier check)."""
    graph = build_graph(
        make_llm(resources), resources, int(task.get("max_turns", MAX_TURNS)), bool(task.get("check_names", True))
    )
    view = task.get("schema_view", DEFAULT_SCHEMA_VIEW)
    state: SqlState = {"question": task["question"], "db_id": task["db_id"], "schema": schema_view(task["db_id"], view)}
    if task.get("gold_sql"):
        state["gold_sql"] = task["gold_sql"]
    result: SqlState = graph.invoke(state, {"recursion_limit": 4 * MAX_TURNS + 8})
    return result


def sql_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The agl agent: reward 1.0 when the final query's result matches the gold query's (execution match)."""
    final = solve(task, resources)
    return 1.0 if execution_match(final.get("sql", ""), task["gold_sql"], task["db_id"]) else 0.0


def main() -> None:
    from examples.sql_agent.sql_data import load_split

    p = argparse.ArgumentParser(description="Run the SQL agent on a few questions, without agl.")
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="none")
    p.add_argument("--split", default="dev")
    p.add_argument("-n", type=int, default=5)
    p.add_argument("--schema-view", choices=SCHEMA_VIEWS, default=DEFAULT_SCHEMA_VIEW)
    args = p.parse_args()
    resources = {"main_llm": agl.LLM(base_url=args.base_url, model=args.model, api_key=args.api_key)}
    for t in load_split(args.split, args.n):
        state = solve({**t.to_dict(), "schema_view": args.schema_view}, resources)
        ok = execution_match(state.get("sql", ""), t.gold_sql, t.db_id)
        print(f"{'✓' if ok else '✗'} {t.question}\n   {state.get('sql')}")


if __name__ == "__main__":
    main()
