"""The worker's HTTP API over a real database, as the API tests build it: their tools, the app, and the
fixtures that give them (imported by each conftest that uses them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox, ToolContext, tool
from tests.support.builders import MODEL
from tests.support.serving import asgi_client, serving
from tests.support.waiting import eventually


@tool(name="noop", description="Does nothing.")
def noop(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


@tool(name="lookup", description="Looks a thing up.", input_schema={"type": "object", "properties": {"q": {"type": "string"}}})
async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"found {args.get('q')}"


@tool(name="broken", description="Always fails.")
def broken(args: dict[str, Any], ctx: ToolContext) -> str:
    raise RuntimeError("broken on purpose")


def make_app(store: RunStore, toolbox: ToolBox, settings: WorkerSettings, metrics: Metrics) -> FastAPI:
    return create_app(store, toolbox, settings, metrics)


async def submit(client: httpx.AsyncClient, **fields: Any) -> str:
    """POST /api/runs with a budget and timeout no test runs out of; the new run's id."""
    body = {"input": "pay the invoice", "tokenBudget": 100_000, "timeoutSeconds": 300, **fields}
    r = await client.post("/api/runs", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def status_is(client: httpx.AsyncClient, run_id: str, *statuses: str, timeout: float = 30) -> dict[str, Any]:
    """The run as GET /api/runs/{id} answers once its status is one of `statuses`."""
    found: dict[str, Any] = {}

    async def check() -> bool:
        found.update((await client.get(f"/api/runs/{run_id}")).json())
        return found.get("status") in statuses

    await eventually(check, timeout, f"run {run_id} to be {'/'.join(statuses)}")
    return found


@pytest.fixture
def toolbox() -> ToolBox:
    return ToolBox([noop, lookup, broken])


@pytest.fixture
def settings() -> WorkerSettings:
    return WorkerSettings(database_url="unused", worker_id="api-test", default_model=MODEL)


@pytest.fixture
def metrics(store: RunStore) -> Metrics:
    return Metrics(count_runs=store.count_by_status, cache_seconds=0)


@pytest.fixture
def app(store: RunStore, toolbox: ToolBox, settings: WorkerSettings, metrics: Metrics) -> FastAPI:
    return make_app(store, toolbox, settings, metrics)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app) as c:
        yield c


@pytest.fixture
async def server_url(app: FastAPI) -> AsyncIterator[str]:
    async with serving(app) as url:
        yield url
