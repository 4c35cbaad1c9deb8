"""The chaos run's tool: records every execution, its start and its end, in its own table (the tool's
side effect), sleeping in between if asked. Loaded by the workers through AGENTRUN_TOOLS=bench.chaos_tools.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import psycopg

from agentrun.worker.tools import ToolContext, tool

EXEC_TABLE = """CREATE TABLE IF NOT EXISTS chaos_tool_exec (
    execution_id    UUID PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    run_tag         TEXT NOT NULL,
    pid             INT NOT NULL,
    executed_at     TIMESTAMPTZ NOT NULL,  -- when the execution started (this process's clock)
    ended_at        TIMESTAMPTZ            -- when it ended; NULL if its process died first
)"""


async def _write(query: str, params: tuple[object, ...]) -> None:
    """One idempotent write, riding out a database restart or a cut connection: an effect the tool had
    must not go unrecorded. A write can commit and still fail on the client (the server went down before
    it answered), which is why each is made idempotent by the execution's own id."""
    delay = 0.1
    for _ in range(60):
        try:
            async with await psycopg.AsyncConnection.connect(os.environ["AGENTRUN_DATABASE_URL"], autocommit=True) as c:
                await c.execute(query, params)
                return
        except psycopg.OperationalError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise RuntimeError("chaos_step: the database stayed unreachable")


async def _record(execution_id: uuid.UUID, key: str, tag: str, started: float) -> None:
    await _write(
        "INSERT INTO chaos_tool_exec (execution_id, idempotency_key, run_tag, pid, executed_at) "
        "VALUES (%s, %s, %s, %s, to_timestamp(%s)) ON CONFLICT (execution_id) DO NOTHING",
        (execution_id, key, tag, os.getpid(), started),
    )


async def _record_end(execution_id: uuid.UUID, key: str, tag: str, started: float, ended: float) -> None:
    # The whole row: the start's own write may not have landed (cancelled while the database was down),
    # or may land after this one (its ON CONFLICT then leaves the end alone).
    await _write(
        "INSERT INTO chaos_tool_exec (execution_id, idempotency_key, run_tag, pid, executed_at, ended_at) "
        "VALUES (%s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s)) "
        "ON CONFLICT (execution_id) DO UPDATE SET ended_at = EXCLUDED.ended_at",
        (execution_id, key, tag, os.getpid(), started, ended),
    )


_writing: set[asyncio.Task[None]] = set()


async def _unhindering(write: Any) -> None:
    """Await a write without letting it hold up a cancel of the tool. psycopg answers a cancel that
    lands mid-query by cancelling the query in the server and waiting for that, seconds while the
    database restarts: the tool would run on past its worker's give-up, which a tool must not do. The
    write goes on in the background."""
    task = asyncio.ensure_future(write)
    _writing.add(task)
    task.add_done_callback(_writing.discard)
    await asyncio.shield(task)


def _note_end_locally(execution_id: uuid.UUID, ended: float) -> None:
    """The end in a file as well (one write call, kept if the process is SIGKILLed next): the end's
    database write may still be waiting for the database when a kill lands, and an execution with
    no end counts as running until its process died."""
    folder = os.environ.get("AGENTRUN_CHAOS_ENDS")
    if folder:
        with open(os.path.join(folder, f"{os.getpid()}.ends"), "a") as f:
            f.write(f"{execution_id} {ended!r}\n")


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
    # Times from this process's clock, taken where the execution starts and ends, not when the write
    # lands: the benchmark compares executions of one key for overlap, and a write may be retried.
    execution_id, started = uuid.uuid4(), time.time()
    try:
        await _unhindering(_record(execution_id, ctx.idempotency_key, args["run"], started))
        if args.get("sleep"):
            await asyncio.sleep(args["sleep"])
    finally:
        # Also when the step is cancelled, even while its start was still being recorded (a cancel
        # then would leave an execution without an end, counted as running until its process died):
        # the end is recorded in a task of its own that a second cancellation cannot interrupt.
        ended = time.time()
        _note_end_locally(execution_id, ended)
        await asyncio.shield(asyncio.ensure_future(
            _record_end(execution_id, ctx.idempotency_key, args["run"], started, ended)
        ))
    return f"step {args['turn']}.{args['part']} of run {args['run']} done"
