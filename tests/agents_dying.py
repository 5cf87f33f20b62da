"""An agent module whose import kills any runner process that loads it (the parent that checks it survives)."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

if multiprocessing.parent_process() is not None:
    os._exit(13)


def agent(task: Any, resources: dict[str, Any]) -> float:
    """Never runs in a runner: the process is gone before."""
    return 1.0
