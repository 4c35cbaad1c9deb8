"""GET /api/workers: real `agentrun worker` processes list themselves, one killed with SIGKILL drops out once
its last heartbeat is older than its lease, one stopped cleanly at once; the runs each holds, its MCP
servers; API-only processes are not listed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml

from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import AgentResponder, FakeAnthropic
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
ARGS = ("--concurrency", "3", "--lease-seconds", "3", "--poll-interval", "0.2", "--no-migrate")


async def _ids(client: httpx.AsyncClient) -> list[str]:
    r = await client.get("/api/workers")
    assert r.status_code == 200, r.text
    return [w["id"] for w in r.json()["items"]]


async def test_two_workers_listed_and_a_killed_one_drops_out(
    client: httpx.AsyncClient, database_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "mcp.yaml"  # an MCP server no one answers at: configured all the same
    config.write_text(yaml.safe_dump({"servers": [{"name": "shop", "url": f"http://127.0.0.1:{free_port()}/mcp"}]}))
    async with FakeAnthropic(AgentResponder()) as api:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update({"AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": api.base_url,
                    "ANTHROPIC_API_KEY": "test", "PYTHONPATH": str(REPO)})
        ports = [free_port(), free_port()]
        kept = await start_worker(ports[0], "--id", "presence-kept", *ARGS, env=env)
        killed = await start_worker(ports[1], "--id", "presence-killed", *ARGS,
                                    env={**env, "AGENTRUN_MCP_SERVERS": str(config)})
        try:
            for port, proc in zip(ports, (kept, killed), strict=True):
                await wait_ready(f"http://127.0.0.1:{port}", proc)

            async def both() -> bool:
                return await _ids(client) == ["presence-kept", "presence-killed"]  # by id

            await eventually(both, 60, "both workers listed")
            items = {w["id"]: w for w in (await client.get("/api/workers")).json()["items"]}
            assert set(items["presence-kept"]) == {"id", "version", "concurrency", "runsHeld", "lastSeen",
                                                   "mcpServers"}
            assert items["presence-kept"]["concurrency"] == 3 and items["presence-kept"]["mcpServers"] == []
            assert items["presence-killed"]["mcpServers"] == ["shop"]
            assert items["presence-kept"]["version"] and items["presence-kept"]["runsHeld"] == 0
            # Each worker serves the list too.
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[0]}", timeout=10) as http:
                assert len((await http.get("/api/workers")).json()["items"]) == 2

            killed.send_signal(signal.SIGKILL)
            await killed.wait()

            async def only_kept() -> bool:
                return await _ids(client) == ["presence-kept"]

            await eventually(only_kept, 60, "the killed worker to drop out of the list")
            assert await stop(kept) == 0
            assert await _ids(client) == []  # a clean stop leaves at once
        finally:
            for proc in (kept, killed):
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


async def test_runs_held_and_api_only_processes(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await store.announce("w-busy", "1.2.3", 4, 30, ["shop", "search"])
    await store.announce("w-api", "1.2.3", 0, 30, [])  # serves the API only: not a worker at work
    for i in range(2):
        await store.create(new_run(f"run {i}"))
    assert await store.claim("w-busy", 30) is not None and await store.claim("w-busy", 30) is not None
    await store.create(new_run("queued"))
    [busy] = (await client.get("/api/workers")).json()["items"]
    assert (busy["id"], busy["version"], busy["concurrency"], busy["runsHeld"], busy["mcpServers"]) == (
        "w-busy", "1.2.3", 4, 2, ["shop", "search"])
    # Its last heartbeat older than its lease: gone from the list, though its row is still there.
    await db.execute("UPDATE worker SET last_seen = now() - interval '31 seconds' WHERE id = 'w-busy'")
    assert await _ids(client) == []
    await store.announce("w-busy", "1.2.4", 4, 30, ["shop"])  # a heartbeat brings it back, as it is now
    [busy] = (await client.get("/api/workers")).json()["items"]
    assert (busy["version"], busy["mcpServers"]) == ("1.2.4", ["shop"])
    await store.retire("w-busy")
    assert await _ids(client) == []
