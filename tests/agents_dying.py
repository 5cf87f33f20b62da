"""An agent module whose import kills the process that loads it to run the agent: a runner, or the fork server its
runners start from (``python -c``); the ``agl runner`` process that checks it survives."""

from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any

if multiprocessing.parent_process() is not None or sys.argv == ["-c"]:
    os._exit(13)


def agent(task: Any, resources: dict[str, Any]) -> float:
    """Never runs in a runner: the process is gone before."""
    return 1.0
