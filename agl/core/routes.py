"""The store API's routes, in one table: the server registers them, the auth layer reads who may call them, and
``HttpStore`` calls them, so a path or a role is spelled once.

A route acting on one attempt (``attempt=True``) takes a trainer token or that attempt's key (sent with
``HEADER_ROLLOUT`` / ``HEADER_ATTEMPT``), never a runner token: a runner, or agent code that reads its token, cannot
settle or write into another runner's attempt. Standard library only: runners import it through ``HttpStore``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args
from urllib.parse import quote

Role = Literal["trainer", "runner", "reader"]
ROLES: tuple[Role, ...] = get_args(Role)

ALL: frozenset[Role] = frozenset(ROLES)
WORKERS: frozenset[Role] = frozenset({"trainer", "runner"})
READERS: frozenset[Role] = frozenset({"trainer", "reader"})
TRAINER: frozenset[Role] = frozenset({"trainer"})


@dataclass(frozen=True)
class Route:
    """One route of the store API: its method, its path template and the roles that may call it."""

    method: str
    path: str
    roles: frozenset[Role]
    attempt: bool = False

    def bind(self, **params: str | int) -> Route:
        """This route with its path's ``params`` filled in, each quoted as one path segment."""
        return replace(self, path=self.path.format(**{name: quote(str(v), safe="") for name, v in params.items()}))


SETTINGS = Route("GET", "/api/settings", ALL)
ENQUEUE = Route("POST", "/api/rollouts/enqueue", TRAINER)
LEASE = Route("POST", "/api/lease", WORKERS)
HEARTBEAT = Route("POST", "/api/attempts/{attempt_id}/heartbeat", TRAINER, attempt=True)
COMPLETE = Route("POST", "/api/attempts/{attempt_id}/complete", TRAINER, attempt=True)
LIST_ROLLOUTS = Route("GET", "/api/rollouts", READERS)
GET_ROLLOUT = Route("GET", "/api/rollouts/{rollout_id}", ALL)
GET_ROLLOUTS = Route("POST", "/api/rollouts/get", READERS)
LIST_ATTEMPTS = Route("GET", "/api/rollouts/{rollout_id}/attempts", READERS)
CANCEL = Route("POST", "/api/rollouts/cancel", TRAINER)
REAP = Route("POST", "/api/reap", WORKERS)
WAIT = Route("POST", "/api/rollouts/wait", READERS)
ADD_SPANS = Route("POST", "/api/spans", TRAINER, attempt=True)
QUERY_SPANS = Route("GET", "/api/spans", READERS)
PUBLISH = Route("POST", "/api/resources", TRAINER)
LATEST_RESOURCES = Route("GET", "/api/resources/latest", ALL)
GET_RESOURCES = Route("GET", "/api/resources/{version}", ALL)
ADD_RECORD = Route("POST", "/api/records", TRAINER)
LIST_RECORDS = Route("GET", "/api/records", READERS)

#: Every route of the store API.
ROUTES: tuple[Route, ...] = (
    SETTINGS,
    ENQUEUE,
    LEASE,
    HEARTBEAT,
    COMPLETE,
    LIST_ROLLOUTS,
    GET_ROLLOUT,
    GET_ROLLOUTS,
    LIST_ATTEMPTS,
    CANCEL,
    REAP,
    WAIT,
    ADD_SPANS,
    QUERY_SPANS,
    PUBLISH,
    LATEST_RESOURCES,
    GET_RESOURCES,
    ADD_RECORD,
    LIST_RECORDS,
)
