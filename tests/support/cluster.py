"""The emulated Kubernetes API server (kmock, tests/operator/emulator.py) as the operator tests speak to it,
and the real kopf operator running against it for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import kopf

from agentrun.operator.handlers import run
from agentrun.operator.kube import KubeApi
from agentrun.operator.settings import OperatorSettings
from agentrun.worker.core.records import Run
from agentrun.worker.store import RunStore
from tests.operator.emulator import ApiServer
from tests.support.waiting import eventually

NAMESPACE = "default"
PATH = f"/apis/agentrun.dev/v1alpha1/namespaces/{NAMESPACE}/agentruns"


def agents_path(namespace: str = NAMESPACE) -> str:
    return f"/apis/agentrun.dev/v1alpha1/namespaces/{namespace}/agents"


@dataclasses.dataclass
class Cluster:
    """The emulated API server, spoken to over HTTP the way kubectl would."""

    server: ApiServer
    url: str
    http: httpx.AsyncClient

    async def create(self, name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE, **({"labels": labels} if labels else {})}
        body = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": metadata, "spec": spec}
        r = await self.http.post(PATH, json=body)
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    async def get(self, name: str) -> dict[str, Any] | None:
        r = await self.http.get(f"{PATH}/{name}")
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def patch_spec(self, name: str, **spec: Any) -> None:
        r = await self.http.patch(f"{PATH}/{name}", json={"spec": spec},
                                  headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text

    async def delete(self, name: str) -> None:
        r = await self.http.delete(f"{PATH}/{name}")
        assert r.status_code == 200, r.text

    async def status_of(self, name: str) -> dict[str, Any]:
        obj = await self.get(name)
        return (obj or {}).get("status") or {}

    async def wait_status(self, name: str, what: str, check: Callable[[dict[str, Any]], bool],
                          timeout: float = 60.0) -> dict[str, Any]:
        """A generous bound: an operator starting on a loaded machine connects, sweeps and patches late."""
        last: dict[str, Any] = {}

        async def ok() -> bool:
            last.clear()
            last.update(await self.status_of(name))
            return check(last)

        try:
            await eventually(ok, timeout, f"{name}: {what}")
        except AssertionError as e:
            raise AssertionError(f"{e} (last status: {last})") from None
        return await self.status_of(name)

    # -- Agents --------------------------------------------------------------------------------------

    async def create_agent(self, name: str, namespace: str = NAMESPACE, **spec: Any) -> dict[str, Any]:
        body = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "Agent",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}
        r = await self.http.post(agents_path(namespace), json=body)
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    async def get_agent(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        r = await self.http.get(f"{agents_path(namespace)}/{name}")
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def patch_agent(self, name: str, spec: dict[str, Any], namespace: str = NAMESPACE) -> None:
        """Merge-patch the Agent's spec (a None value removes the field)."""
        r = await self.http.patch(f"{agents_path(namespace)}/{name}", json={"spec": spec},
                                  headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text

    async def delete_agent(self, name: str, namespace: str = NAMESPACE) -> None:
        r = await self.http.delete(f"{agents_path(namespace)}/{name}")
        assert r.status_code == 200, r.text

    async def wait_agent(self, name: str, what: str, check: Callable[[dict[str, Any]], bool],
                         namespace: str = NAMESPACE, timeout: float = 60.0) -> dict[str, Any]:
        """The Agent's status once `check` holds for it."""
        last: dict[str, Any] = {}

        async def ok() -> bool:
            last.clear()
            last.update(((await self.get_agent(name, namespace)) or {}).get("status") or {})
            return check(last)

        try:
            await eventually(ok, timeout, f"Agent {name}: {what}")
        except AssertionError as e:
            raise AssertionError(f"{e} (last status: {last})") from None
        return dict(last)

    def writes(self, name: str) -> list[tuple[int, dict[str, Any]]]:
        """Every version the API server wrote of AgentRun `name`, oldest first, with its resourceVersion."""
        return [(version, event["object"]) for resource, bus in list(self.server._buses.items())
                if resource.plural == "agentruns" for version, event in list(bus.history)
                if event["object"].get("metadata", {}).get("name") == name]

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for (resource, _, _), obj in list(self.server.objects.items()):
            if resource.plural == "events" and not obj.deleted:
                raw = obj.raw
                if raw.get("involvedObject", {}).get("name") == name:
                    found.append(raw)
        return found


def settings_for(database_url: str, **kw: Any) -> OperatorSettings:
    fields: dict[str, Any] = dict(
        database_url=database_url, namespaces=(), tool_names=frozenset({"lookup"}),
        debounce_seconds=0.05, retry_seconds=0.2, port=None,
    )
    fields.update(kw)
    return OperatorSettings(**fields)


@contextlib.asynccontextmanager
async def operator_running(
    cluster: Cluster, settings: OperatorSettings, wait_ready: bool = True
) -> AsyncIterator[None]:
    """The real operator: kopf, the handlers, the listener and the status sync, until the block ends.

    With `wait_ready` the block starts once it is ready (kopf watching, the database connected).

    It runs in a thread with its own event loop, as kopf's own test runner does: on exit kopf cancels
    every task its loop started after it, which would include the test's own.
    """

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=cluster.url, insecure=True)

    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(run(settings, kube=KubeApi.for_host(cluster.url), login=login, stop_flag=stop,
                            ready_flag=ready))
        except BaseException as e:  # reported to the test below
            failure.append(e)

    thread = threading.Thread(target=serve, name="operator", daemon=True)
    thread.start()
    try:
        async def started() -> bool:
            if failure:
                raise failure[0]
            return ready.is_set() or not wait_ready

        await eventually(started, 15, "the operator to start")
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
        assert not thread.is_alive(), "the operator did not stop"
        if failure:
            raise failure[0]


