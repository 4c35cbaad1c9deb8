"""The run_notify trigger: runs linked to an AgentRun notify on every change, other runs never."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

from agentrun.operator.notify import CHANNEL, listen
from agentrun.worker.store import RunStore
from tests.helpers import eventually, new_run


async def _notes(conn: psycopg.AsyncConnection[Any], timeout: float = 0.3) -> list[str]:
    """Everything delivered within `timeout`: a NOTIFY reaches a listener only after commit."""
    got: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            async for note in conn.notifies():
                got.append(note.payload)
    except TimeoutError:
        pass
    return got


async def test_only_linked_runs_notify(database_url: str, store: RunStore) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        plain, _ = await store.create(new_run("api run"))
        linked, _ = await store.create(new_run("k8s run", id=uuid.uuid4(), k8s_namespace="ns", k8s_name="a"))
        await store.cancel(plain.id)
        await store.cancel(linked.id)
        notes = await _notes(conn)
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
