"""The run_notify trigger: runs linked to an AgentRun notify on every change, other runs never."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

from agentrun.operator.notify import listen
from agentrun.worker.store import RunStore
from agentrun.worker.store.channels import RUN_CHANNEL as CHANNEL
from tests.support.builders import new_run
from tests.support.waiting import eventually


async def _notes_until(conn: psycopg.AsyncConnection[Any], last: str, count: int, timeout: float = 30) -> list[str]:
    """Every notification up to the `count`th carrying `last`. Notifications arrive in commit order, so one
    sent by an earlier commit would be here before that one: no time window to size for the machine."""
    got: list[str] = []
    async with asyncio.timeout(timeout):
        async for note in conn.notifies():
            got.append(note.payload)
            if got.count(last) == count:
                break
    return got


async def test_only_linked_runs_notify(database_url: str, store: RunStore) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        plain, _ = await store.create(new_run("api run"))
        linked, _ = await store.create(new_run("k8s run", id=uuid.uuid4(), k8s_namespace="ns", k8s_name="a"))
        await store.cancel(plain.id)
        await store.cancel(linked.id)  # the last commit: the plain run's, had they notified, came before it
        notes = await _notes_until(conn, str(linked.id), 2)
    assert notes == [str(linked.id), str(linked.id)]  # insert, then the cancel


async def test_listener_delivers_run_ids(database_url: str, store: RunStore) -> None:
    seen: list[uuid.UUID] = []
    connected = asyncio.Event()
    task = asyncio.create_task(listen(database_url, seen.append, connected.set))
    try:
        await asyncio.wait_for(connected.wait(), 10)
        run, _ = await store.create(new_run("k8s run", id=uuid.uuid4(), k8s_namespace="ns", k8s_name="b"))

        async def heard() -> bool:
            return run.id in seen

        await eventually(heard, 5, "the notification")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
