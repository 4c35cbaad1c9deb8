"""GET /api/workers: the worker processes at work now, so a user can see who drives the runs."""

from __future__ import annotations

import datetime
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from agentrun.worker.api.guards import ScopedRoute, access
from agentrun.worker.api.identities import Scope
from agentrun.worker.api.schemas import ErrorBody
from agentrun.worker.store import RunStore, WorkerRow


class WorkerView(BaseModel):
    """One live worker process."""

    id: str = Field(description="The worker id (`--id`): what runs name in `lockedBy`.")
    version: str = Field(description="The agentrun version it runs.")
    concurrency: int = Field(description="How many runs it drives at once at most.")
    runsHeld: int = Field(description="The runs it holds a lease on now.")  # noqa: N815
    lastSeen: datetime.datetime = Field(description="Its last heartbeat (every third of its lease).")  # noqa: N815
    mcpServers: list[str] = Field(description="The names of the MCP servers it has configured.")  # noqa: N815

    @classmethod
    def of(cls, row: WorkerRow) -> WorkerView:
        return cls(id=row.id, version=row.version, concurrency=row.concurrency, runsHeld=row.runs_held,
                   lastSeen=row.last_seen, mcpServers=list(row.mcp_servers))


class WorkerList(BaseModel):
    items: list[WorkerView]


def workers_router(store: RunStore, secured: bool) -> APIRouter:
    responses: dict[int | str, dict[str, Any]] = {
        401: {"model": ErrorBody, "description": "Missing or wrong bearer token"},
        403: {"model": ErrorBody, "description": "The token's identity lacks the `read` scope"},
    } if secured else {}
    router = APIRouter(prefix="/api", tags=["workers"], responses=responses, route_class=ScopedRoute)

    @router.get("/workers", response_model=WorkerList, **access(Scope.READ, secured))
    async def workers() -> WorkerList:
        """The live workers, by id: each announces itself at start and on every heartbeat and leaves the list
        when it stops; a killed one drops out once its last heartbeat is older than its lease. Processes that
        serve the API only (concurrency 0) are not listed. Scope: `read`."""
        return WorkerList(items=[WorkerView.of(w) for w in await store.live_workers()])

    return router
