"""kill -9 of a worker process between the status change and the answer to its webhook: the delivery was
written with the status change, and another worker sends it again after the claim's lease; none is lost and
none invented (worker processes, the fake Messages API, a real receiver, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import psycopg
from aiohttp import web

from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic, Json, Reply
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.running import finished
from tests.support.waiting import eventually
from tests.webhooks.receiver import SECRET, SECRETS_FILE, Received, Receiver, verify

ROOT = Path(__file__).resolve().parents[2]


async def _worker(database_url: str, model_url: str, name: str, secrets: Path) -> asyncio.subprocess.Process:
    port = free_port()
    env = {**os.environ, "AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": model_url,
           "ANTHROPIC_API_KEY": "test-key", "PYTHONPATH": str(ROOT), "AGENTRUN_LOG_LEVEL": "WARNING",
           "AGENTRUN_WEBHOOK_SECRETS": str(secrets), "AGENTRUN_WEBHOOK_ALLOW": "127.0.0.1",
           "AGENTRUN_WEBHOOK_TIMEOUT_SECONDS": "1", "AGENTRUN_WEBHOOK_BACKOFF": "0.2",
           "AGENTRUN_WEBHOOK_POLL_SECONDS": "0.2"}
    proc = await start_worker(port, "--id", name, "--concurrency", "1", "--poll-interval", "0.1", "--no-migrate",
                              "--lease-seconds", "3", env=env, stdout=asyncio.subprocess.DEVNULL,
                              stderr=asyncio.subprocess.DEVNULL)
    await wait_ready(f"http://127.0.0.1:{port}", proc, timeout=60, what=f"{name} to be ready")
    return proc


async def test_kill_9_while_a_webhook_is_in_flight_loses_and_invents_no_delivery(
    store: RunStore, database_url: str, db: psycopg.AsyncConnection[Any], tmp_path: Path
) -> None:
    secrets = tmp_path / "secrets.json"
    secrets.write_text(SECRETS_FILE)

    async def answer(got: Received) -> web.StreamResponse:
        if len(receiver.received) == 1:  # the first attempt is held: its worker is killed meanwhile
            await asyncio.sleep(3600)
        return web.Response(status=204)

    def reply(body: Json) -> Reply:
        return Reply.text("paid")

    async with Receiver(free_port(), answer) as receiver, FakeAnthropic(reply) as model:
        hook = {"url": receiver.url, "events": ["finished"], "secretRef": "hooks"}
        run, _ = await store.create(new_run("pay", webhook=hook))
        a = await _worker(database_url, model.base_url, "worker-A", secrets)
        try:
            async def sent() -> bool:
                return len(receiver.received) >= 1
            await eventually(sent, 60, "worker-A to send the webhook")
            a.kill()  # SIGKILL: the run's status change is committed, the webhook's answer never came
            await a.wait()
        finally:
            if a.returncode is None:
                a.kill()
                await a.wait()
        assert (await store.get(run.id)).status is RunStatus.SUCCEEDED  # type: ignore[union-attr]
        b = await _worker(database_url, model.base_url, "worker-B", secrets)
        try:
            async def delivered() -> bool:
                return [d.state for d in await store.webhooks_of(run.id)] == ["DELIVERED"]
            await eventually(delivered, 60, "worker-B to deliver it after the lease")
        finally:
            await stop(b)
        after = await finished(store, run.id, timeout=5)
    [delivery] = await store.webhooks_of(run.id)
    assert {g.id for g in receiver.received} == {f"msg_{delivery.id.hex}"}  # one delivery, sent again
    assert len(receiver.received) == 2
    assert all(verify(SECRET, g.headers, g.body) for g in receiver.received)
    assert receiver.received[1].json["output"] == "paid" and after.output == "paid"
    assert [a.worker for a in delivery.history] == ["worker-B"]  # worker-A's attempt never ended
    assert delivery.attempts == 2
    count = await (await db.execute("SELECT count(*) FROM run_webhook")).fetchone()
    assert count == (1,)
