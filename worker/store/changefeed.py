"""What the live events read from PostgreSQL: the horizon below which every change is final, and the rows
of runs changed after a position, for many runs in one snapshot. All the SQL of live events is here.

Every change of a run, step or decision row carries a position (`event_xid`, migration 0013: one per
transaction, from a sequence, taken at its first event row). A transaction that took one holds advisory
locks that say so until it ends; `agentrun_event_horizon()` finds the lowest position still held (or the
next one to be handed out): below it, every change has committed or rolled back, and none can appear
later. Only transactions that write event rows hold it back, never another database, a reader, a writer
of other tables or a prepared transaction. The API (worker/api/events.py) sends a
change only once it is below the horizon, so a reconnect resumes after a position with no gap.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.core.records import PendingCall, Run, Step
from agentrun.worker.store.rows import DECISION_COLUMNS, RUN_COLUMNS, TIMELINE_COLUMNS, as_pending, as_run, as_step

HORIZON = "SELECT agentrun_event_horizon() AS horizon"

RUNS = f"""SELECT {RUN_COLUMNS}, coalesce(r.event_xid, '0')::text::bigint AS event_xid
    FROM run r WHERE r.id = ANY(%(ids)s)"""

DECISIONS = f"""SELECT {DECISION_COLUMNS}, position, coalesce(event_xid, '0')::text::bigint AS event_xid
    FROM run_decision WHERE run_id = ANY(%(ids)s) ORDER BY run_id, since, position, attempt"""

# A run's steps changed at or after its own `since`, and the steps of calls decided since (a decision
# changes its call's timeline row); `a` pairs each run with its `since`.
STEPS = f"""SELECT {TIMELINE_COLUMNS}, coalesce(event_xid, '0')::text::bigint AS event_xid
    FROM run_step JOIN unnest(%(ids)s::uuid[], %(since)s::bigint[]) AS a(id, since) ON run_step.run_id = a.id
    WHERE coalesce(event_xid, '0') >= a.since::text::xid8 OR tool_use_id = ANY(%(touched)s)
    ORDER BY run_id, seq"""


@dataclasses.dataclass(frozen=True)
class Decided:
    """A decision row (a call waiting for a person, or decided): its change's position, its place in the
    model's turn (the order of calls that have no step yet)."""

    call: PendingCall
    position: int
    place: int


@dataclasses.dataclass(frozen=True)
class RunRows:
    run: Run
    position: int
    """Of the run row's last change."""
    decisions: dict[str, list[Decided]]
    """By tool_use id, oldest first: every decision of the run."""
    steps: list[tuple[int, Step]]
    """(position, step), by seq: the steps changed at or after `since`, or whose call was decided since."""


class ChangeFeed:
    """The feed's reads, through `pool`."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    async def horizon(self) -> int | None:
        """Every change below this position is final; None when it cannot tell now (ask again shortly)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(HORIZON)
            row = await cur.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    async def read(self, since: Mapping[uuid.UUID, int]) -> dict[uuid.UUID, RunRows]:
        """The rows of each run in `since` changed at or after its position (runs that do not exist are
        left out), in one repeatable-read snapshot so that they agree with each other.

        Call it after the horizon it is used with: a snapshot taken later sees every change below it."""
        ids = list(since)
        if not ids:
            return {}
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(RUNS, {"ids": ids})
            runs = {row["id"]: row for row in await cur.fetchall()}
            decisions = await _decisions(cur, ids)
            touched = [use for by_call in decisions.values() for use, found in by_call.items()
                       if since.get(found[0].call.run_id, 0) <= max(d.position for d in found)]
            await cur.execute(STEPS, {"ids": ids, "since": [since[i] for i in ids], "touched": touched})
            steps: dict[uuid.UUID, list[tuple[int, Step]]] = {}
            for row in await cur.fetchall():
                position = row.pop("event_xid")
                steps.setdefault(row["run_id"], []).append((position, as_step(row)))
        found: dict[uuid.UUID, RunRows] = {}
        for run_id, row in runs.items():
            position = row.pop("event_xid")
            found[run_id] = RunRows(as_run(row), position, decisions.get(run_id, {}), steps.get(run_id, []))
        return found


async def _decisions(cur: Any, ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, list[Decided]]]:
    """Every decision row of the runs `ids`: by run, then by tool_use id, oldest first."""
    await cur.execute(DECISIONS, {"ids": ids})
    found: dict[uuid.UUID, dict[str, list[Decided]]] = {}
    for row in await cur.fetchall():
        position, place = row.pop("event_xid"), row.pop("position")
        call = as_pending(row)
        found.setdefault(call.run_id, {}).setdefault(call.tool_use_id, []).append(Decided(call, position, place))
    return found
