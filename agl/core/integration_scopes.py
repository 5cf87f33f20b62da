"""Which integrations a rollout enters.

A framework is in use in a runner process when its module is imported there (the agent's module imported it) or when
the runner was told so (``integrations=[...]``); only those are imported and entered, so one framework's hooks and
telemetry never see another's agent. See ``integration_scopes``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import logging
import sys
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from agl.core.emit import current_rollout, record_exception
from agl.core.types import ATTR_INTEGRATION

log = logging.getLogger("agl.runner")


@functools.cache
def _integrations() -> tuple[tuple[str, str], ...]:
    """Installed integrations: entry points of group ``agl.integrations`` as (framework module, target), the name
    being the module whose presence in ``sys.modules`` means the framework is in use."""
    return tuple((ep.name, ep.value) for ep in importlib.metadata.entry_points(group="agl.integrations"))


def forget_installed_integrations() -> None:
    """Read the installed integrations again at the next lookup: a process forked after this one looked may run
    with another ``sys.path`` (a runner gets its pool's) and so other entry points."""
    _integrations.cache_clear()


_warned_integrations: set[str] = set()


def _integration_names(framework: str, target: str) -> tuple[str, ...]:
    """The names a user may declare an integration by: its framework module, its integration module's last part
    (unless private: ``_http``)."""
    module = target.partition(":")[0].rpartition(".")[2]
    return (framework,) if module.startswith("_") else (framework, module)


def resolve_integrations(names: Iterable[str] | None) -> tuple[str, ...]:
    """The framework modules (entry point names) of declared integrations.

    Each name is an entry point name of group ``agl.integrations`` (``langchain_core``, ``agents``,
    ``autogen_core``, ``crewai``, ``httpx``) or the last part of its integration module (``langchain``,
    ``openai_agents``, ``autogen``, ``crewai``). Raises ``ValueError`` naming the known ones for any other name.
    """
    wanted = [names] if isinstance(names, str) else list(names or ())
    known = {name: framework for framework, target in _integrations() for name in _integration_names(framework, target)}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ValueError(
            f"integrations: unknown {', '.join(map(repr, unknown))}; installed: {', '.join(sorted(known)) or 'none'}"
        )
    return tuple(dict.fromkeys(known[name] for name in wanted))


def _in_use(declared: Iterable[str]) -> list[tuple[str, str]]:
    """The integrations to enter now: declared, or whose framework module is imported in this process."""
    chosen = set(declared)
    return [(fw, target) for fw, target in _integrations() if fw in chosen or fw in sys.modules]


def _integration_failed(target: str, framework: str, exc: BaseException, when: str) -> None:
    """Warn (once per process) and record an ``exception`` span naming the integration in the current rollout."""
    if target not in _warned_integrations:
        _warned_integrations.add(target)
        log.warning(
            "integration %s (for %s) failed %s and is skipped: %s: %s; calls made through %s are not captured",
            target,
            framework,
            when,
            type(exc).__name__,
            exc,
            framework,
        )
    ctx = current_rollout()
    if ctx is not None:
        record_exception(ctx, exc, **{ATTR_INTEGRATION: target, "agl.integration.framework": framework})


def _exit_integration(
    target: str,
    framework: str,
    scope: Any,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool:
    try:
        return bool(scope.__exit__(exc_type, exc, tb))
    except Exception as err:
        _integration_failed(target, framework, err, "on exit")
        return False


def warm_integrations(declared: Iterable[str] = ()) -> None:
    """Import the integrations ``integration_scopes(declared)`` would enter now (and so the declared frameworks),
    so a runner's first attempt does not pay for it. Call it after the agent's module was imported: frameworks the
    agent does not use are never imported.

    Errors are left for ``integration_scopes`` to report in each rollout.
    """
    for framework, target in _in_use(declared):
        with contextlib.suppress(Exception):
            importlib.import_module(framework)
            importlib.import_module(target.partition(":")[0])


class IntegrationScopes(contextlib.ExitStack):
    """The capture scopes entered around one rollout (what ``integration_scopes`` returns; leave it to exit them).

    ``late()`` names the frameworks with an integration that were not in use when the rollout started but were
    imported while it ran: their calls in this rollout were not captured.
    """

    def __init__(self) -> None:
        super().__init__()
        self._absent: list[str] = []

    def entered(self) -> None:
        """Note the frameworks not imported now, when the scopes are entered and the agent is about to run."""
        self._absent = [framework for framework, _ in _integrations() if framework not in sys.modules]

    def late(self) -> list[str]:
        return [framework for framework in self._absent if framework in sys.modules]


def integration_scopes(declared: Iterable[str] = ()) -> IntegrationScopes:
    """Enter the capture scopes of the integrations of the frameworks in use (call inside ``rollout_scope``).

    Integrations register as entry points named for their framework's module (``langchain_core =
    "agl.integrations.langchain:activate"``), so the core never imports them by name and a third-party package can
    add their own. A framework is in use when its module is already imported in this process (the agent's module
    imported it) or its integration is in ``declared`` (``resolve_integrations``); the choice is made again at every
    rollout start, and no other framework is imported or hooked, so an AutoGen runner never imports CrewAI nor lets
    its telemetry see AutoGen's data. A framework the agent imports only inside its code is not in use until then:
    ``IntegrationScopes.late()`` names it at the end of that rollout (declare it, or import it in the agent's
    module). An integration that cannot be imported, or whose ``activate()`` raises when called, entered or left, is
    skipped with a warning (once per process) and an ``exception`` span carrying ``agl.integration`` in the rollout;
    the agent runs either way.
    """
    stack = IntegrationScopes()
    for framework, target in _in_use(declared):
        module, _, attr = target.partition(":")
        try:
            scope = getattr(importlib.import_module(module), attr)()
            scope.__enter__()
        except Exception as exc:
            _integration_failed(target, framework, exc, "to activate")
            continue
        stack.push(functools.partial(_exit_integration, target, framework, scope))
    stack.entered()
    return stack


def late_import_error(frameworks: list[str]) -> str:
    """What an attempt reports when ``frameworks`` were first imported while its agent ran (uncaptured)."""
    names = ", ".join(frameworks)
    return (
        f"{names} was first imported while the agent ran, after agl chose which integrations to enter, so its calls "
        f"in this attempt were not captured; this runner captures it from now on. Import {names} in the agent's "
        f"module, or declare it: Trainer(integrations=[{', '.join(map(repr, frameworks))}]) / agl runner "
        f"--integration {frameworks[0]}"
    )
