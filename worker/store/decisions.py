"""People in the loop: a run parked for decisions, the decisions, reconcile probes, expiry of waits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from psycopg.rows import dict_row

from agentrun.worker.core.errors import CancelRequested
from agentrun.worker.core.records import (
    Decision,
    DecisionKind,
    PendingCall,
    Run,
    RunStatus,
)
from agentrun.worker.core.text import clean
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.rows import (
    DECISION_COLUMNS,
    FENCE,
    FENCE_ASKED,
    OWNED,
    DecideOutcome,
    LeaseLost,
    as_pending,
)


class Decisions(Gateway):
    # -- people in the loop ------------------------------------------------------------------------

    async def park(
        self, run_id: uuid.UUID, worker: str, calls: Sequence[tuple[str, DecisionKind, str, str | None, int]], *,
        epoch: int | None = None, again: bool = False,
    ) -> None:
        """Hand a held run over to people: one pending decision per (tool_use id, kind, tool, input, attempt),
        and the run WAITING with no lease, so no worker holds it and nothing is spent while it waits.

        A copy sent again (`again`) finds the run parked under the same epoch (waiting, or past it:
        decided, cancelled, timed out) and counts as done. Raises CancelRequested, asking nobody and parking
        nothing, if the run was asked to stop (it is still held: it ends CANCELLED). Nothing would wake
        a run parked for people, so the park itself must see a cancel that came while it was held."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE_ASKED},
                asked AS (
                    INSERT INTO run_decision (run_id, tool_use_id, kind, tool_name, input, attempt, position)
                    SELECT fence.id, c.tuid, c.kind, c.name, c.input, c.attempt, c.position
                    FROM fence, unnest(%(tuids)s::text[], %(kinds)s::text[], %(names)s::text[], %(inputs)s::text[],
                                       %(attempts)s::int[])
                         WITH ORDINALITY AS c (tuid, kind, name, input, attempt, position)
                    WHERE NOT fence.cancel_requested
                    ON CONFLICT (run_id, tool_use_id, kind, attempt) DO NOTHING),
                parked AS (
                    UPDATE run SET status = 'WAITING', locked_by = NULL, locked_until = NULL
                    FROM fence WHERE run.id = fence.id AND NOT fence.cancel_requested RETURNING run.id)
                SELECT (SELECT cancel_requested FROM fence) AS asked, coalesce(
                    (SELECT id FROM parked),
                    (SELECT id FROM run WHERE id = %(id)s AND %(epoch)s::bigint IS NOT NULL
                        AND lease_epoch = %(epoch)s::bigint AND status <> 'RUNNING' AND locked_by IS NULL
                        AND NOT handed_back)) AS id""",
            {"id": run_id, "worker": worker, "tuids": [c[0] for c in calls], "kinds": [c[1].value for c in calls],
             "names": [c[2] for c in calls], "inputs": [c[3] for c in calls], "attempts": [c[4] for c in calls],
             "epoch": epoch},
            again=again,
        )
        if row is not None and row["asked"]:
            raise CancelRequested(run_id)
        if row is None or row["id"] is None:
            raise LeaseLost(run_id, worker)

    async def reconcile(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, epoch: int | None = None,
        again: bool = False, tool_use_id: str, tool_name: str, input: str | None, attempt: int, decision: Decision,
        output: str | None, reason: str,
    ) -> PendingCall:
        """Store what a tool's reconcile probe found about a call in doubt at `attempt` as the decision on it
        (`decided_by` "reconcile"), before the engine acts on it; returns the decision stored. A copy sent
        again (its outcome was lost) or a probe run again after a crash finds the one stored first and
        returns that: one decision per attempt, whoever took it."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                decided AS (
                    INSERT INTO run_decision (run_id, tool_use_id, kind, tool_name, input, attempt, decision,
                                              output, reason, decided_at, decided_by)
                    SELECT fence.id, %(tuid)s, 'in_doubt', %(name)s, %(input)s, %(attempt)s, %(decision)s,
                           %(output)s, %(reason)s, now(), 'reconcile'
                    FROM fence
                    ON CONFLICT (run_id, tool_use_id, kind, attempt) DO UPDATE SET tool_name = run_decision.tool_name
                    RETURNING {DECISION_COLUMNS}),
                {OWNED.format(extra="")}
                SELECT decided.* FROM owned, decided""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "tuid": tool_use_id, "name": tool_name,
             "input": input, "attempt": attempt, "decision": decision.value, "output": output,
             "reason": clean(reason), "epoch": epoch},
            again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        return as_pending(row)

    async def decisions(self, run_id: uuid.UUID) -> list[PendingCall]:
        """Every call of the run that needed a person, decided or not, oldest first."""
        rows = await self._all(
            f"SELECT {DECISION_COLUMNS} FROM run_decision WHERE run_id = %s ORDER BY since, position, attempt",
            (run_id,),
        )
        return [as_pending(r) for r in rows]

    async def decide(
        self, run_id: uuid.UUID, tool_use_id: str, decision: Decision, *, output: str | None = None,
        is_error: bool = False, reason: str | None = None, by: str | None = None,
    ) -> tuple[DecideOutcome, Run | None]:
        """Store a decision on a pending call, exactly once; the last open one queues the run again.

        The run row is locked first, so two decisions on one run are taken one after the other: of two
        on the same call the second finds it decided; of the last two open ones, the second sees the
        first and queues the run.
        """
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(b"SELECT status FROM run WHERE id = %s FOR UPDATE", (run_id,))
            found = await cur.fetchone()
            if found is None:
                return DecideOutcome.NO_RUN, None
            await cur.execute(  # the open one first: an approved call may be in doubt now, or in doubt again
                b"""SELECT kind, attempt, decision FROM run_decision WHERE run_id = %s AND tool_use_id = %s
                    ORDER BY decision IS NULL DESC, since DESC, attempt DESC LIMIT 1""",
                (run_id, tool_use_id),
            )
            call = await cur.fetchone()
            if call is None:
                return DecideOutcome.NO_CALL, None
            if call["kind"] != decision.kind.value:
                return DecideOutcome.WRONG_KIND, None
            if call["decision"] is not None or found["status"] != RunStatus.WAITING.value:
                return DecideOutcome.ALREADY, None
            await cur.execute(
                b"""UPDATE run_decision SET decision = %(decision)s, output = %(output)s, is_error = %(is_error)s,
                           reason = %(reason)s, decided_at = now(), decided_by = %(by)s
                    WHERE run_id = %(id)s AND tool_use_id = %(tuid)s AND kind = %(kind)s AND attempt = %(attempt)s""",
                {"decision": decision.value, "kind": call["kind"], "attempt": call["attempt"], "output": output,
                 "is_error": is_error,
                 "reason": clean(reason) if reason is not None else None, "by": by, "id": run_id,
                 "tuid": tool_use_id},
            )
            await cur.execute(
                b"""UPDATE run SET status = 'QUEUED', run_at = now()
                    WHERE id = %s AND status = 'WAITING'
                      AND NOT EXISTS (SELECT 1 FROM run_decision WHERE run_id = %s AND decision IS NULL)""",
                (run_id, run_id),
            )
        return DecideOutcome.DECIDED, await self.get(run_id)

    async def end_cancelled_waiting(self) -> list[uuid.UUID]:
        """End CANCELLED the waiting runs that were asked to stop: a backstop, as no worker holds them to
        notice. A cancel ends a waiting run at once and a park refuses a run asked to stop, so none is left
        so today; a run parked before that park was fenced on the ask (before issue 44) could be."""
        rows = await self._all(
            """UPDATE run SET status = 'CANCELLED', finished_at = now(),
                   error = CASE WHEN waiting_for = 'children' THEN 'cancelled while waiting for its sub-agents'
                                WHEN waiting_for = 'timer' THEN 'cancelled while waiting (a timer)'
                                WHEN waiting_for = 'event' THEN 'cancelled while waiting for event ' || wait_key
                                ELSE 'cancelled while waiting for a decision' END
               WHERE status = 'WAITING' AND cancel_requested RETURNING id""",
            (),
        )
        return [r["id"] for r in rows]

    async def expire_waiting(self) -> list[uuid.UUID]:
        """End the waiting runs whose deadline has passed (no worker holds them to notice)."""
        rows = await self._all(
            """UPDATE run SET status = 'TIMED_OUT', finished_at = now(),
                   error = 'deadline passed while waiting for '
                           || CASE WHEN waiting_for = 'children' THEN 'its sub-agents'
                                   WHEN waiting_for = 'timer' THEN 'a timer'
                                   WHEN waiting_for = 'event' THEN 'event ' || wait_key ELSE 'a decision' END
                           || ': the run may take ' || timeout_seconds || 's'
               WHERE status = 'WAITING' AND deadline_at <= now() RETURNING id""",
            (),
        )
        return [r["id"] for r in rows]
