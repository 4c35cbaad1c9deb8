"""The fleet-wide model limits' counters: one `model_limit` row per limit, shared by every worker.

The policy (which limit a model takes, how long to wait, what a 429 does) is llm/limits.py's; these are
its statements, each one round trip.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

# One statement: refill the buckets for the time passed (at the rate in force: tightened after a 429
# until tight_until), drop slots that expired, and take a slot, a request and the tokens if all are
# there; else change nothing and say how long to wait for the rates (the slots are polled).
RESERVE = """
WITH cur AS (
    SELECT l.*, now() AS t, CASE WHEN l.tight_until > now() THEN l.factor ELSE 1 END AS f
    FROM model_limit l WHERE key = %(key)s FOR UPDATE),
state AS (
    SELECT cur.*,
        (SELECT coalesce(jsonb_object_agg(k, v), '{}') FROM jsonb_each(cur.in_flight) AS e(k, v)
         WHERE v::float8 > extract(epoch FROM cur.t)) AS live,
        CASE WHEN %(conc)s::int IS NULL THEN NULL ELSE greatest(1, floor(%(conc)s * f))::int END AS conc_max,
        %(rpm)s::float8 * f AS rpm_max, %(tpm)s::float8 * f AS tpm_max,
        -- A pause refills nothing: the buckets fill again from its end, so the first requests after a 429's
        -- `retry-after` go at the tightened rate, not all at once from what the pause let pile up.
        extract(epoch FROM cur.t - greatest(cur.refilled_at, least(coalesce(cur.paused_until, cur.t), cur.t)))
            AS elapsed
    FROM cur),
level AS (
    SELECT state.*,
        least(rpm_max, requests + rpm_max / 60 * elapsed) AS req_now,
        least(tpm_max, tokens + tpm_max / 60 * elapsed) AS tok_now,
        least(%(cost)s::float8, tpm_max) AS cost
    FROM state),
verdict AS (
    SELECT level.*,
        (paused_until IS NULL OR paused_until <= t)
        AND (conc_max IS NULL OR (SELECT count(*) FROM jsonb_object_keys(live)) < conc_max)
        AND (rpm_max IS NULL OR req_now >= 1)
        AND (tpm_max IS NULL OR tok_now >= cost) AS ok
    FROM level),
taken AS (
    UPDATE model_limit l SET
        refilled_at = v.t,
        requests = coalesce(v.req_now - CASE WHEN v.ok THEN 1 ELSE 0 END, 0),
        tokens = coalesce(v.tok_now - CASE WHEN v.ok THEN v.cost ELSE 0 END, 0),
        in_flight = CASE WHEN v.ok THEN v.live || jsonb_build_object(%(id)s::text,
                         extract(epoch FROM v.t) + %(slot)s) ELSE v.live END
    FROM verdict v WHERE l.key = v.key
    RETURNING l.in_flight)
SELECT v.ok, coalesce(v.cost, 0) AS cost,
    (SELECT count(*) FROM jsonb_object_keys((SELECT in_flight FROM taken))) AS in_flight,
    v.conc_max, v.rpm_max, v.tpm_max, v.req_now, v.tok_now,
    greatest(
        coalesce(extract(epoch FROM v.paused_until - v.t), 0),
        CASE WHEN v.rpm_max IS NULL OR v.req_now >= 1 THEN 0 ELSE (1 - v.req_now) / (v.rpm_max / 60) END,
        CASE WHEN v.tpm_max IS NULL OR v.tok_now >= v.cost THEN 0 ELSE (v.cost - v.tok_now) / (v.tpm_max / 60) END
    )::float8 AS wait,
    v.conc_max IS NOT NULL AND (SELECT count(*) FROM jsonb_object_keys(v.live)) >= v.conc_max AS full
FROM verdict v"""

RELEASE = """UPDATE model_limit SET in_flight = in_flight - %(id)s::text,
                 tokens = tokens + %(refund)s
             WHERE key = %(key)s"""

TIGHTEN = """UPDATE model_limit SET
                 factor = greatest(0.1, CASE WHEN tight_until > now() THEN factor ELSE 1 END * 0.5),
                 tight_until = now() + make_interval(secs => %(tight)s),
                 paused_until = greatest(paused_until, now() + make_interval(secs => %(pause)s)),
                 requests = 0, tokens = 0, refilled_at = now()
             WHERE key = %(key)s"""


class LimitCounters:
    """The statements on `model_limit`, over a pool."""

    def __init__(self, pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]) -> None:
        self.pool = pool

    async def _execute(self, query: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query.encode(), params)
            return await cur.fetchone() if cur.description else None

    async def ensure(self, key: str, requests: float, tokens: float) -> None:
        """The limit's row, made with full buckets if it is not there yet."""
        await self._execute(
            """INSERT INTO model_limit (key, requests, tokens) VALUES (%(key)s, %(rpm)s, %(tpm)s)
               ON CONFLICT (key) DO NOTHING""",
            {"key": key, "rpm": requests, "tpm": tokens},
        )

    async def reserve(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """RESERVE with its parameters (key, id, conc, rpm, tpm, cost, slot); None if the row is gone."""
        return await self._execute(RESERVE, params)

    async def release(self, key: str, grant: str, refund: float) -> None:
        await self._execute(RELEASE, {"key": key, "id": grant, "refund": refund})

    async def tighten(self, key: str, tight_seconds: float, pause_seconds: float) -> None:
        await self._execute(TIGHTEN, {"key": key, "tight": tight_seconds, "pause": pause_seconds})
