"""Durable timers and waits for outside events: a run parked WAITING (`waiting_for` timer or event) holds no
lease and no slot; one sweep per worker wakes the due ones; an event posted wakes the runs waiting on its key.

An event and a run parking on its key take turns under an advisory lock on the key, each in a transaction
whose statement reads after it has the lock: an event posted before (or while) a run parks is found by the
park, in its statement; a run parked before an event is posted is found by the post. Each event reaches a
run at most once, and each wait call is answered by one event (run_event_delivery's keys).
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentrun.worker.core.tenants import DEFAULT_TENANT
from agentrun.worker.store.channels import SIGNAL_IDEMPOTENCY_LOCK_CLASS, SIGNAL_KEY_LOCK_CLASS
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.rows import EPOCH, FENCE, LeaseLost

SWEEP_BATCH = 1000
"""The most due waits one sweep statement wakes (the next sweep follows at once when it took that many)."""

WAITS = "('timer', 'event')"

# A run asked to stop while it was parking is woken at once, so its next claim ends it CANCELLED. The
# statement's `since` (one row, `at`) is when the wait began, which `secs` count from.
PARKED = """status = 'WAITING', waiting_for = %(kind)s, locked_by = NULL, locked_until = NULL,
    wake_at = CASE WHEN run.cancel_requested THEN now()
                   ELSE coalesce(%(at)s::timestamptz, (SELECT at FROM since) + make_interval(secs => %(secs)s::float8))
              END,
    wait_key = %(key)s, wait_tool_use_id = %(tuid)s,
    wait_since = CASE WHEN run.wait_tool_use_id = %(tuid)s AND run.wait_since IS NOT NULL THEN run.wait_since
                      ELSE (SELECT at FROM since) END"""

# A timer began when its call first started: its STARTED row keeps that time however often the call is run
# again (a crash between the row and the park), so a takeover neither moves the deadline nor shortens the
# wait the model is told of. (now() when the call has no row.)
TIMER_SINCE = """since AS (SELECT coalesce((SELECT started_at FROM run_step WHERE run_id = %(id)s AND kind = 'TOOL'
                                                AND tool_use_id = %(tuid)s), now()) AS at)"""

# A copy sent again after its outcome was lost finds the first: parked under the same claim, for this call.
FOUND = f"""(SELECT id FROM run WHERE id = %(id)s AND %(again)s AND %(epoch)s::bigint IS NOT NULL AND {EPOCH}
        AND status <> 'RUNNING' AND locked_by IS NULL AND wait_tool_use_id = %(tuid)s) AS found"""

PARK_TIMER = f"""WITH {FENCE}, {TIMER_SINCE},
    parked AS (UPDATE run SET {PARKED} FROM fence WHERE run.id = fence.id RETURNING run.id)
    SELECT (SELECT id FROM parked) AS parked, {FOUND}"""

# The oldest event on the key kept within the retention window that this run has not received, unless
# this call has its event already (a second copy of the park, or a call run again after a crash).
PARK_EVENT = f"""WITH {FENCE}, since AS (SELECT now() AS at),
    prior AS (SELECT event_id, payload FROM run_event_delivery WHERE run_id = %(id)s AND tool_use_id = %(tuid)s),
    ev AS (SELECT e.id, e.payload FROM run_event e, fence
           WHERE e.key = %(key)s AND e.created_at > now() - make_interval(secs => %(retention)s::float8)
             AND e.tenant = (SELECT tenant FROM run WHERE id = %(id)s)
             AND NOT EXISTS (SELECT 1 FROM run_event_delivery d WHERE d.run_id = %(id)s AND d.event_id = e.id)
             AND NOT EXISTS (SELECT 1 FROM prior)
           ORDER BY e.id LIMIT 1),
    took AS (INSERT INTO run_event_delivery (run_id, event_id, tool_use_id, payload)
             SELECT %(id)s, id, %(tuid)s, payload FROM ev RETURNING event_id, payload),
    parked AS (UPDATE run SET {PARKED} FROM fence WHERE run.id = fence.id
               AND NOT EXISTS (SELECT 1 FROM ev) AND NOT EXISTS (SELECT 1 FROM prior) RETURNING run.id)
    SELECT (SELECT id FROM fence) AS held, (SELECT id FROM parked) AS parked,
           coalesce((SELECT event_id FROM took), (SELECT event_id FROM prior)) AS event_id,
           coalesce((SELECT payload FROM took), (SELECT payload FROM prior)) AS payload, {FOUND}"""

POST_EVENT = """WITH ev AS (
        INSERT INTO run_event (key, payload, created_by, idempotency_key, tenant)
        VALUES (%(key)s, %(payload)s, %(by)s, %(idem)s, %(tenant)s) RETURNING id, payload),
    woke AS (
        UPDATE run r SET status = 'QUEUED', waiting_for = NULL, run_at = now()
        FROM ev WHERE r.status = 'WAITING' AND r.waiting_for = 'event' AND r.wait_key = %(key)s
          AND r.tenant = %(tenant)s
          AND NOT EXISTS (SELECT 1 FROM run_event_delivery d
                          WHERE d.run_id = r.id AND d.tool_use_id = r.wait_tool_use_id)
        RETURNING r.id, r.wait_tool_use_id),
    sent AS (
        INSERT INTO run_event_delivery (run_id, event_id, tool_use_id, payload)
        SELECT woke.id, ev.id, woke.wait_tool_use_id, ev.payload FROM woke, ev RETURNING run_id)
    SELECT (SELECT id FROM ev) AS id, array(SELECT run_id::text FROM sent ORDER BY run_id) AS woke"""

# Every due timer and timed-out event wait, queued again in one statement (the run_requeued_wake trigger
# notifies the workers), and the seconds until the next one: what the sweep sleeps. The index on wake_at
# is all it reads, however many runs sleep.
SWEEP = f"""WITH due AS (
        SELECT id FROM run WHERE status = 'WAITING' AND waiting_for IN {WAITS} AND wake_at <= now()
        ORDER BY wake_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED),
    woke AS (
        UPDATE run SET status = 'QUEUED', waiting_for = NULL, run_at = now()
        FROM due WHERE run.id = due.id RETURNING run.id)
    SELECT array(SELECT id FROM woke) AS woke,
           (SELECT extract(epoch FROM min(wake_at) - now())::float8 FROM run
            WHERE status = 'WAITING' AND waiting_for IN {WAITS} AND wake_at > now()) AS next"""


@dataclasses.dataclass(frozen=True)
class WaitState:
    """The last wait a run parked for, and what became of it (read when its run resumes)."""

    tool_use_id: str
    key: str | None  # None: a timer
    wake_at: datetime.datetime
    since: datetime.datetime
    now: datetime.datetime
    event_id: int | None  # the event delivered to the call, if one was
    payload: Any = None

    @property
    def due(self) -> bool:
        return self.wake_at <= self.now


@dataclasses.dataclass(frozen=True)
class PendingWait:
    """A parked run's wait, as GET /api/runs/{id}/pending lists it."""

    kind: str  # "timer" or "event"
    wake_at: datetime.datetime
    key: str | None
    tool_use_id: str | None
    since: datetime.datetime | None


