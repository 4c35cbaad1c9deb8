"""GET /api/tools and submit validation with MCP tools, over the real app; and a worker process whose MCP
server cannot be reached at start: ready, serving its other tools, the server's state in GET /api/tools."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox, ToolContext, tool
from tests.mcp.server import HttpServer
from tests.support.api import make_app
from tests.support.builders import MODEL
from tests.support.mcp import REPO, sessions
from tests.support.ports import free_port
from tests.support.processes import worker_argv
from tests.support.serving import asgi_client
from tests.support.waiting import eventually


@tool(name="local_lookup", description="A Python tool.", idempotent=False)
async def local_lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


def app_for(store: RunStore, box: ToolBox) -> Any:
    return make_app(store, box, WorkerSettings(database_url="unused", default_model=MODEL), Metrics(cache_seconds=0))


async def test_get_tools_lists_python_and_mcp_tools_with_their_rules(store: RunStore, http_server: HttpServer) -> None:
    async with sessions({"name": "shop", "url": http_server.url, "tools": ["lookup", "charge", "status"],
                         "overrides": {"charge": {"requiresApproval": True}}},
                        {"name": "gone", "url": "http://127.0.0.1:9/mcp"}, wait=False) as mcp:
        shop = mcp.servers[0]

        async def listed() -> bool:
            return shop.listed and shop.available()

        await eventually(listed, 60, "the server to be listed")
        box = ToolBox([local_lookup], sources=mcp.servers)
        async with asgi_client(app_for(store, box)) as client:
            r = await client.get("/api/tools")
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["tools"] == [
                {"name": "local_lookup", "source": "python", "idempotent": False, "requiresApproval": False,
                 "available": True, "readOnly": False},
                {"name": "shop__charge", "source": "mcp:shop", "idempotent": False, "requiresApproval": True,
                 "available": True, "readOnly": False},
                {"name": "shop__lookup", "source": "mcp:shop", "idempotent": True, "requiresApproval": False,
                 "available": True, "readOnly": False},
                {"name": "shop__status", "source": "mcp:shop", "idempotent": True, "requiresApproval": False,
                 "available": True, "readOnly": True},
            ]
            servers = {s["name"]: s for s in body["servers"]}
            assert servers["shop"] == {"name": "shop", "transport": "http", "connected": True, "error": None}
            assert servers["gone"]["connected"] is False and servers["gone"]["error"]

            # Submit: a tool of a listed server must exist (and be allowed); one of a server not reached
            # yet is taken, since nobody can know yet; other names are refused as before.
            base = {"input": "x", "tokenBudget": 1000, "timeoutSeconds": 60}
            ok = await client.post("/api/runs", json={**base, "tools": ["shop__lookup", "gone__search", "local_lookup"],
                                                      "requireApproval": ["shop__status"]})
            assert ok.status_code == 201, ok.text
            for name in ("shop__fresh", "shop__die", "nobody__x", "shop_lookup"):  # die: not on the allow-list
                r = await client.post("/api/runs", json={**base, "tools": [name]})
                assert r.status_code == 422, (name, r.text)
                assert r.json()["fields"][0]["field"] == "tools[0]"
                assert f"unknown tool {name!r}" in r.json()["fields"][0]["problem"]
            # The OpenAPI document does not pin `tools` to an enum the MCP servers would outdate.
            doc = (await client.get("/openapi.json")).json()
            tools_field = doc["components"]["schemas"]["RunRequest"]["properties"]["tools"]
            assert "enum" not in json.dumps(tools_field)
            assert "/api/tools" in doc["paths"]


async def test_get_tools_needs_the_read_scope(store: RunStore, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"identities": [
        {"name": "ci", "sha256": hashlib.sha256(b"t" * 32).hexdigest(), "scopes": ["submit"]},
        {"name": "viewer", "sha256": hashlib.sha256(b"v" * 32).hexdigest(), "scopes": ["read"]}]}))
    settings = WorkerSettings(database_url="unused", default_model=MODEL, api_tokens_file=str(tokens))
    app = make_app(store, ToolBox([local_lookup]), settings, Metrics(cache_seconds=0))
    async with asgi_client(app) as client:
        assert (await client.get("/api/tools")).status_code == 401
        assert (await client.get("/api/tools", headers={"Authorization": f"Bearer {'t' * 32}"})).status_code == 403
        r = await client.get("/api/tools", headers={"Authorization": f"Bearer {'v' * 32}"})
        assert r.status_code == 200 and [t["name"] for t in r.json()["tools"]] == ["local_lookup"]
        assert r.json()["servers"] == []


async def test_a_worker_whose_server_is_unreachable_at_start_is_ready_and_lists_it(
    database_url: str, tmp_path: Path, http_server: HttpServer
) -> None:
    config = tmp_path / "mcp.yaml"
    config.write_text(yaml.safe_dump({"servers": [
        {"name": "gone", "url": f"http://127.0.0.1:{free_port()}/mcp"},
        {"name": "shop", "url": http_server.url, "headers": {"Authorization": "Bearer ${SHOP_TOKEN}"}},
    ]}))
    port = free_port()
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            worker_argv(port, "--concurrency", "0"),
            env={**os.environ, "AGENTRUN_DATABASE_URL": database_url, "AGENTRUN_MCP_SERVERS": str(config),
                 "SHOP_TOKEN": "s3cret", "AGENTRUN_DEFAULT_MODEL": MODEL},
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            seen: dict[str, Any] = {}

            async def listed() -> bool:
                assert proc.poll() is None, log.read_text()
                try:
                    ready = await client.get("/readyz")
                    tools = await client.get("/api/tools")
                except httpx.TransportError:
                    return False
                if ready.status_code != 200 or tools.status_code != 200:
                    return False
                seen.update(tools.json())
                return any(t["name"] == "shop__lookup" for t in seen["tools"])

            await eventually(listed, 90, "the worker to be ready with the reachable server's tools")
            servers = {s["name"]: s for s in seen["servers"]}
            assert servers["gone"]["connected"] is False and servers["gone"]["error"]
            assert servers["shop"]["connected"] is True
            assert not any(t["name"].startswith("gone__") for t in seen["tools"])
            assert any(h.get("authorization") == "Bearer s3cret" for h in http_server.headers_seen)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    assert "s3cret" not in log.read_text()
