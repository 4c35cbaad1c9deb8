"""The chaos run's tool: records every execution in its own table (the tool's side effect), then
optionally sleeps. Loaded by the workers through AGENTRUN_TOOLS=bench.chaos_tools.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import psycopg

from agentrun.worker.tools import ToolContext, tool

EXEC_TABLE = """CREATE TABLE IF NOT EXISTS chaos_tool_exec (
    execution_id    UUID PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    run_tag         TEXT NOT NULL,
    pid             INT NOT NULL,
    executed_at     TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"""


async def _record(key: str, tag: str) -> None:
    """Write the execution, riding out a database restart: an effect the tool had must not go unrecorded.

    An INSERT can commit and still fail on the client (the server went down before it answered), so the
    retry is made idempotent with an id of its own per execution: one execution, one row, however many
    tries it took to record it.
    """
    execution_id = uuid.uuid4()
    delay = 0.1
    for _ in range(60):
        try:
            async with await psycopg.AsyncConnection.connect(os.environ["AGENTRUN_DATABASE_URL"], autocommit=True) as c:
                await c.execute(
                    "INSERT INTO chaos_tool_exec (execution_id, idempotency_key, run_tag, pid) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT (execution_id) DO NOTHING",
                    (execution_id, key, tag, os.getpid()),
                )
                return
        except psycopg.OperationalError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise RuntimeError("chaos_step: the database stayed unreachable")


@tool(
    name="chaos_step",
    description="One step of a chaos run: records that it ran, sleeps if asked.",
    input_schema={
        "type": "object",
        "properties": {"run": {"type": "string"}, "turn": {"type": "integer"}, "part": {"type": "integer"},
                       "sleep": {"type": "number", "minimum": 0, "maximum": 30}},
        "required": ["run", "turn", "part"],
    },
    timeout_seconds=60,
)
async def chaos_step(args: dict[str, Any], ctx: ToolContext) -> str:
    await _record(ctx.idempotency_key, args["run"])
    if args.get("sleep"):
        await asyncio.sleep(args["sleep"])
    return f"step {args['turn']}.{args['part']} of run {args['run']} done"
