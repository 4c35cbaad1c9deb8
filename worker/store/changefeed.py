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

SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"

RUNS = f"""SELECT {RUN_COLUMNS}, coalesce(r.event_xid, '0')::text::bigint AS event_xid
    FROM run r WHERE r.id = ANY(%(ids)s)"""

DECISIONS = f"""SELECT {DECISION_COLUMNS}, position, coalesce(event_xid, '0')::text::bigint AS event_xid
    FROM run_decision WHERE run_id = ANY(%(ids)s) ORDER BY run_id, since, position, attempt"""

# A run's steps changed at or after its own `since`, and the steps of calls decided since (a decision
# changes its call's timeline row); `a` and `b` pair each run with its `since`.
STEPS = f"""SELECT {TIMELINE_COLUMNS}, coalesce(event_xid, '0')::text::bigint AS event_xid
    FROM run_step JOIN unnest(%(ids)s::uuid[], %(since)s::bigint[]) AS a(id, since) ON run_step.run_id = a.id
    WHERE coalesce(event_xid, '0') >= a.since::text::xid8
       OR (run_step.run_id, run_step.tool_use_id) IN (
           SELECT d.run_id, d.tool_use_id
           FROM run_decision d JOIN unnest(%(ids)s::uuid[], %(since)s::bigint[]) AS b(id, since) ON d.run_id = b.id
           WHERE coalesce(d.event_xid, '0') >= b.since::text::xid8)
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

    async def read(self, since: Mapping[uuid.UUID, int]) -> tuple[int | None, dict[uuid.UUID, RunRows]]:
        """The horizon (every change below it is final; None when it cannot tell now: ask again shortly),
        and the rows of each run in `since` changed at or after its position (runs that do not exist are
        left out), in one repeatable-read snapshot so that they agree with each other.

        Two round trips on one connection, each of which waits its turn on a busy event loop and a busy
        database: the horizon, then the reads in a pipeline. The horizon comes first so that the snapshot,
        taken after it, sees every change below it (in one pipeline both would be one transaction)."""
        ids = list(since)
        positions = [since[i] for i in ids]
        async with self.pool.connection() as conn:
            horizon = _horizon(await (await conn.execute(HORIZON)).fetchone())
            if horizon is None or not ids:
                return horizon, {}
            async with conn.pipeline():
                await conn.execute(SNAPSHOT)
                runs = await conn.cursor(row_factory=dict_row).execute(RUNS, {"ids": ids})
                decided = await conn.cursor(row_factory=dict_row).execute(DECISIONS, {"ids": ids})
                steps = await conn.cursor(row_factory=dict_row).execute(STEPS, {"ids": ids, "since": positions})
                await conn.execute("COMMIT")
            run_rows = {r["id"]: r for r in await runs.fetchall()}
            decisions = _decisions(await decided.fetchall())
            found_steps: dict[uuid.UUID, list[tuple[int, Step]]] = {}
            for r in await steps.fetchall():
                position = r.pop("event_xid")
                found_steps.setdefault(r["run_id"], []).append((position, as_step(r)))
        found: dict[uuid.UUID, RunRows] = {}
        for run_id, r in run_rows.items():
            position = r.pop("event_xid")
            found[run_id] = RunRows(as_run(r), position, decisions.get(run_id, {}), found_steps.get(run_id, []))
        return horizon, found


def _horizon(row: Any) -> int | None:
    return None if row is None or row[0] is None else int(row[0])


def _decisions(rows: list[dict[str, Any]]) -> dict[uuid.UUID, dict[str, list[Decided]]]:
    """Decision rows by run, then by tool_use id, oldest first."""
    found: dict[uuid.UUID, dict[str, list[Decided]]] = {}
    for row in rows:
        position, place = row.pop("event_xid"), row.pop("position")
        call = as_pending(row)
        found.setdefault(call.run_id, {}).setdefault(call.tool_use_id, []).append(Decided(call, position, place))
    return found
