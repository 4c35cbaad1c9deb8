"""The demo's tool: `list_tickets`, a lookup in the "acme" ticket system, kept in a table.

It honours its idempotency key the way a real side-effecting tool must: the effect (here, an audit
record of the query) is written with INSERT … ON CONFLICT DO NOTHING, so executing the same tool call
twice after a crash leaves one record. Load it with AGENTRUN_TOOLS=agentrun.worker.demo.tickets.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

from agentrun.worker.tools import ToolContext, tool

SCHEMA = """
CREATE TABLE IF NOT EXISTS acme_ticket (
    id     TEXT PRIMARY KEY,
    title  TEXT NOT NULL,
    status TEXT NOT NULL,
    due    DATE NOT NULL
);
CREATE TABLE IF NOT EXISTS acme_ticket_query (
    idempotency_key TEXT PRIMARY KEY,
    run_id          UUID NOT NULL,
    status          TEXT NOT NULL,
    queried_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO acme_ticket (id, title, status, due) VALUES
    ('ACME-101', 'Invoice PDF renders blank', 'open', current_date - 9),
    ('ACME-102', 'SSO login loops on Safari', 'open', current_date - 3),
    ('ACME-103', 'Export to CSV drops accents', 'open', current_date + 4),
    ('ACME-104', 'Webhook retries never stop', 'closed', current_date - 20),
    ('ACME-105', 'Dashboard slow for large teams', 'open', current_date - 1)
ON CONFLICT DO NOTHING;
"""

# How long a lookup takes: long enough for the demo to kill the worker in the middle of it.
DELAY_ENV = "AGENTRUN_DEMO_TOOL_DELAY"


async def create_schema(conninfo: str) -> None:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(SCHEMA)


async def queries_recorded(conninfo: str, run_id: str) -> int:
    """How many effects the tool recorded for a run: one per tool_use id, however often it ran."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM acme_ticket_query WHERE run_id = %s", (run_id,))
        row = await cur.fetchone()
    return int(row[0]) if row else 0


@tool(
    name="list_tickets",
    description="List acme support tickets. status 'overdue' lists open tickets past their due date.",
    input_schema={
        "type": "object",
        "properties": {"status": {"type": "string", "enum": ["open", "closed", "overdue"]}},
        "required": ["status"],
    },
    idempotent=True,
    timeout_seconds=30,
)
async def list_tickets(args: dict[str, Any], ctx: ToolContext) -> str:
    status = args["status"]
    await asyncio.sleep(float(os.environ.get(DELAY_ENV, "0")))
    async with await psycopg.AsyncConnection.connect(os.environ["AGENTRUN_DATABASE_URL"], autocommit=True) as conn:
        await conn.execute(
            """INSERT INTO acme_ticket_query (idempotency_key, run_id, status) VALUES (%s, %s, %s)
               ON CONFLICT (idempotency_key) DO NOTHING""",
            (ctx.idempotency_key, ctx.run_id, status),
        )
        if status == "overdue":
            cur = await conn.execute(
                "SELECT id, title, due FROM acme_ticket WHERE status = 'open' AND due < current_date ORDER BY due"
            )
        else:
            cur = await conn.execute("SELECT id, title, due FROM acme_ticket WHERE status = %s ORDER BY due", (status,))
        rows = await cur.fetchall()
    if not rows:
        return f"no {status} tickets"
    return "\n".join(f"{id} (due {due.isoformat()}): {title}" for id, title, due in rows)
