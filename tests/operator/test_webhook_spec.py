"""AgentRun.spec.webhook (and Agent.spec.webhook): the CRD's schema refuses what is not a webhook, the operator maps it onto the run
(under the URL policy the REST API applies), and it stays as created."""

from __future__ import annotations

import pytest

from agentrun.worker.store import RunStore
from tests.support.cluster import NAMESPACE, PATH, Cluster, assert_invalid, run_row, uid_of
from tests.support.waiting import eventually

HOOK = {"url": "https://hooks.example.com/agentrun", "events": ["finished", "waiting"], "secretRef": "hooks"}


def _body(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"input": "go", **spec}}


@pytest.mark.usefixtures("operator")
async def test_spec_webhook_reaches_the_run(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("hooked", input="go", webhook=HOOK)
    run = await run_row(store, obj)
    assert run.webhook == HOOK


@pytest.mark.usefixtures("operator")
async def test_a_webhook_to_the_metadata_address_fails_the_agentrun_without_a_run(
    cluster: Cluster, store: RunStore
) -> None:
    obj = await cluster.create("meta", input="go", webhook={**HOOK, "url": "http://169.254.169.254/latest/"})
    status = await cluster.wait_status("meta", "Failed", lambda s: s.get("phase") == "Failed")
    assert "spec.webhook.url" in status["message"] and "169.254" in status["message"]
    assert await store.get(uid_of(obj)) is None


@pytest.mark.parametrize(("webhook", "words"), [
    ({**HOOK, "url": "ftp://example.com/x"}, "spec.webhook.url"),
    ({**HOOK, "events": ["done"]}, "spec.webhook.events"),
    ({"url": HOOK["url"]}, "spec.webhook.secretRef"),
])
async def test_the_crd_refuses_what_is_no_webhook(cluster: Cluster, webhook: dict[str, object], words: str) -> None:
    assert_invalid(await cluster.http.post(PATH, json=_body("bad", webhook=webhook)), words)


async def test_spec_webhook_is_immutable(cluster: Cluster) -> None:
    r = await cluster.http.post(PATH, json=_body("fixed", webhook=HOOK))
    assert r.status_code == 201, r.text
    r = await cluster.http.patch(f"{PATH}/fixed", json={"spec": {"webhook": {**HOOK, "url": "https://x.example/"}}},
                                 headers={"Content-Type": "application/merge-patch+json"})
    assert_invalid(r, "webhook is immutable")


@pytest.mark.usefixtures("operator")
async def test_an_agents_spec_webhook_is_its_runs(cluster: Cluster, store: RunStore) -> None:
    await cluster.create_agent("notifier", webhook=HOOK, tokenBudget=1000)

    async def stored() -> bool:
        agent = await store.agent("notifier")
        return agent is not None and agent.webhook == HOOK

    await eventually(stored, 60, "the agent stored with its webhook")
    obj = await cluster.create("of-agent", agentRef={"name": "notifier"}, input="x")
    assert (await run_row(store, obj)).webhook == HOOK
