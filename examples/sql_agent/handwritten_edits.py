"""APO on the SQL agent with hand-written prompt edits in place of an optimizer LLM.

    python -m examples.sql_agent.handwritten_edits --policy runs/<run>/sft [any other train.py option]

The optimizer endpoint is a local scripted server (``agl.testing.FakeLLM``) that answers every edit request with the
versions in ``EDITS`` for the targeted prompt; everything else is the real APO run of ``train.py --method apo``: real
rollouts of the agent, Pareto selection over tasks, validation on dev databases, test accuracy before and after. It
separates what APO's search and selection do with sensible edits from what a small optimizer model can write, and
measures how much the prompt wording alone moves this agent.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from agl.testing import FakeLLM
from examples.sql_agent.train import main as train_main

EDITS = {
    "writer_prompt": [
        "You are an expert SQLite developer. Use only tables and columns that appear in the schema. Given the schema "
        "and a question, write one SQLite query that answers it. Reply with only the SQL query, no explanation.",
        "Write one SQLite query that answers the question. Use the exact table and column names of the schema and "
        "join tables through their foreign keys. Select only the columns the question asks for. Reply with only the "
        "SQL query.",
    ],
    "rewriter_prompt": [
        "You are an expert SQLite developer. The query below is wrong or failed. Read the error or the result, check "
        "every table and column name against the schema, and write a corrected SQLite query. Reply with only the SQL "
        "query.",
        "The query below does not answer the question. Write a new SQLite query that answers it, using only tables "
        "and columns from the schema. Reply with only the SQL query, no explanation.",
    ],
}
_TARGET = re.compile(r'each between <prompt name="(\w+)">')


def scripted_optimizer(body: dict[str, Any]) -> str:
    """A fixed note for critique requests; the hand-written versions of the targeted prompt for edit requests."""
    text = str(body["messages"][-1]["content"])
    target = _TARGET.search(text)
    if target is None or target.group(1) not in EDITS:
        return "Hand-written edits follow; no critique."
    name = target.group(1)
    return "\n".join(f'<prompt name="{name}">{version}</prompt>' for version in EDITS[name])


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    with FakeLLM(scripted_optimizer) as optimizer:
        extra = ["--optimizer-base-url", optimizer.base_url, "--optimizer-model", "handwritten-edits"]
        return train_main(["--method", "apo", *args, *extra])


if __name__ == "__main__":
    sys.exit(main())
