"""Reads of runs and steps, as the API, the CLI and the operator see them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from agentrun.worker.core.records import (
    Run,
    RunStatus,
    Step,
)
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.rows import (
    RUN_COLUMNS,
    STEP_COLUMNS,
    TIMELINE_COLUMNS,
    _run,
    _step,
)


class Reads(Gateway):
    async def list_runs(
        self, status: RunStatus | None = None, limit: int = 50, after: uuid.UUID | None = None, *,
        parent: uuid.UUID | None = None,
    ) -> list[Run]:
        """Newest first; `after` is the id of the last run of the previous page (keyset pagination);
        `parent`: only the runs whose parent_run_id is that run (its children, continuations, forks)."""
        rows = await self._all(
            f"""SELECT {RUN_COLUMNS} FROM run r
                WHERE (%(status)s::text IS NULL OR r.status = %(status)s)
                  AND (%(parent)s::uuid IS NULL OR r.parent_run_id = %(parent)s)
                  AND (%(after)s::uuid IS NULL OR (r.created_at, r.id) <
                       (SELECT created_at, id FROM run WHERE id = %(after)s))
                ORDER BY r.created_at DESC, r.id DESC LIMIT %(limit)s""",
            {"status": status.value if status else None, "after": after, "limit": limit, "parent": parent},
        )
        return [_run(r) for r in rows]

    async def steps(self, run_id: uuid.UUID, after_seq: int = 0) -> list[Step]:
        rows = await self._all(
            f"SELECT {STEP_COLUMNS} FROM run_step WHERE run_id = %s AND seq > %s ORDER BY seq",
            (run_id, after_seq),
        )
        return [_step(r) for r in rows]

    async def step(self, run_id: uuid.UUID, seq: int) -> Step | None:
        row = await self._one(f"SELECT {STEP_COLUMNS} FROM run_step WHERE run_id = %s AND seq = %s", (run_id, seq))
        return _step(row) if row else None

    async def timeline(self, run_id: uuid.UUID) -> list[Step]:
        """The steps without their request and response bodies."""
        rows = await self._all(
            f"SELECT {TIMELINE_COLUMNS} FROM run_step WHERE run_id = %s ORDER BY seq", (run_id,)
        )
        return [_step(r) for r in rows]

    async def count_by_status(self) -> dict[str, int]:
        """How many runs there are in each status (for the metrics gauge)."""
        rows = await self._all("SELECT status, count(*) AS n FROM run GROUP BY status", ())
        return {r["status"]: int(r["n"]) for r in rows}

    # -- for the Kubernetes operator -------------------------------------------------------------

    async def get_many(self, run_ids: Sequence[uuid.UUID]) -> list[Run]:
        """The runs among `run_ids` that exist, in no particular order (one query for a batch)."""
        if not run_ids:
            return []
        rows = await self._all(f"SELECT {RUN_COLUMNS} FROM run r WHERE r.id = ANY(%s)", (list(run_ids),))
        return [_run(r) for r in rows]

    async def find_linked(self, namespace: str, name: str) -> Run | None:
        """The run mirrored from the AgentRun `namespace/name`, if any (the newest, should names repeat)."""
        row = await self._one(
            f"""SELECT {RUN_COLUMNS} FROM run r WHERE r.k8s_namespace = %s AND r.k8s_name = %s
                ORDER BY r.created_at DESC LIMIT 1""",
            (namespace, name),
        )
        return _run(row) if row else None

    async def unfinished_linked(self) -> list[Run]:
        """Every queued or running run mirrored from an AgentRun: the operator's periodic resync."""
        rows = await self._all(
            f"""SELECT {RUN_COLUMNS} FROM run r
                WHERE r.k8s_name IS NOT NULL AND r.status IN ('QUEUED', 'RUNNING', 'WAITING')""",
            (),
        )
        return [_run(r) for r in rows]
