"""An agent that imports a module only when it runs (as libraries load parts lazily): a pool's template learns it
from its first runner and imports it before forking the others."""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any

import agl

#: A standard-library module neither agl nor this module imports.
LAZY = "wave"


def lazy_import_agent(task: Any, resources: dict[str, Any]) -> float:
    """Records whether ``LAZY`` was already imported when the rollout started, and in which process; imports it."""
    agl.emit_object("lazy", {"imported_before": LAZY in sys.modules, "pid": os.getpid()})
    importlib.import_module(LAZY)
    time.sleep(0.02)  # a rollout takes a moment: every runner gets some
    return 1.0
