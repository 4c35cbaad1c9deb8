"""Schedules (issue 27): their rows, and the tick pass that creates their runs.

Exactly one run per tick across every worker and every crash: a pass locks the due schedules' rows
(FOR UPDATE SKIP LOCKED: another worker's pass takes the others, or none), and for each inserts the tick
row (unique key: schedule, scheduled time), the run and the schedule's next due time in one transaction.
A worker killed in the middle commits none of it; the next pass, on any worker, takes the tick again.

One schedule's failure is its own: each is taken in a savepoint of the pass. A tick whose run cannot be made
fails alone and its schedule goes on at its next tick; a schedule whose ticks cannot be worked out (a time
zone tzdata has since dropped) stops, its next due time cleared, until it is changed. Either way
`last_error` says why. Only an outage (a transient database error) fails the whole pass, taken again later.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentrun.worker.core.errors import OverQuota, Refused
from agentrun.worker.core.records import NewRun, Run
from agentrun.worker.core.schedules import ConcurrencyPolicy, Schedule, due, next_time, timing_problem
from agentrun.worker.core.tenants import DEFAULT_TENANT
from agentrun.worker.core.text import unstorable
from agentrun.worker.store.groupcommit import transient
from agentrun.worker.store.rows import RUN_COLUMNS, as_run
from agentrun.worker.store.submit import Submissions, cancel_in, insert_run, run_params

SCHEDULE_COLUMNS = """s.name, s.cron, s.interval_seconds, s.timezone, s.run, s.spec, s.concurrency_policy,
    s.starting_deadline_seconds, s.suspend, s.anchor, s.next_due_at, s.last_schedule_time, s.last_error, s.missed,
    s.k8s_namespace, s.k8s_name, s.created_at, s.created_by, s.updated_at, s.tenant,
    (SELECT count(*) FROM run r WHERE r.tenant = s.tenant AND r.schedule_name = s.name
        AND r.status IN ('QUEUED', 'RUNNING', 'WAITING'))::int AS active"""

ACTIVE_RUNS = """SELECT id FROM run WHERE tenant = %s AND schedule_name = %s
AND status IN ('QUEUED', 'RUNNING', 'WAITING') ORDER BY created_at"""

PASS_BATCH = 20  # due schedules one pass takes


@dataclasses.dataclass(frozen=True)
class Tick:
    """What a pass did with one due schedule."""

    schedule: str
    scheduled_time: datetime.datetime | None  # the tick run (or skipped, or failed); None: only missed ones
    outcome: str  # created | skipped | missed | failed | taken (another worker had it already) | stopped
    run_id: uuid.UUID | None = None
    missed: int = 0
    replaced: tuple[uuid.UUID, ...] = ()
    error: str | None = None


Planner = Callable[[Schedule, datetime.datetime], Awaitable[NewRun]]


def _schedule(row: dict[str, Any]) -> Schedule:
    row = dict(row)
    row["concurrency_policy"] = ConcurrencyPolicy(row["concurrency_policy"])
    return Schedule(**row)


def _texts(s: Schedule) -> None:
    for field, text in (("cron", s.cron), ("timezone", s.timezone)):
        if (why := unstorable(text)) is not None:
            raise ValueError(f"{field} {why}")


class Schedules(Submissions):
    async def create_schedule(self, s: Schedule, created_by: str | None = None, *,
                              replace: bool = False) -> tuple[Schedule, bool]:
        """Store a new schedule of `s.tenant` (its first tick after now); returns it and whether it was stored.
        An existing one of the name is left as it is, unless `replace` (the operator's spec, the truth),
        when its definition is replaced and its ticks go on from its next due time."""
        _texts(s)
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(b"SELECT date_trunc('second', now()) AS now")
            row = await cur.fetchone()
            assert row is not None
            now: datetime.datetime = row["now"]
            first = None if s.suspend else next_time(dataclasses.replace(s, anchor=now), now)
            params = {
                "name": s.name, "cron": s.cron, "interval": s.interval_seconds, "tz": s.timezone,
                "run": Jsonb(s.run), "spec": Jsonb(s.spec), "policy": s.concurrency_policy.value,
                "deadline": s.starting_deadline_seconds, "suspend": s.suspend, "anchor": now, "next": first,
                "ns": s.k8s_namespace, "k8s": s.k8s_name, "by": created_by, "tenant": s.tenant,
            }
            await cur.execute(
                b"""INSERT INTO schedule (name, cron, interval_seconds, timezone, run, spec, concurrency_policy,
                        starting_deadline_seconds, suspend, anchor, next_due_at, k8s_namespace, k8s_name, created_by,
                        tenant)
                    VALUES (%(name)s, %(cron)s, %(interval)s, %(tz)s, %(run)s, %(spec)s, %(policy)s, %(deadline)s,
                            %(suspend)s, %(anchor)s, %(next)s, %(ns)s, %(k8s)s, %(by)s, %(tenant)s)
                    ON CONFLICT (tenant, name) DO NOTHING
                    RETURNING name""",
                params,
            )
            created = await cur.fetchone() is not None
        if not created and replace:
            found = await self.update_schedule(s, k8s=True)
            assert found is not None
            return found, False
        found = await self.schedule(s.name, s.tenant)
        assert found is not None
        return found, created

    async def update_schedule(self, s: Schedule, *, k8s: bool = False) -> Schedule | None:
        """Replace the definition of `s.tenant`'s schedule `s.name` (None if there is none). A change of timing, or a
        resume, makes its next due time the first tick after now; suspending clears it."""
        _texts(s)
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT {SCHEDULE_COLUMNS}, now() AS db_now FROM schedule s "
                              "WHERE s.tenant = %s AND s.name = %s FOR UPDATE".encode(), (s.tenant, s.name))
            row = await cur.fetchone()
            if row is None:
                return None
            now: datetime.datetime = row.pop("db_now")
            old = _schedule(row)
            timing = (old.cron, old.interval_seconds, old.timezone) != (s.cron, s.interval_seconds, s.timezone)
            anchor = now.replace(microsecond=0) if timing or old.anchor is None else old.anchor
            new = dataclasses.replace(s, anchor=anchor)
            if s.suspend:
                next_due = None
            elif timing or old.suspend or old.next_due_at is None:
                next_due = next_time(new, now)
            else:
                next_due = old.next_due_at
            # One stopped because its ticks could not be worked out (`_stop`) starts again: its error is past.
            restarted = not old.suspend and old.next_due_at is None and next_due is not None
            await cur.execute(
                b"""UPDATE schedule SET cron = %(cron)s, interval_seconds = %(interval)s, timezone = %(tz)s,
                        run = %(run)s, spec = %(spec)s, concurrency_policy = %(policy)s,
                        starting_deadline_seconds = %(deadline)s, suspend = %(suspend)s, anchor = %(anchor)s,
                        next_due_at = %(next)s, updated_at = now(),
                        last_error = CASE WHEN %(restarted)s THEN NULL ELSE last_error END,
                        k8s_namespace = CASE WHEN %(k8s)s THEN %(ns)s ELSE k8s_namespace END,
                        k8s_name = CASE WHEN %(k8s)s THEN %(k8s_name)s ELSE k8s_name END
                    WHERE tenant = %(tenant)s AND name = %(name)s""",
                {"name": s.name, "tenant": s.tenant, "cron": s.cron, "interval": s.interval_seconds, "tz": s.timezone,
                 "run": Jsonb(s.run), "spec": Jsonb(s.spec), "policy": s.concurrency_policy.value,
                 "deadline": s.starting_deadline_seconds, "suspend": s.suspend, "anchor": anchor, "next": next_due,
                 "k8s": k8s, "ns": s.k8s_namespace, "k8s_name": s.k8s_name, "restarted": restarted},
            )
        return await self.schedule(s.name, s.tenant)

    async def schedule(self, name: str, tenant: str = DEFAULT_TENANT) -> Schedule | None:
        """`tenant`'s schedule `name`, or None."""
        row = await self._one(f"SELECT {SCHEDULE_COLUMNS} FROM schedule s WHERE s.tenant = %s AND s.name = %s",
                              (tenant, name))
        return _schedule(row) if row else None

    async def schedules(self, tenant: str = DEFAULT_TENANT) -> list[Schedule]:
        """`tenant`'s schedules, by name."""
        return [_schedule(r) for r in await self._all(
            f"SELECT {SCHEDULE_COLUMNS} FROM schedule s WHERE s.tenant = %s ORDER BY s.name", (tenant,))]

    async def delete_schedule(self, name: str, tenant: str = DEFAULT_TENANT) -> bool:
        """Delete `tenant`'s schedule and its ticks; the runs it created stay (with their `scheduleName`)."""
        return await self._one("DELETE FROM schedule WHERE tenant = %s AND name = %s RETURNING name",
                               (tenant, name)) is not None

    async def schedule_runs(self, name: str, limit: int, tenant: str = DEFAULT_TENANT) -> list[Run]:
        """The runs `tenant`'s schedule `name` made, newest first."""
        rows = await self._all(
            f"""SELECT {RUN_COLUMNS} FROM run r WHERE r.tenant = %(tenant)s AND r.schedule_name = %(name)s
                ORDER BY r.created_at DESC, r.id LIMIT %(limit)s""",
            {"name": name, "limit": limit, "tenant": tenant})
        return [as_run(r) for r in rows]

    async def schedule_ticks(self, name: str, tenant: str = DEFAULT_TENANT) -> list[dict[str, Any]]:
        """The schedule's tick rows, oldest first (tests, debugging)."""
        return await self._all("SELECT schedule_name, scheduled_time, outcome, run_id FROM schedule_tick "
                               "WHERE tenant = %s AND schedule_name = %s ORDER BY scheduled_time", (tenant, name))

    async def next_due_in(self) -> float | None:
        """Seconds until the earliest schedule is due (<= 0: due now), None when none is: the ticker's one
        statement while idle (the index on the due time answers it)."""
        row = await self._one("SELECT extract(epoch FROM min(next_due_at) - now())::float8 AS wait "
                              "FROM schedule WHERE next_due_at IS NOT NULL", ())
        return row["wait"] if row is not None else None

    async def tick(self, plan: Planner, by: str | None = None) -> list[Tick]:
        """One pass: every due schedule no other worker is taking gets its tick (see the module's doc).

        `plan` makes the run of a schedule's tick (its template planned as a submission is); a refusal
        (the agent deleted since, a tool gone) fails the tick, noted in the schedule's `last_error`."""
        done: list[Tick] = []
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"""SELECT {SCHEDULE_COLUMNS}, now() AS db_now FROM schedule s
                    WHERE s.next_due_at <= now() ORDER BY s.next_due_at LIMIT %s
                    FOR UPDATE OF s SKIP LOCKED""".encode(),
                (PASS_BATCH,),
            )
            rows = await cur.fetchall()
            for row in rows:
                now: datetime.datetime = row.pop("db_now")
                try:
                    async with conn.transaction():  # a savepoint: a failure undoes this schedule's part alone
                        done.append(await self._pass_one(conn, cur, _schedule(row), now, plan, by))
                except Exception as e:
                    if transient(e):
                        raise  # an outage, not this schedule: the whole pass is taken again after a backoff
                    done.append(await self._stop(cur, row["tenant"], row["name"], f"{type(e).__name__}: {e}"))
        return done

    async def _pass_one(
        self, conn: Any, cur: Any, s: Schedule, now: datetime.datetime, plan: Planner, by: str | None,
    ) -> Tick:
        """What the pass does with the due schedule `s`: its tick, its missed ones, its next due time."""
        if (problem := timing_problem(s)) is not None:
            return await self._stop(cur, s.tenant, s.name, problem)
        d = due(s, now)
        outcome, run_id, error = "missed", None, None
        replaced: tuple[uuid.UUID, ...] = ()
        if d.run is not None:
            try:
                async with conn.transaction():
                    outcome, run_id, error, replaced = await self._take(cur, s, d.run, plan, by)
            except OverQuota as e:  # its tenant's queue is full or its budget spent: the next tick tries again
                error = f"tick {d.run.isoformat()} created no run: over its tenant's quota {e.quota}: {e.message}"
                await self._tick_row(cur, s, d.run, "failed", None)
                outcome, run_id, replaced = "failed", None, ()
            except Exception as e:
                if transient(e):
                    raise
                # Unforeseen (a planner's bug, a run the database refuses): this tick fails, as a refusal does.
                error = f"tick {d.run.isoformat()} created no run: {type(e).__name__}: {e}"
                await self._tick_row(cur, s, d.run, "failed", None)
                outcome, run_id, replaced = "failed", None, ()
        await cur.executemany(
            b"""INSERT INTO schedule_tick (tenant, schedule_name, scheduled_time, outcome)
                VALUES (%s, %s, %s, 'missed') ON CONFLICT DO NOTHING""",
            [(s.tenant, s.name, t) for t in d.missed_times],
        )
        await cur.execute(
            b"""UPDATE schedule SET next_due_at = %(next)s, missed = missed + %(missed)s,
                    last_schedule_time = CASE WHEN %(created)s THEN %(tick)s ELSE last_schedule_time END,
                    last_error = CASE WHEN %(outcome)s IN ('created', 'skipped') THEN NULL
                                      WHEN %(error)s::text IS NOT NULL THEN %(error)s ELSE last_error END
                WHERE tenant = %(tenant)s AND name = %(name)s""",
            {"next": d.next_due, "missed": d.missed, "created": outcome == "created", "tick": d.run,
             "outcome": outcome, "error": error, "name": s.name, "tenant": s.tenant},
        )
        # Ticks are kept a day (or the starting deadline, if longer): the unique key need
        # outlive no retry, and a schedule every second would otherwise grow without end.
        await cur.execute(
            b"""DELETE FROM schedule_tick WHERE tenant = %s AND schedule_name = %s
                AND scheduled_time < now() - make_interval(secs => greatest(86400, %s))""",
            (s.tenant, s.name, s.starting_deadline_seconds),
        )
        return Tick(s.name, d.run, outcome, run_id, d.missed, replaced, error)

    @staticmethod
    async def _stop(cur: Any, tenant: str, name: str, why: str) -> Tick:
        """Stop the schedule whose ticks cannot be worked out: no next due time (taken by no pass until it is
        changed or resumed, which works it out again) and `last_error` saying why."""
        error = (f"stopped: its ticks cannot be worked out ({why}); a change of the schedule or a resume "
                 f"(PATCH /api/schedules/{name}) starts it again")
        await cur.execute(b"UPDATE schedule SET next_due_at = NULL, last_error = %s WHERE tenant = %s AND name = %s",
                          (error, tenant, name))
        return Tick(name, None, "stopped", error=error)

    async def _take(
        self, cur: Any, s: Schedule, tick: datetime.datetime, plan: Planner, by: str | None,
    ) -> tuple[str, uuid.UUID | None, str | None, tuple[uuid.UUID, ...]]:
        """The tick of `s` at `tick`, in the pass's transaction: (outcome, run id, error, runs replaced)."""
        replaced: tuple[uuid.UUID, ...] = ()
        if s.concurrency_policy is not ConcurrencyPolicy.ALLOW:
            await cur.execute(ACTIVE_RUNS.encode(), (s.tenant, s.name))
            active = [r["id"] for r in await cur.fetchall()]
            if active and s.concurrency_policy is ConcurrencyPolicy.FORBID:
                await self._tick_row(cur, s, tick, "skipped", None)
                return "skipped", None, None, ()
            replaced = tuple(active)  # cancelled below, once this tick's run is made
        try:
            new = await plan(s, tick)
            params = run_params(new)
        except (Refused, ValueError) as e:
            error = f"tick {tick.isoformat()} created no run: {e}"
            await self._tick_row(cur, s, tick, "failed", None)
            return "failed", None, error, ()
        if not await self._tick_row(cur, s, tick, "created", params["id"]):
            return "taken", None, None, ()
        run_id = await insert_run(cur, params)
        if run_id is None:  # its id is the tick's: already there, from this tick
            return "taken", None, None, ()
        # Replace: the runs before are asked to stop in the transaction that makes the new one, so a pass
        # that fails or a worker that dies leaves both as they were, never the old cancelled and no new one.
        for old in replaced:
            await cancel_in(cur, old, by or f"schedule:{s.name}")
        return "created", run_id, None, replaced

    @staticmethod
    async def _tick_row(cur: Any, s: Schedule, tick: datetime.datetime, outcome: str, run_id: uuid.UUID | None) -> bool:
        await cur.execute(
            b"""INSERT INTO schedule_tick (tenant, schedule_name, scheduled_time, outcome, run_id)
                VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING scheduled_time""",
            (s.tenant, s.name, tick, outcome, run_id),
        )
        return await cur.fetchone() is not None