def assert_events_precede_their_phase(cluster: Cluster, name: str) -> None:
    """Whoever sees a phase in the status finds its Event: every AgentRun version showing a phase has a
    newer resourceVersion than that phase's Event."""
    posted = {e["reason"]: int(e["metadata"]["resourceVersion"]) for e in reversed(cluster.events(name))}
    for version, obj in cluster.writes(name):
        phase = (obj.get("status") or {}).get("phase")
        if phase is not None:
            assert phase in posted and posted[phase] < version, f"{name} showed {phase} before its Event"


def uid_of(obj: dict[str, Any]) -> uuid.UUID:
    return uuid.UUID(obj["metadata"]["uid"])


def agentrun_manifest() -> dict[str, Any]:
    """The smallest AgentRun the CRD admits, for a test to spoil one field of."""
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "x"},
            "spec": {"input": "hello"}}


async def post_manifest(cluster: Cluster, doc: dict[str, Any]) -> httpx.Response:
    """POST `doc` as it is, however bad: the API server's answer, not an assertion on it."""
    try:
        body = json.dumps(doc, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: sent as JSON's escape, as any client would
        body = json.dumps(doc).encode()
    return await cluster.http.post(PATH, content=body, headers={"Content-Type": "application/json"})


def assert_invalid(r: httpx.Response, *words: str) -> str:
    """The 422 Invalid a real API server gives, with a message naming the problem."""
    assert r.status_code == 422, r.text
    body = r.json()
    assert (body["kind"], body["reason"]) == ("Status", "Invalid"), body
    for word in words:
        assert word in body["message"], body["message"]
    return body["message"]  # type: ignore[no-any-return]


async def run_row(store: RunStore, obj: dict[str, Any]) -> Run:
    """The run the operator made of the AgentRun `obj`, once it exists."""
    uid = uid_of(obj)

    async def exists() -> bool:
        return await store.get(uid) is not None

    await eventually(exists, 60, "the run row")
    run = await store.get(uid)
    assert run is not None
    return run
