"""How an integration reaches into a framework where it has no public hook: wrap once, undo, and know the versions.

- :class:`Patches`: replaces a framework's function by agl's wrapper, once however often it is asked (a wrapper is
  never wrapped again), and puts every original back with :meth:`Patches.undo`.
- :class:`Verified`: the versions of a framework an integration was checked against. Outside them, capture still
  runs but is *degraded*: the integration may miss calls a changed private API no longer routes through it. That is
  never silent: a warning when the integration is installed, and one ``agl.capture.degraded`` span in every rollout
  it captures (:meth:`Verified.degraded`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

log = logging.getLogger("agl.integrations")

#: The attribute of the span that says a rollout's capture ran outside the verified versions.
ATTR_CAPTURE_DEGRADED = "agl.capture.degraded"


class Patches:
    """The framework functions one integration replaced, each by one wrapper, and what they were before."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self._done: list[tuple[Any, str, Any]] = []  # owner, attribute, the owner's own value before (None: inherited)
        self._wrappers: set[Any] = set()

    def wrap(self, owner: Any, attr: str, wrap: Callable[[Any], Any], *, own: bool = False) -> bool:
        """Set ``owner.attr`` to ``wrap(current)``; False when it is agl's wrapper already or missing.

        ``own``: ``current`` is what ``owner`` defines itself (None when it inherits the attribute, and ``wrap``
        must handle that); otherwise the attribute as ``owner`` resolves it, and a missing one is logged and skipped.
        """
        before = vars(owner).get(attr)
        current = before if own else getattr(owner, attr, None)
        if current is not None and (current in self._wrappers or getattr(current, "_agl_wrapped", False)):
            return False
        if current is None and not own:
            name = getattr(owner, "__name__", type(owner).__name__)
            log.warning("%s.%s is missing in this %s version: agl cannot hook it", name, attr, self.framework)
            return False
        wrapped = wrap(current)
        with contextlib.suppress(AttributeError, TypeError):  # another Patches (a reloaded module) sees it is agl's
            wrapped.__dict__["_agl_wrapped"] = True
        self._wrappers.add(wrapped)
        setattr(owner, attr, wrapped)
        self._done.append((owner, attr, before))
        return True

    def undo(self) -> None:
        """Put back every function replaced, newest first."""
        while self._done:
            owner, attr, before = self._done.pop()
            if before is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, before)
        self._wrappers.clear()


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version (``1.6.1rc2`` → ``(1, 6, 1)``)."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


@dataclass(frozen=True)
class Verified:
    """Capture of ``distribution`` was verified from version ``at_least`` up to, not including, ``below``."""

    distribution: str
    at_least: str
    below: str

    @property
    def range(self) -> str:
        return f">={self.at_least},<{self.below}"

    @cached_property
    def installed(self) -> str | None:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def degraded(self) -> str | None:
        """Why capture is degraded with the installed version (None: it is within the verified versions)."""
        if self.installed is None:
            return None
        if _release(self.at_least) <= _release(self.installed) < _release(self.below):
            return None
        return (
            f"{self.distribution} {self.installed} is outside the versions agl's capture was verified with "
            f"({self.range}): calls it reaches through private hooks may go unrecorded"
        )
