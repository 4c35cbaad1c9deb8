"""Fixtures and builders for the replay tests (issue 47): recorded runs written straight into the database."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg

from agentrun.worker.core.records import Run
from agentrun.worker.store import RunStore
from tests.support.builders import new_run


async def recorded(
    store: RunStore, db: psycopg.AsyncConnection[Any], calls: list[tuple[str, dict[str, Any], str]] = (),  # type: ignore[assignment]
    *, answer: str = "done", status: str = "SUCCEEDED", **kw: Any,
) -> Run:
    """A finished run as a worker would have recorded it: for each (tool, input, result) of `calls` a MODEL
    step asking for it and the TOOL step that answered, then a MODEL step with the final `answer`."""
    run, _ = await store.create(new_run(**kw))
    seq = 0
    for i, (tool, tool_input, result) in enumerate(calls):
        use = f"toolu_{i}"
        content = [{"type": "tool_use", "id": use, "name": tool, "input": tool_input}]
        await db.execute(
            """INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason, started_at, finished_at)
               VALUES (%s, %s, 'MODEL', 'DONE', '{}', %s, 'tool_use', now(), now())""",
            (run.id, seq + 1, json.dumps(content)))
        await db.execute(
            """INSERT INTO run_step (run_id, seq, kind, status, tool_name, tool_use_id, request, response,
                   started_at, finished_at)
               VALUES (%s, %s, 'TOOL', 'DONE', %s, %s, %s, %s, now(), now())""",
            (run.id, seq + 2, tool, use, json.dumps(tool_input), result))
        seq += 2
    await db.execute(
        """INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason, started_at, finished_at)
           VALUES (%s, %s, 'MODEL', 'DONE', '{}', %s, 'end_turn', now(), now())""",
        (run.id, seq + 1, json.dumps([{"type": "text", "text": answer}])))
    await db.execute(
        """UPDATE run SET status = %s, started_at = now(), finished_at = now(), output = to_jsonb(%s::text)
           WHERE id = %s""", (status, answer, run.id))
    found = await store.get(run.id)
    assert found is not None
    return found


def new_id() -> uuid.UUID:
    return uuid.uuid4()
