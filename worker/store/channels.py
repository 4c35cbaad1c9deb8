"""The names processes meet under in PostgreSQL: notification channels and advisory-lock keys.

Defined once, here. The code uses these constants and the migrations' triggers and functions use them
too: a migration names one as `{{WAKE_CHANNEL}}`, and `migrate.py` writes the value in before it runs the
file (`render`), so a channel cannot be renamed on one side only. A test checks that every name a
migration uses is one of these, and every channel here is listened to by someone.

Two advisory-lock forms are in use and never collide: the two-int form (`pg_advisory_lock(class, key)`,
objsubid 2) for the liveness locks, the one-bigint form (objsubid 1) for everything else.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

WAKE_CHANNEL = "agentrun_wake"
"""A run became claimable (queued, handed back, its lease lapsed): idle workers look again (0002)."""
CANCEL_CHANNEL = "agentrun_cancel"
"""Payload: a run id whose cancel was requested; the worker driving it stops it (0005)."""
RUN_CHANNEL = "agentrun_run"
"""Payload: a run id that changed; the operator copies its progress to the AgentRun's status (0003)."""
EVENTS_CHANNEL = "agentrun_events"
"""Payload: a run id whose run, step or decision rows changed; the events API reads them (0010)."""
DELTA_CHANNEL = "agentrun_delta"
"""Streamed model text of a call in flight, from workers to the events API (not stored)."""
WEBHOOK_CHANNEL = "agentrun_webhook"
"""A webhook delivery was written to the outbox: the workers' senders look (0019)."""

LIVENESS_LOCK_CLASS = 0x61675274  # "agRt"
"""Class of the liveness locks, `pg_advisory_lock(LIVENESS_LOCK_CLASS, hashtext(worker id))`: held by a
live worker's presence connection (runtime/presence.py), tried by claims of its runs (runs.py)."""
SIGNAL_KEY_LOCK_CLASS = 0x61675773  # "agWs"
"""`pg_advisory_xact_lock(SIGNAL_KEY_LOCK_CLASS, hashtext(key))`: an event posted on a key and a run parking
on it take turns (store/waits.py), so the one that goes second always sees the other."""
SIGNAL_IDEMPOTENCY_LOCK_CLASS = 0x61675769  # "agWi"
"""The same for two copies of one POST /api/events (its Idempotency-Key)."""
QUOTA_LOCK_CLASS = 0x61675471  # "agTq"
"""`pg_advisory_xact_lock(QUOTA_LOCK_CLASS, hashtext(tenant))`: the submits of a tenant with a `max_queued`
take turns counting its queued runs and inserting theirs (store/tenants.py), so none overshoots it."""
REPLAY_SCORE_LOCK_CLASS = 0x61675273  # "agRs"
"""`pg_advisory_xact_lock(REPLAY_SCORE_LOCK_CLASS, hashtext(replay id))`: the readers of a replay take turns
scoring its finished runs (store/replays.py), so a scorer (an LLM judge, say) judges each pair once."""
MIGRATION_LOCK_KEY = 0x61676E7452756E  # "agntRun"
"""Serialises processes migrating at once (migrate.py)."""
PRUNE_LOCK_KEY = 0x61675270  # "agRp"
"""Lets one process of the fleet prune at a time (retention.py)."""
EVENT_LOCK_GATE = 0x6576 << 48  # "ev" in the top 16 bits
"""The event positions' locks (0013): the gate is this key, a position p is held as `EVENT_LOCK_GATE + p`."""
EVENT_LOCK_PREFIX = EVENT_LOCK_GATE >> 48
"""The top 16 bits every event position lock has, as `pg_locks.classid >> 16` shows them."""

CHANNELS = {
    "WAKE_CHANNEL": WAKE_CHANNEL, "CANCEL_CHANNEL": CANCEL_CHANNEL, "RUN_CHANNEL": RUN_CHANNEL,
    "EVENTS_CHANNEL": EVENTS_CHANNEL, "DELTA_CHANNEL": DELTA_CHANNEL,
    "WEBHOOK_CHANNEL": WEBHOOK_CHANNEL,
}
NAMES: dict[str, str | int] = {
    **CHANNELS,
    "LIVENESS_LOCK_CLASS": LIVENESS_LOCK_CLASS, "MIGRATION_LOCK_KEY": MIGRATION_LOCK_KEY,
    "PRUNE_LOCK_KEY": PRUNE_LOCK_KEY, "EVENT_LOCK_GATE": EVENT_LOCK_GATE, "EVENT_LOCK_PREFIX": EVENT_LOCK_PREFIX,
}
"""What a migration may name as `{{NAME}}`."""

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def render(sql: str) -> str:
    """A migration's text with each `{{NAME}}` replaced by its value; an unknown name is an error."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in NAMES:
            raise KeyError(f"a migration names {{{{{name}}}}}, which agentrun.worker.store.channels does not define")
        return str(NAMES[name])

    return _PLACEHOLDER.sub(value, sql)


async def listen(conn: psycopg.AsyncConnection[Any], *channels: str) -> None:
    """LISTEN on each channel (names from this module only: they are written into the statement)."""
    for channel in channels:
        if channel not in CHANNELS.values():
            raise ValueError(f"not an agentrun channel: {channel!r}")
        await conn.execute(f"LISTEN {channel}")


async def notify(conn: psycopg.AsyncConnection[Any], channel: str, payload: str) -> None:
    await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def ping(conn: psycopg.AsyncConnection[Any]) -> None:
    """A round trip that proves the connection still answers."""
    await conn.execute("SELECT 1")
