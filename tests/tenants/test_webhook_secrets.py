"""Webhook secrets are their tenant's when the secrets file says so: a secret with a `tenant` signs only that
tenant's runs' webhooks, one without any tenant's; a run may not name another tenant's secret."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.runtime.errors import SecretsFileError
from agentrun.worker.runtime.webhooks import WebhookSecrets, parse_secrets
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL
from tests.support.serving import asgi_client
from tests.support.tenants import auth, write_identities


def secret(seed: bytes) -> str:
    return "whsec_" + base64.b64encode(seed * 32).decode()


SECRETS = {"secrets": [{"name": "hooks", "secret": secret(b"a"), "tenant": "team-a"},
                       {"name": "hooks", "secret": secret(b"b"), "tenant": "team-b"},
                       {"name": "shared", "secret": secret(b"s")},
                       {"name": "b-only", "secret": secret(b"x"), "tenant": "team-b"}]}


def test_each_tenant_gets_its_own_secret_of_a_name_and_the_shared_ones(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps(SECRETS))
    secrets = WebhookSecrets(str(path))
    assert secrets.names("team-a") == ["hooks", "shared"]
    assert secrets.names("team-b") == ["b-only", "hooks", "shared"]
    assert secrets.names("team-c") == ["shared"]
    assert secrets.get("hooks", "team-a") == secret(b"a") and secrets.get("hooks", "team-b") == secret(b"b")
    assert secrets.get("hooks", "team-c") is None and secrets.get("b-only", "team-a") is None
    assert secrets.get("shared", "team-c") == secret(b"s")


@pytest.mark.parametrize("entries, problem", [
    ([{"name": "x", "secret": secret(b"a"), "tenant": "Team A"}], "not a tenant name"),
    ([{"name": "x", "secret": secret(b"a"), "tenant": "t"}, {"name": "x", "secret": secret(b"b"), "tenant": "t"}],
     "given twice for tenant 't'"),
    ([{"name": "x", "secret": secret(b"a"), "owner": "t"}], "may have `tenant`"),
])
def test_a_bad_tenant_entry_is_refused_naming_it(entries: list[dict[str, str]], problem: str) -> None:
    with pytest.raises(SecretsFileError, match=problem):
        parse_secrets(json.dumps({"secrets": entries}), "secrets.json")


@pytest.fixture
async def secured(store: RunStore, toolbox: ToolBox, metrics: Metrics, tmp_path: Path,
                  ) -> AsyncIterator[httpx.AsyncClient]:
    (tmp_path / "secrets.json").write_text(json.dumps(SECRETS))
    settings = WorkerSettings(database_url="unused", default_model=MODEL,
                              api_tokens_file=str(write_identities(tmp_path / "tokens.json")),
                              webhook_secrets_file=str(tmp_path / "secrets.json"))
    async with asgi_client(create_app(store, toolbox, settings, metrics)) as client:
        yield client


async def test_a_run_may_name_only_its_tenants_secrets(secured: httpx.AsyncClient) -> None:
    def run(ref: str) -> dict[str, object]:
        return {"input": "x", "tokenBudget": 1000, "timeoutSeconds": 60,
                "webhook": {"url": "https://hooks.example.com/x", "secretRef": ref}}

    assert (await secured.post("/api/runs", json=run("hooks"), headers=auth("alice"))).status_code == 201
    assert (await secured.post("/api/runs", json=run("shared"), headers=auth("alice"))).status_code == 201
    refused = await secured.post("/api/runs", json=run("b-only"), headers=auth("alice"))
    assert refused.status_code == 422 and refused.json()["fields"][0]["field"] == "webhook.secretRef"
    assert "b-only" not in refused.json()["error"].split("configured:")[-1]
    assert (await secured.post("/api/runs", json=run("b-only"), headers=auth("bob"))).status_code == 201
    agent = {"name": "hooked", "webhook": {"url": "https://hooks.example.com/x", "secretRef": "b-only"}}
    assert (await secured.post("/api/agents", json=agent, headers=auth("alice"))).status_code == 422