@dataclasses.dataclass(frozen=True)
class Posted:
    woke: list[uuid.UUID]
    replayed: bool


class Waits(Gateway):
    async def park_timer(
        self, run_id: uuid.UUID, worker: str, tool_use_id: str, *, seconds: float | None = None,
        at: datetime.datetime | None = None, epoch: int | None = None, again: bool = False,
    ) -> None:
        """Park a held run WAITING for a timer (`seconds` from when its call first started, else from now; or
        `at`), with no lease; LeaseLost if it was not held. A copy sent again finds the first parked."""
        row = await self._fenced(run_id, PARK_TIMER, {
            "id": run_id, "worker": worker, "epoch": epoch, "again": again, "kind": "timer", "at": at,
            "secs": seconds or 0.0, "key": None, "tuid": tool_use_id,
        }, again=again)
        if row is None or (row["parked"] is None and row["found"] is None):
            raise LeaseLost(run_id, worker)

    async def park_event(
        self, run_id: uuid.UUID, worker: str, tool_use_id: str, key: str, *, retention: float,
        seconds: float | None = None, at: datetime.datetime | None = None, epoch: int | None = None,
        again: bool = False,
    ) -> tuple[bool, Any]:
        """Give the call an event on `key` kept within `retention` seconds that the run has not received
        (oldest first): (True, its payload), the run still held. Else park the run WAITING for one, timing
        out `seconds` from now (or `at`), with no lease: (False, None). LeaseLost if it was not held."""
        params = {"id": run_id, "worker": worker, "epoch": epoch, "again": again, "kind": "event", "at": at,
                  "secs": seconds or 0.0, "key": key, "tuid": tool_use_id, "retention": retention}
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (SIGNAL_KEY_LOCK_CLASS, key))
            await cur.execute(PARK_EVENT.encode(), params)
            row = await cur.fetchone()
        if row is None:
            raise LeaseLost(run_id, worker)
        if row["held"] is not None and row["event_id"] is not None:
            return True, row["payload"]
        if row["parked"] is not None or row["found"] is not None:
            return False, None
        raise LeaseLost(run_id, worker)

    async def wait_state(self, run_id: uuid.UUID) -> WaitState | None:
        """The run's last wait and what came of it; None if it never waited."""
        row = await self._one(
            """SELECT r.wait_tool_use_id, r.wait_key, r.wake_at, r.wait_since, now() AS now, d.event_id, d.payload
               FROM run r LEFT JOIN run_event_delivery d ON d.run_id = r.id AND d.tool_use_id = r.wait_tool_use_id
               WHERE r.id = %s AND r.wait_tool_use_id IS NOT NULL""",
            (run_id,),
        )
        if row is None:
            return None
        return WaitState(row["wait_tool_use_id"], row["wait_key"], row["wake_at"], row["wait_since"] or row["now"],
                         row["now"], row["event_id"], row["payload"])

    async def pending_wait(self, run_id: uuid.UUID) -> PendingWait | None:
        """The timer or event a WAITING run waits for; None if it waits for nothing of the kind."""
        row = await self._one(
            f"""SELECT waiting_for, wake_at, wait_key, wait_tool_use_id, wait_since FROM run
                WHERE id = %s AND status = 'WAITING' AND waiting_for IN {WAITS}""",
            (run_id,),
        )
        if row is None:
            return None
        return PendingWait(row["waiting_for"], row["wake_at"], row["wait_key"], row["wait_tool_use_id"],
                           row["wait_since"])

    async def post_event(
        self, key: str, payload: Any, *, by: str | None = None, idempotency_key: str | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Posted:
        """Keep the event and deliver it to every run of `tenant` waiting on `key` now (each queued again): the
        runs woken. An event is its tenant's: no other tenant's wait ever gets it, and its key is its tenant's.

        With `idempotency_key`, a copy of a POST already answered gets the first answer (`replayed`) and
        delivers nothing: the key and the answer are stored with the event, in the same transaction, and
        two copies at once take turns on the key's lock."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            if idempotency_key is not None:
                await cur.execute(b"SELECT pg_advisory_xact_lock(%s, hashtext(%s || '/' || %s))",
                                  (SIGNAL_IDEMPOTENCY_LOCK_CLASS, tenant, idempotency_key))
                await cur.execute(b"SELECT answer FROM run_event WHERE tenant = %s AND idempotency_key = %s",
                                  (tenant, idempotency_key))
                first = await cur.fetchone()
                if first is not None:
                    return Posted([uuid.UUID(i) for i in first["answer"].get("woke", [])], True)
            await cur.execute(b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (SIGNAL_KEY_LOCK_CLASS, key))
            await cur.execute(POST_EVENT.encode(), {"key": key, "payload": Jsonb(payload), "by": by,
                                                    "idem": idempotency_key, "tenant": tenant})
            row = await cur.fetchone()
            assert row is not None
            await cur.execute(b"UPDATE run_event SET answer = %s WHERE id = %s",
                              (Jsonb({"woke": row["woke"]}), row["id"]))
        return Posted([uuid.UUID(i) for i in row["woke"]], False)

    async def wake_due(self, batch: int = SWEEP_BATCH) -> tuple[list[uuid.UUID], float | None]:
        """Queue again every run whose timer is due or whose event wait timed out, in one statement: (the
        runs woken, seconds until the next wait comes due or None)."""
        row = await self._one(SWEEP, {"batch": batch})
        assert row is not None
        nxt = row["next"]
        return list(row["woke"]), (None if nxt is None else max(float(nxt), 0.0))
