"""The one scoped door for reads that serve a caller: a run, the runs listed, and a run's steps, timeline,
decisions, messages, sub-agents, wait and webhook deliveries, as far as the caller (its viewer) sees them.

What a viewer sees is decided here and nowhere else (VISIBLE): a run outside it reads as no run (None),
so the API answers 404 for it as for a run that does not exist, never revealing it. Reads of a run's rows
look at the run first, in the same way. The API reads runs only through this door (tests/api/test_scope.py
walks every route of its OpenAPI document to hold it to that)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.core.records import Message, PendingCall, Run, RunStatus, Step
from agentrun.worker.core.viewer import Viewer
from agentrun.worker.core.webhooks import Delivery
from agentrun.worker.store.reads import RunFilter
from agentrun.worker.store.rows import RUN_COLUMNS, as_run
from agentrun.worker.store.waits import PendingWait


class Readable(Protocol):
    """The store's reads the door serves from (RunStore has them all)."""

    @property
    def pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]: ...
    async def list_runs(self, status: RunStatus | None = None, limit: int = 50, after: uuid.UUID | None = None, *,
                        parent: uuid.UUID | None = None, where: RunFilter | None = None) -> list[Run]: ...
    async def steps(self, run_id: uuid.UUID, after_seq: int = 0) -> list[Step]: ...
    async def steps_before(self, run_id: uuid.UUID, seq: int) -> list[Step]: ...
    async def step(self, run_id: uuid.UUID, seq: int) -> Step | None: ...
    async def timeline(self, run_id: uuid.UUID) -> list[Step]: ...
    async def decisions(self, run_id: uuid.UUID) -> list[PendingCall]: ...
    async def messages(self, run_id: uuid.UUID) -> list[Message]: ...
    async def children(self, run_id: uuid.UUID) -> list[Run]: ...
    async def pending_wait(self, run_id: uuid.UUID) -> PendingWait | None: ...
    async def webhooks_of(self, run_id: uuid.UUID) -> list[Delivery]: ...
    async def schedule_runs(self, name: str, limit: int, tenant: str = ...) -> list[Run]: ...


# The one rule of what a viewer sees, as a condition on `run r`; `_visible` gives its parameters: a viewer of
# one tenant sees that tenant's runs, any other viewer (a platform operator's, an open API's) every run.
VISIBLE = "(%(viewer_tenant)s::text IS NULL OR r.tenant = %(viewer_tenant)s)"
GET_VISIBLE = f"SELECT {RUN_COLUMNS} FROM run r WHERE r.id = %(id)s AND {VISIBLE}"
SEES = f"SELECT 1 AS found FROM run r WHERE r.id = %(id)s AND {VISIBLE}"


def _visible(viewer: Viewer) -> dict[str, Any]:
    """The parameters of VISIBLE for this viewer."""
    return {"viewer_tenant": viewer.tenant}


class ScopedReads:
    """The reads of one caller, as far as its viewer sees: made for one request, so a run found visible once
    (whom a run belongs to never changes) is not looked up again by the request's next read of it."""

    def __init__(self, store: Readable, viewer: Viewer) -> None:
        self._store = store
        self.viewer = viewer
        self._seen: set[uuid.UUID] = set()

    async def _run_row(self, query: str, run_id: uuid.UUID) -> dict[str, Any] | None:
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query.encode(), {**_visible(self.viewer), "id": run_id})
            return await cur.fetchone()

    async def get(self, run_id: uuid.UUID) -> Run | None:
        """The run, if the viewer sees it."""
        row = await self._run_row(GET_VISIBLE, run_id)
        if row is None:
            return None
        self._seen.add(run_id)
        return as_run(row)

    async def sees(self, run_id: uuid.UUID) -> bool:
        """Whether the run exists and the viewer sees it."""
        if run_id not in self._seen and await self._run_row(SEES, run_id) is not None:
            self._seen.add(run_id)
        return run_id in self._seen

    async def list_runs(self, status: RunStatus | None = None, limit: int = 50, after: uuid.UUID | None = None, *,
                        parent: uuid.UUID | None = None, where: RunFilter | None = None) -> list[Run]:
        """The runs the viewer sees, newest first (store/reads.py, `list_runs`): its tenant's, as VISIBLE has it
        (a filter naming another tenant finds none)."""
        where = where or RunFilter()
        if not self.viewer.sees_everything:
            if where.tenant is not None and where.tenant != self.viewer.tenant:
                return []
            where = dataclasses.replace(where, tenant=self.viewer.tenant)
        return await self._store.list_runs(status, limit, after, parent=parent, where=where)

    async def schedule_runs(self, name: str, limit: int, tenant: str) -> list[Run]:
        """The runs `tenant`'s schedule made, newest first (store/schedules.py), if the viewer sees that tenant."""
        if not self.viewer.sees_tenant(tenant):
            return []
        return await self._store.schedule_runs(name, limit, tenant)

    async def steps(self, run_id: uuid.UUID, after_seq: int = 0) -> list[Step] | None:
        return await self._store.steps(run_id, after_seq) if await self.sees(run_id) else None

    async def steps_before(self, run_id: uuid.UUID, seq: int) -> list[Step] | None:
        return await self._store.steps_before(run_id, seq) if await self.sees(run_id) else None

    async def step(self, run_id: uuid.UUID, seq: int) -> Step | None:
        return await self._store.step(run_id, seq) if await self.sees(run_id) else None

    async def timeline(self, run_id: uuid.UUID) -> list[Step] | None:
        return await self._store.timeline(run_id) if await self.sees(run_id) else None

    async def decisions(self, run_id: uuid.UUID) -> list[PendingCall] | None:
        return await self._store.decisions(run_id) if await self.sees(run_id) else None

    async def messages(self, run_id: uuid.UUID) -> list[Message] | None:
        return await self._store.messages(run_id) if await self.sees(run_id) else None

    async def children(self, run_id: uuid.UUID) -> list[Run] | None:
        return await self._store.children(run_id) if await self.sees(run_id) else None

    async def pending_wait(self, run_id: uuid.UUID) -> PendingWait | None:
        return await self._store.pending_wait(run_id) if await self.sees(run_id) else None

    async def webhooks_of(self, run_id: uuid.UUID) -> list[Delivery] | None:
        return await self._store.webhooks_of(run_id) if await self.sees(run_id) else None
