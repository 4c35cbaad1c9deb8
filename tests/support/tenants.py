"""Identities of several tenants for the tenants tests: alice and bob are admins of team-a and team-b, root a
platform operator's admin (tenant `*`), carol a reader of team-a."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL
from tests.support.serving import asgi_client

IDENTITIES = {"alice": ("team-a", ["admin"]), "bob": ("team-b", ["admin"]), "root": ("*", ["admin"]),
              "carol": ("team-a", ["read"])}


def token_of(name: str) -> str:
    return f"agrt_{name}-tenant-token-0123456789"


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_of(name)}"}


def write_identities(path: Path, identities: dict[str, tuple[str, list[str]]] = IDENTITIES) -> Path:
    path.write_text(json.dumps({"identities": [
        {"name": n, "sha256": hashlib.sha256(token_of(n).encode()).hexdigest(), "scopes": s, "tenant": t}
        for n, (t, s) in identities.items()]}))
    return path


@pytest.fixture
async def http(store: RunStore, toolbox: ToolBox, metrics: Metrics, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client of an app that admits the identities above."""
    settings = WorkerSettings(database_url="unused", default_model=MODEL,
                              api_tokens_file=str(write_identities(tmp_path / "tokens.json")))
    async with asgi_client(create_app(store, toolbox, settings, metrics)) as client:
        yield client
