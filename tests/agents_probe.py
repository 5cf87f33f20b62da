"""An agent that reports what its runner process holds: which modules were imported before its rollout started, and
the environment variable ``AGL_TEST_PROBE``."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import agl

#: The process that imported this module: the fork server of its agents, or the runner itself when spawned.
IMPORTED_IN = os.getpid()

#: Modules whose presence the agent reports: the runner side agl's fork server preloads, and an agent module that
#: no runner of this agent needs (another test module's agents).
PROBED = ("agl.core.store.http", "tests.agents_basic")


def probe_agent(task: Any, resources: dict[str, Any]) -> float:
    """Emits ``{"pid": ..., "imported_in": ..., "modules": {name: imported?}, "env": ..., "frozen": ...}`` for
    ``PROBED``; ``imported_in``: the process that imported this module; ``frozen``: how many objects the garbage
    collector never visits (``gc.freeze``)."""
    modules = {name: name in sys.modules for name in PROBED}
    env = os.environ.get("AGL_TEST_PROBE")
    agl.emit_object(
        "probe",
        {
            "pid": os.getpid(),
            "imported_in": IMPORTED_IN,
            "modules": modules,
            "env": env,
            "frozen": gc.get_freeze_count(),
        },
    )
    return 1.0
