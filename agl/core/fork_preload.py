"""Imported last by a runner fork server (``agl.core.fork_servers``): imports the agent's module the server is for
(env ``AGL_FORK_AGENT_MODULE``, after the frameworks' telemetry switches are set) with the integrations of the
frameworks it imported, then moves every object created so far into the garbage collector's permanent generation
(``gc.freeze``).

A forked runner shares those objects' pages with the fork server until something writes to them, and a collection
writes to every object it visits; frozen ones it never visits, so their pages stay shared across the runners.
Measured with the SQL agent (2-core AMD EPYC): 97 → 72 MiB of proportional memory per runner with agl and the
OpenAI SDK frozen; once LangGraph and the agent's module are imported here rather than in each runner, 16 runners
waiting for work hold 304 instead of 1,080 MiB, and 0.8–1.05 instead of 1.1–1.3 GiB in the demo's rollouts (a
working runner writes to the shared objects' reference counts, which copies their pages).

An agent module that fails to import is left for each runner to import again: the error is then raised where the
pool reports it (a runner that cannot start), not here, where nobody would see it."""

import contextlib
import gc
import importlib
import os

from agl.core.integration_scopes import forget_installed_integrations, warm_integrations
from agl.core.telemetry import quiet_framework_telemetry

#: The environment variable that names the agent's module to a fork server as it starts.
ENV_AGENT_MODULE = "AGL_FORK_AGENT_MODULE"

_module = os.environ.pop(ENV_AGENT_MODULE, "")
if _module:
    quiet_framework_telemetry()  # before the agent's module imports its framework, as a runner does
    with contextlib.suppress(BaseException):
        importlib.import_module(_module)
        warm_integrations()
    forget_installed_integrations()  # each runner reads them with its own sys.path
gc.collect()
gc.freeze()
