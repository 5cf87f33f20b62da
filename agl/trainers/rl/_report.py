"""Per-round RL metrics files: ``rl_metrics.csv`` and ``rl_metrics.json`` in the run folder, rewritten each round.

Rewriting (to a temporary file, then rename) keeps both files complete and readable at any moment, and lets columns
that appear later (validation rounds) join the CSV header. Single writer.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CSV_NAME = "rl_metrics.csv"
JSON_NAME = "rl_metrics.json"


def write_metrics(run_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write every row so far to ``run_dir/rl_metrics.csv`` (union of columns, first-seen order) and ``.json``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    tmp = run_dir / f".{CSV_NAME}.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, run_dir / CSV_NAME)
    tmp = run_dir / f".{JSON_NAME}.tmp"
    clean = [{k: _finite(v) for k, v in row.items()} for row in rows]
    tmp.write_text(json.dumps(clean, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, run_dir / JSON_NAME)


def _finite(value: Any) -> Any:
    """NaN/inf become None so the JSON file is standard JSON."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
