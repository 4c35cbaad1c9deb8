"""The webhook outbox: deliveries written by the run table's trigger (0019), claimed by the workers'
senders under a lease on the delivery row, and every attempt recorded."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from agentrun.worker.core.webhooks import Attempt, Delivery
from agentrun.worker.store.gateway import Gateway

DELIVERY_COLUMNS = """id, run_id, event, run_status, url, secret_ref, state, attempts, next_at, created_at,
    done_at, last_error"""

# Due deliveries, each taken by one sender: SKIP LOCKED lets concurrent senders pass each other's rows, and
# the claim moves `next_at` past the attempt's timeout (its lease), so no other sender takes the row while
# this one sends, and a sender that dies mid-attempt leaves it due again once the lease has passed.
# A due delivery past its give-up time is not sent but ended FAILED: recording an attempt gives up one whose
# next try would be too late, so only an attempt never recorded (its sender died mid-attempt) leaves one due
# then, and without this it would be sent, and could die again, after every lease.
_CLAIM = f"""WITH expired AS (
        UPDATE run_webhook SET state = 'FAILED', done_at = now(), claimed_by = NULL,
            last_error = coalesce(last_error, 'given up at its give-up time, no attempt recorded (each sender '
                                              'that took it stopped before recording its attempt)')
        WHERE id IN (SELECT id FROM run_webhook WHERE state = 'PENDING' AND next_at <= now()
                       AND created_at + make_interval(secs => %(give_up)s::float8) <= now()
                     FOR UPDATE SKIP LOCKED)
        RETURNING id)
    UPDATE run_webhook w SET attempts = w.attempts + 1, claimed_by = %(worker)s,
        next_at = now() + make_interval(secs => %(lease)s)
    WHERE w.id IN (SELECT id FROM run_webhook WHERE state = 'PENDING' AND next_at <= now()
                     AND (%(give_up)s::float8 IS NULL OR created_at + make_interval(secs => %(give_up)s) > now())
                   ORDER BY next_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING {DELIVERY_COLUMNS}"""

# The attempt is history whatever happens; the delivery moves on only if this sender still holds the
# attempt it made (a sender whose lease lapsed mid-attempt, the row taken by another, changes nothing).
_RECORD = """WITH a AS (
        INSERT INTO run_webhook_attempt (delivery_id, run_id, attempt, worker, started_at, status_code,
                                         latency_ms, error)
        SELECT id, run_id, %(attempt)s, %(worker)s, %(started_at)s, %(status_code)s, %(latency_ms)s, %(error)s
        FROM run_webhook WHERE id = %(id)s
        RETURNING 1),
    u AS (
        UPDATE run_webhook SET
            state = CASE WHEN %(delivered)s THEN 'DELIVERED'
                         WHEN now() + make_interval(secs => %(retry_in)s)
                              > created_at + make_interval(secs => %(give_up)s) THEN 'FAILED'
                         ELSE 'PENDING' END,
            done_at = CASE WHEN %(delivered)s OR now() + make_interval(secs => %(retry_in)s)
                                > created_at + make_interval(secs => %(give_up)s) THEN now() END,
            next_at = now() + make_interval(secs => %(retry_in)s),
            last_error = %(error)s, claimed_by = NULL
        WHERE id = %(id)s AND state = 'PENDING' AND claimed_by = %(worker)s AND attempts = %(attempt)s
        RETURNING state)
    SELECT (SELECT count(*) FROM a) AS recorded, (SELECT state FROM u) AS state"""


def _delivery(row: dict[str, Any], history: tuple[Attempt, ...] = ()) -> Delivery:
    return Delivery(**row, history=history)


class Webhooks(Gateway):
    async def claim_webhooks(self, worker: str, lease_seconds: float, limit: int,
                             give_up_seconds: float | None = None) -> list[Delivery]:
        """Take up to `limit` due deliveries for one attempt each, under a lease of `lease_seconds`; those due
        `give_up_seconds` or more after their creation are ended FAILED instead (see _CLAIM; None: none)."""
        rows = await self._all(_CLAIM, {"worker": worker, "lease": lease_seconds, "limit": limit,
                                        "give_up": give_up_seconds})
        return [_delivery(r) for r in rows]

    async def record_webhook_attempt(
        self, delivery: Delivery, worker: str, started_at: datetime.datetime, *, status_code: int | None,
        latency_ms: int | None, error: str | None, delivered: bool, retry_in: float, give_up_seconds: float,
    ) -> str | None:
        """Store the attempt; returns the delivery's state after it (DELIVERED, PENDING again, or FAILED:
        given up), or None if the delivery was no longer this sender's to move on."""
        row = await self._one(_RECORD, {
            "id": delivery.id, "attempt": delivery.attempts, "worker": worker, "started_at": started_at,
            "status_code": status_code, "latency_ms": latency_ms, "error": error, "delivered": delivered,
            "retry_in": retry_in, "give_up": give_up_seconds,
        })
        return row["state"] if row else None

    async def next_webhook_in(self) -> float | None:
        """Seconds until the next pending delivery is due (0 if one is), or None if none is pending."""
        row = await self._one(
            # greatest() skips NULLs: the CASE keeps "none pending" NULL rather than 0 (due now).
            "SELECT CASE WHEN min(next_at) IS NOT NULL THEN greatest(0, extract(epoch FROM min(next_at) - now())) "
            "END::float8 AS due FROM run_webhook WHERE state = 'PENDING'", ())
        return row["due"] if row and row["due"] is not None else None

    async def webhooks_of(self, run_id: uuid.UUID) -> list[Delivery]:
        """The run's deliveries, oldest first, each with its attempts."""
        rows = await self._all(
            f"SELECT {DELIVERY_COLUMNS} FROM run_webhook WHERE run_id = %s ORDER BY created_at, id", (run_id,))
        attempts = await self._all(
            """SELECT delivery_id, attempt, started_at, status_code, latency_ms, error, worker
               FROM run_webhook_attempt WHERE run_id = %s ORDER BY delivery_id, attempt, id""", (run_id,))
        by: dict[uuid.UUID, list[Attempt]] = {}
        for a in attempts:
            did = a.pop("delivery_id")
            by.setdefault(did, []).append(Attempt(**a))
        return [_delivery(r, tuple(by.get(r["id"], ()))) for r in rows]
