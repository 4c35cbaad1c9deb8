"""Sub-agents: the child runs a parent's calls start, the parent's wait for them, and cancels that cascade.

A child is made once per (parent, tool_use id): a unique index says so, whoever sends the write and
however often. The parent is parked WAITING for its children in the same fenced statement that makes
them, so no child can end before its parent waits for it; the child's end is counted on the parent by a
trigger (0016_children.sql), which queues the parent again when its last child of the turn has ended.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from psycopg.types.json import Jsonb

from agentrun.worker.core.errors import CancelRequested
from agentrun.worker.core.records import NewRun, Run
from agentrun.worker.core.text import unstorable
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.insert import INSERT_RUN, run_row
from agentrun.worker.store.rows import FENCE_ASKED, RUN_COLUMNS, LeaseLost, as_run

ACTIVE = "('QUEUED', 'RUNNING', 'WAITING')"

# What a cancel does to a run no worker holds (ends it) and to one a worker holds (asks it to stop);
# `reason` is the error of a run ended so.
CANCEL_SET = """cancel_requested = true,
    cancelled_by = CASE WHEN cancel_requested THEN cancelled_by ELSE %(by)s END,
    status = CASE WHEN status IN ('QUEUED', 'WAITING') THEN 'CANCELLED' ELSE status END,
    finished_at = CASE WHEN status IN ('QUEUED', 'WAITING') THEN now() ELSE finished_at END,
    error = CASE WHEN status IN ('QUEUED', 'WAITING') THEN %(reason)s ELSE error END"""


# The unfinished runs below run `id` in its tree, cancelled. A statement of its own, after the parent's
# cancel: the parent's row is not locked meanwhile, so a child ending at the same moment (which counts
# itself on its parent, under the parent's row lock) cannot deadlock with it.
CANCEL_DESCENDANTS = f"""WITH RECURSIVE tree AS (
        SELECT id FROM run WHERE parent_run_id = %(id)s AND parent_tool_use_id IS NOT NULL
        UNION
        SELECT c.id FROM run c JOIN tree ON c.parent_run_id = tree.id WHERE c.parent_tool_use_id IS NOT NULL)
    UPDATE run SET {CANCEL_SET}
    WHERE id IN (SELECT id FROM tree) AND status IN {ACTIVE} AND NOT cancel_requested
    RETURNING id"""


# The children of a spawn: the one statement that makes runs (store/insert.py), behind the parent's fence.
SPAWNED = INSERT_RUN.format(gate="CROSS JOIN fence WHERE NOT fence.cancel_requested", returning="r.id")


class Children(Gateway):
    async def spawn(
        self, run_id: uuid.UUID, worker: str, children: Sequence[NewRun], *, epoch: int | None = None,
        again: bool = False,
    ) -> bool:
        """Make the children the parent's calls start (each NewRun's `spawned_by` names the call; one
        already made for its call is left as it is) and park the parent WAITING for every child it has
        not seen end, with no lease. Returns False if none is left to wait for (each has ended already):
        the parent is still held, and goes on with their results. Raises CancelRequested, making no
        child and parking nothing, if the parent was asked to stop (it is still held: it ends CANCELLED).

        A copy sent again (`again`) finds the parent parked under the same epoch and counts as done."""
        for new in children:
            assert new.spawned_by is not None, "a child run names the call that starts it"
            for field, text in {"input": new.input, "system": new.system}.items():
                if (why := unstorable(text)) is not None:
                    raise ValueError(f"sub-agent {field} {why}")
        rows = [run_row(new, run_id) for new in children]
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE_ASKED},
                made AS ({SPAWNED}),
                parked AS (
                    UPDATE run SET
                        children_active = run.children_active + (SELECT count(*) FROM made),
                        status = CASE WHEN run.children_active + (SELECT count(*) FROM made) > 0 THEN 'WAITING'
                                      ELSE run.status END,
                        waiting_for = CASE WHEN run.children_active + (SELECT count(*) FROM made) > 0
                                           THEN 'children' ELSE run.waiting_for END,
                        locked_by = CASE WHEN run.children_active + (SELECT count(*) FROM made) > 0 THEN NULL
                                         ELSE run.locked_by END,
                        locked_until = CASE WHEN run.children_active + (SELECT count(*) FROM made) > 0 THEN NULL
                                            ELSE run.locked_until END
                    FROM fence WHERE run.id = fence.id AND NOT fence.cancel_requested RETURNING run.status)
                SELECT (SELECT status FROM parked) AS status, (SELECT cancel_requested FROM fence) AS asked,
                       (SELECT status FROM run WHERE id = %(id)s AND %(again)s AND %(epoch)s::bigint IS NOT NULL
                            AND lease_epoch = %(epoch)s::bigint AND status <> 'RUNNING' AND locked_by IS NULL
                            AND NOT handed_back) AS found""",
            {"id": run_id, "worker": worker, "epoch": epoch, "again": again, "runs": Jsonb(rows)},
            again=again,
        )
        if row is not None and row["asked"]:
            raise CancelRequested(run_id)
        if row is not None and row["status"] is not None:
            return bool(row["status"] == "WAITING")
        if row is not None and row["found"] is not None:  # the first copy parked it
            return True
        raise LeaseLost(run_id, worker)

    async def children(self, run_id: uuid.UUID) -> list[Run]:
        """The runs the run's sub-agent calls started, oldest first."""
        rows = await self._all(
            f"""SELECT {RUN_COLUMNS} FROM run r WHERE r.parent_run_id = %s AND r.parent_tool_use_id IS NOT NULL
                ORDER BY r.created_at, r.id""",
            (run_id,),
        )
        return [as_run(r) for r in rows]

    async def children_counts(self, run_id: uuid.UUID) -> dict[str, int]:
        """The runs the run's sub-agent calls started, counted: `total`, `active` (not finished),
        `succeeded`, and `failed` (FAILED, TIMED_OUT or CANCELLED)."""
        row = await self._one(
            f"""SELECT count(*) AS total, count(*) FILTER (WHERE status IN {ACTIVE}) AS active,
                       count(*) FILTER (WHERE status = 'SUCCEEDED') AS succeeded,
                       count(*) FILTER (WHERE status IN ('FAILED', 'TIMED_OUT', 'CANCELLED')) AS failed
                FROM run WHERE parent_run_id = %s AND parent_tool_use_id IS NOT NULL""",
            (run_id,),
        )
        assert row is not None  # an aggregate always has its row
        return {k: int(row[k]) for k in ("total", "active", "succeeded", "failed")}

    async def cancel_descendants(self, run_id: uuid.UUID, by: str | None, why: str) -> int:
        """Cancel the unfinished runs below `run_id` in its tree (its cancel cascades); returns how many."""
        rows = await self._all(CANCEL_DESCENDANTS, {"id": run_id, "by": by, "reason": why})
        return len(rows)

    async def cancel_orphans(self) -> list[uuid.UUID]:
        """Cancel the unfinished children whose parent has ended or was asked to stop: the cascade of a
        cancel whose second statement was lost (its caller died), or of a parent that timed out while it
        waited. Cheap (an index on the unfinished children) and harmless from many workers."""
        rows = await self._all(
            f"""UPDATE run c SET cancel_requested = true,
                    status = CASE WHEN c.status IN ('QUEUED', 'WAITING') THEN 'CANCELLED' ELSE c.status END,
                    finished_at = CASE WHEN c.status IN ('QUEUED', 'WAITING') THEN now() ELSE c.finished_at END,
                    error = CASE WHEN c.status IN ('QUEUED', 'WAITING') THEN %(reason)s ELSE c.error END
                FROM run p
                WHERE c.parent_run_id = p.id AND c.parent_tool_use_id IS NOT NULL AND c.status IN {ACTIVE}
                  AND NOT c.cancel_requested
                  AND (p.cancel_requested OR p.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT'))
                RETURNING c.id""",
            {"reason": "cancelled: its parent run ended or was cancelled"},
        )
        return [r["id"] for r in rows]
