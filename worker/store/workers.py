"""The worker table: which worker processes are at work now (GET /api/workers)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from agentrun.worker.store.gateway import Gateway

_ANNOUNCE = """INSERT INTO worker (id, version, concurrency, lease_seconds, mcp_servers)
    VALUES (%(id)s, %(version)s, %(concurrency)s, %(lease)s, %(mcp)s)
    ON CONFLICT (id) DO UPDATE SET version = excluded.version, concurrency = excluded.concurrency,
        lease_seconds = excluded.lease_seconds, mcp_servers = excluded.mcp_servers, last_seen = now()"""

# A killed worker's row stays behind; it is not listed once it is older than its lease, the time after
# which its runs are anyone's too. The runs held are those it has a lease on that has not run out.
_LIVE = """SELECT w.id, w.version, w.concurrency, w.mcp_servers, w.last_seen,
        (SELECT count(*) FROM run r WHERE r.locked_by = w.id AND r.status = 'RUNNING'
            AND r.locked_until > now()) AS runs_held
    FROM worker w
    WHERE w.last_seen > now() - make_interval(secs => w.lease_seconds) AND w.concurrency > 0
    ORDER BY w.id"""


@dataclasses.dataclass(frozen=True)
class WorkerRow:
    id: str
    version: str
    concurrency: int
    runs_held: int
    last_seen: datetime.datetime
    mcp_servers: tuple[str, ...]


class Workers(Gateway):
    async def announce(
        self, worker_id: str, version: str, concurrency: int, lease_seconds: float, mcp_servers: Sequence[str]
    ) -> None:
        """This worker is at work: its row, written at start and on every heartbeat (`last_seen` now)."""
        async with self.pool.connection() as conn:
            await conn.execute(_ANNOUNCE.encode(), {
                "id": worker_id, "version": version, "concurrency": concurrency, "lease": lease_seconds,
                "mcp": list(mcp_servers),
            })

    async def retire(self, worker_id: str) -> None:
        """This worker stopped cleanly: it is no longer listed at once (a killed one ages out)."""
        async with self.pool.connection() as conn:
            await conn.execute(b"DELETE FROM worker WHERE id = %s", (worker_id,))

    async def live_workers(self) -> list[WorkerRow]:
        """The workers whose row is younger than their lease, by id."""
        rows = await self._all(_LIVE, ())
        return [WorkerRow(id=r["id"], version=r["version"], concurrency=r["concurrency"],
                          runs_held=int(r["runs_held"]), last_seen=r["last_seen"],
                          mcp_servers=tuple(r["mcp_servers"])) for r in rows]
