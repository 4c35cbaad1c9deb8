"""Every phase an AgentRun's run goes through is announced by an Event, however fast it goes."""

from __future__ import annotations

from typing import Any

import attrs
import httpx
import kmock
from kmock._internal import enums, rendering

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.operator.emulator import ApiServer
from tests.support.builders import worker
from tests.support.cluster import Cluster, assert_events_precede_their_phase, operator_running, settings_for, uid_of
from tests.support.waiting import eventually


async def test_a_run_that_finished_unseen_announces_each_phase(
    cluster: Cluster, store: RunStore, database_url: str
) -> None:
    """The operator last saw it Queued; it ran and succeeded while no operator was looking."""
    async with operator_running(cluster, settings_for(database_url)):
        obj = await cluster.create("quick", input="go")
        await cluster.wait_status("quick", "Queued", lambda s: s.get("phase") == "Queued")

    async def has_row() -> bool:
        return await store.get(uid_of(obj)) is not None

    await eventually(has_row, 60, "the run row")
    await worker(store, ScriptedLlm().then_text("done")).run_once()

    async with operator_running(cluster, settings_for(database_url)):
        status = await cluster.wait_status("quick", "Succeeded", lambda s: s.get("phase") == "Succeeded")
        assert status["lockedBy"] == "worker-A"
        events = cluster.events("quick")
        assert [e["reason"] for e in events] == ["Queued", "Running", "Succeeded"]
        assert events[1]["message"] == "running on worker-A"
        assert_events_precede_their_phase(cluster, "quick")


@attrs.define(kw_only=True)
class UnavailableForEvents(ApiServer):
    """Answers 503 to the first `failures` Event posts, as an overloaded API server may."""

    failures: int = 2

    async def _handle(self, request: rendering.Request) -> Any:
        if (request.resource is not None and request.resource.plural == "events"
                and request.action == enums.action.CREATE and self.failures > 0):
            self.failures -= 1
            raise kmock.KubernetesError(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        return await super()._handle(request)


async def test_an_event_the_api_server_could_not_take_is_posted_again(database_url: str) -> None:
    async with UnavailableForEvents() as server, kmock.Server(server) as srv:
        url = str(srv.url).rstrip("/")
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            cluster = Cluster(server, url, http)
            async with operator_running(cluster, settings_for(database_url)):
                await cluster.create("retried", input="go")
                await cluster.wait_status("retried", "Queued", lambda s: s.get("phase") == "Queued", timeout=30)
                assert server.failures == 0
                assert [e["reason"] for e in cluster.events("retried")] == ["Queued"]
                assert_events_precede_their_phase(cluster, "retried")
