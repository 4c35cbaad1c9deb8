"""Messages into a running run: stored at once by the API, delivered by the driver as USER steps.

The run row's counters `messages_sent` and `messages_delivered` (migration 0015) are the referee: the
post counts one up in the same UPDATE that checks the run is not finished, the delivery counts the
steps it writes, and a run ends SUCCEEDED only while the two are equal (StepWrites.finish). Both sides
lock the run row and re-check it, so a message answered 202 is never lost to a run that ends without it.
"""

from __future__ import annotations

import uuid
from typing import Any

from agentrun.worker.core.records import Message, Progress, RunStatus, Step, StepKind, StepStatus
from agentrun.worker.core.replay import MESSAGE
from agentrun.worker.core.text import unstorable
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.rows import FENCE, OWNED, PROGRESS, LeaseLost, as_progress

MESSAGE_COLUMNS = "run_id, n, text, created_by, created_at, seq"
DELIVERY_BATCH = 64
"""Messages one delivery write takes at most (the rest follow in the next, at the same boundary)."""


def _message(row: dict[str, Any]) -> Message:
    return Message(**{k: row[k] for k in ("run_id", "n", "text", "created_by", "created_at", "seq")})


class Messages(Gateway):
    async def post_message(
        self, run_id: uuid.UUID, text: str, by: str | None = None
    ) -> tuple[Message | None, RunStatus | None]:
        """Store a message for a run that has not finished: (the message, its status then).

        (None, None): there is no such run; (None, status): it has finished (`status`), nothing stored.
        Raises ValueError for a text PostgreSQL cannot store (a NUL character, a lone surrogate).
        One statement: the UPDATE that counts the message locks the run row and, should the run's end be
        committing meanwhile, re-checks the row's new version, so a run that finished is never told it.
        """
        if (why := unstorable(text)) is not None:
            raise ValueError(f"message text {why}")  # the API refuses it first (422); a caller of the store too
        row = await self._one(
            f"""WITH counted AS (
                    UPDATE run SET messages_sent = messages_sent + 1
                    WHERE id = %(id)s AND status IN ('QUEUED', 'RUNNING', 'WAITING') AND NOT cancel_requested
                    RETURNING id, messages_sent, status),
                stored AS (
                    INSERT INTO run_message (run_id, n, text, created_by)
                    SELECT id, messages_sent, %(text)s, %(by)s FROM counted
                    RETURNING {MESSAGE_COLUMNS})
                SELECT stored.*, counted.status AS run_status FROM stored JOIN counted ON counted.id = stored.run_id""",
            {"id": run_id, "text": text, "by": by},
        )
        if row is not None:
            return _message(row), RunStatus(row["run_status"])
        # Not stored: the run is unknown or finished. Its status is read after the UPDATE's end, so a
        # run that just finished reads as finished.
        found = await self._one("SELECT status FROM run WHERE id = %s", (run_id,))
        return None, RunStatus(found["status"]) if found is not None else None

    async def messages(self, run_id: uuid.UUID) -> list[Message]:
        """The messages posted to a run, in the order received, delivered or not."""
        rows = await self._all(f"SELECT {MESSAGE_COLUMNS} FROM run_message WHERE run_id = %s ORDER BY n", (run_id,))
        return [_message(r) for r in rows]

    async def deliver_messages(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, write_id: uuid.UUID,
        epoch: int | None = None, again: bool = False, limit: int = DELIVERY_BATCH,
    ) -> tuple[list[Step], Progress]:
        """Append the run's undelivered messages as USER steps, one per message in the order received, and
        mark them delivered, in one fenced statement; returns the steps and the progress.

        `write_id` names the write: a copy sent again after the first's outcome was lost finds the steps
        the first wrote (the messages it marked) and writes none, so no message is delivered twice. A
        message committed while this statement runs is not seen by it; the counters say so
        (`Progress.messages`) and the next delivery takes it."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                done AS (SELECT n FROM run_message WHERE run_id = %(id)s AND write_id = %(wid)s),
                top AS (SELECT coalesce(max(seq), 0) AS seq FROM run_step WHERE run_id = %(id)s),
                todo AS (
                    SELECT m.n, m.text, m.created_by, row_number() OVER (ORDER BY m.n) AS k
                    FROM (SELECT n, text, created_by FROM run_message
                          WHERE run_id = %(id)s AND seq IS NULL AND EXISTS (SELECT 1 FROM fence)
                            AND NOT EXISTS (SELECT 1 FROM done)
                          ORDER BY n LIMIT %(limit)s) m),
                step AS (
                    INSERT INTO run_step (run_id, seq, kind, status, request, response, worker, started_at,
                                          finished_at, created_by)
                    SELECT %(id)s, top.seq + todo.k, 'USER', 'DONE', %(marker)s, todo.text, %(worker)s, now(), now(),
                           todo.created_by
                    FROM todo, top
                    RETURNING seq),
                marked AS (
                    UPDATE run_message m SET seq = top.seq + todo.k, write_id = %(wid)s
                    FROM todo, top WHERE m.run_id = %(id)s AND m.n = todo.n
                    RETURNING m.n),
                {OWNED.format(extra=", messages_delivered = run.messages_delivered + (SELECT count(*) FROM todo)")}
                SELECT {PROGRESS}, (SELECT count(*) FROM step) AS written FROM owned""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "wid": write_id, "epoch": epoch,
             "limit": max(1, min(limit, DELIVERY_BATCH)), "marker": MESSAGE},
            again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        progress = as_progress(row)
        # The steps this write made, or (a copy sent again) the ones its first copy made: read back by the
        # write id, after the commit.
        rows = await self._all(
            """SELECT s.seq, s.response, s.created_by, s.worker, s.started_at, s.finished_at
               FROM run_message m JOIN run_step s ON s.run_id = m.run_id AND s.seq = m.seq
               WHERE m.run_id = %s AND m.write_id = %s ORDER BY m.n""",
            (run_id, write_id),
        )
        steps = [Step(run_id, r["seq"], StepKind.USER, StepStatus.DONE, request=MESSAGE, response=r["response"],
                      worker=r["worker"], started_at=r["started_at"], finished_at=r["finished_at"],
                      created_by=r["created_by"]) for r in rows]
        return steps, progress
