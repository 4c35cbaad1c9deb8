"""Runs that call MCP tools, through a real worker, real PostgreSQL and real MCP servers: results, the
idempotency key in `_meta`, crashes inside calls, a server dying mid-call, and the list changing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.records import RunStatus, StepStatus
from agentrun.worker.core.replay import BLOCKS_MARK, Conversation
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import Tool, ToolBox, ToolContext, ToolResult, ToolSource
from agentrun.worker.tools.mcp import McpServer
from tests.mcp.server import PNG, HttpServer
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.support.mcp import sessions, stdio_server
from tests.support.waiting import eventually


async def expire_lease(db: psycopg.AsyncConnection[Any], run_id: uuid.UUID) -> None:
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run_id,))


def results_seen(llm: ScriptedLlm, turn: int) -> list[dict[str, Any]]:
    """The tool_result blocks of the model request `turn` (0-based)."""
    last = llm.seen[turn].messages[-1]
    assert last["role"] == "user" and isinstance(last["content"], list)
    return [b for b in last["content"] if b.get("type") == "tool_result"]


async def test_a_run_calls_an_idempotent_and_a_non_idempotent_tool_with_the_key_in_meta(
    store: RunStore, http_server: HttpServer
) -> None:
    async with sessions({"name": "shop", "url": http_server.url}) as mcp:
        box = ToolBox(sources=mcp.servers)
        assert box.get("shop__lookup").idempotent and not box.get("shop__charge").idempotent  # type: ignore[union-attr]
        run, _ = await store.create(new_run(tools=("shop__lookup", "shop__charge")))
        llm = (ScriptedLlm()
               .then_tool_uses([("toolu_look", "shop__lookup", {"q": "invoice 7"}),
                                ("toolu_pay", "shop__charge", {"usd": 12})])
               .then_text("paid"))
        await worker(store, llm, box).run_once()

    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED
    assert {r["tool_use_id"]: r["content"] for r in results_seen(llm, 1)} == {
        "toolu_look": "found invoice 7", "toolu_pay": "charged 12"}
    assert [d["name"] for d in llm.seen[0].tools] == ["shop__lookup", "shop__charge"]  # as the run lists them
    lookup, charge = http_server.recorder.of("lookup"), http_server.recorder.of("charge")
    assert [c["meta"] for c in lookup] == [{"agentrun.dev/idempotency-key": "toolu_look",
                                            "agentrun.dev/lease-epoch": 1, "agentrun.dev/run-id": str(run.id)}]
    assert [c["meta"] for c in charge] == [{"agentrun.dev/idempotency-key": "toolu_pay",
                                            "agentrun.dev/lease-epoch": 1, "agentrun.dev/run-id": str(run.id)}]
    assert charge[0]["args"] == {"usd": 12}


async def test_errors_structured_content_and_images_reach_the_model_and_replay_the_same(
    store: RunStore, http_server: HttpServer
) -> None:
    async with sessions({"name": "shop", "url": http_server.url}) as mcp:
        run, _ = await store.create(new_run())
        llm = (ScriptedLlm()
               .then_tool_uses([("t_fail", "shop__fail", {}), ("t_status", "shop__status", {}),
                                ("t_pic", "shop__picture", {})])
               .then_text("seen"))
        await worker(store, llm, ToolBox(sources=mcp.servers)).run_once()

    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED
    by_id = {r["tool_use_id"]: r for r in results_seen(llm, 1)}
    assert by_id["t_fail"]["is_error"] is True and "fail" in by_id["t_fail"]["content"]
    assert json.loads(by_id["t_status"]["content"]) == {"healthy": True, "queue": 3}
    assert "is_error" not in by_id["t_status"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": __import__("base64").b64encode(PNG).decode()}}
    assert by_id["t_pic"]["content"] == [{"type": "text", "text": "a red dot:"}, image]
    # The step log keeps the blocks, and a worker that replays it sends the model the same.
    steps = await store.steps(run.id)
    pic = next(s for s in steps if s.tool_use_id == "t_pic")
    assert pic.response is not None and pic.response.startswith(BLOCKS_MARK)
    replayed = Conversation.replay(after.input, steps)
    assert replayed.messages[2] == llm.seen[1].messages[2]


class CrashInside:
    """A source whose tools' first call dies (SimulatedCrash) once the MCP server has the call: the worker
    is killed inside the call, after the server began it and before any result came back."""

    def __init__(self, inner: McpServer, started: Any) -> None:
        self.inner, self.started = inner, started
        self.source = inner.source

    def tools(self) -> list[Tool]:
        return [self._crashing(t) for t in self.inner.tools()]

    def get(self, name: str) -> Tool | None:
        found = self.inner.get(name)
        return self._crashing(found) if found is not None else None

    def available(self) -> bool:
        return self.inner.available()

    def status(self) -> Any:
        return self.inner.status()

    def _crashing(self, t: Tool) -> Tool:
        async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult | str:
            task = asyncio.ensure_future(t.fn(args, ctx))  # type: ignore[arg-type]
            try:
                await eventually(self.started, 30, "the MCP server to have the call")
            finally:
                task.cancel()
            raise SimulatedCrash()

        return dataclasses.replace(t, fn=call)


@pytest.mark.parametrize("tool", ["hold", "hold_once"])
async def test_a_worker_killed_inside_a_call_reruns_an_idempotent_one_with_the_same_key_and_doubts_the_other(
    store: RunStore, db: psycopg.AsyncConnection[Any], http_server: HttpServer, tool: str
) -> None:
    recorder = http_server.recorder
    async with sessions({"name": "shop", "url": http_server.url}) as mcp:
        run, _ = await store.create(new_run())
        llm = ScriptedLlm().then_tool_use("toolu_1", f"shop__{tool}", {}).then_text("done")

        async def started() -> bool:
            return len(recorder.of(tool)) == 1

        crashing: ToolSource = CrashInside(mcp.servers[0], started)
        with pytest.raises(SimulatedCrash):
            await worker(store, llm, ToolBox(sources=[crashing]), "worker-A").run_once()
        await expire_lease(db, run.id)
        recorder.release.set()
        await worker(store, llm, ToolBox(sources=mcp.servers), "worker-B").run_once()

    after = await store.get(run.id)
    assert after is not None
    keys = [c["meta"]["agentrun.dev/idempotency-key"] for c in recorder.of(tool)]
    if tool == "hold":  # idempotent: called again, with the same key
        assert after.status is RunStatus.SUCCEEDED
        assert keys == ["toolu_1", "toolu_1"]
        # The second execution is made under a later claim: a service can tell the first caller was replaced.
        assert [c["meta"]["agentrun.dev/lease-epoch"] for c in recorder.of(tool)] == [1, 2]
        assert results_seen(llm, 1)[0]["content"] == "released"
    else:  # not idempotent: the run waits for a person, the call is not made again
        assert after.status is RunStatus.WAITING and after.pending == 1
        [call] = await store.decisions(run.id)
        assert (call.tool_use_id, call.tool_name, call.kind.value) == ("toolu_1", "shop__hold_once", "in_doubt")
        assert keys == ["toolu_1"]
        assert (await store.steps(run.id))[-1].status is StepStatus.STARTED


async def test_a_stdio_server_killed_mid_call_is_an_error_result_and_its_session_is_opened_again(
    store: RunStore
) -> None:
    async with sessions(stdio_server()) as mcp:
        run, _ = await store.create(new_run())
        llm = (ScriptedLlm().then_tool_use("t_die", "local__die", {})
               .then_tool_use("t_look", "local__lookup", {"q": "after"}).then_text("ok"))
        w = worker(store, llm, ToolBox(sources=mcp.servers))
        task = asyncio.create_task(w.run_once())

        async def second_turn() -> bool:
            return len(llm.seen) >= 2 or task.done()

        await eventually(second_turn, 60, "the model to see the result of the call that killed the server")
        await task

    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED, after
    [died] = results_seen(llm, 1)
    assert died["is_error"] is True
    assert died["content"].startswith("error: MCP server local failed during the call of die"), died
    [looked] = results_seen(llm, 2)
    assert looked["content"] == "found after"  # a new session, to a new server process


async def test_list_changed_adds_a_tool_without_a_restart(store: RunStore, http_server: HttpServer) -> None:
    async with sessions({"name": "shop", "url": http_server.url}) as mcp:
        box = ToolBox(sources=mcp.servers)
        assert "shop__fresh" not in box.names
        run, _ = await store.create(new_run())
        llm = ScriptedLlm().then_tool_use("t_grow", "shop__grow", {}).then_text("grown")
        await worker(store, llm, box).run_once()

        async def fresh() -> bool:
            return "shop__fresh" in box.names

        await eventually(fresh, 30, "the new tool to be listed")
        outcome = await box.execute("shop__fresh", {}, ToolContext(uuid.uuid4(), "t_fresh"))
        assert outcome.ok and outcome.output == "fresh!"
        definition = next(d for d in box.definitions() if d["name"] == "shop__fresh")
        assert definition["input_schema"]["type"] == "object"


async def test_approvals_follow_the_annotations_and_a_destructive_call_waits(
    store: RunStore, http_server: HttpServer
) -> None:
    async with sessions({"name": "shop", "url": http_server.url, "requireApproval": "destructive",
                         "overrides": {"lookup": {"requiresApproval": False}}},
                        {"name": "all", "url": http_server.url, "requireApproval": "all"}) as mcp:
        box = ToolBox(sources=mcp.servers)
        needs = {t.name: t.requires_approval for t in box.listing()}
        assert needs["shop__charge"] is True  # no annotations: destructive, as MCP's default says
        assert needs["shop__note"] is False  # destructiveHint: false
        assert needs["shop__status"] is False  # readOnlyHint: true
        assert needs["shop__lookup"] is False  # the config's override
        assert all(v for k, v in needs.items() if k.startswith("all__"))
        run, _ = await store.create(new_run())
        llm = (ScriptedLlm().then_tool_uses([("t_status", "shop__status", {}), ("t_pay", "shop__charge", {"usd": 5})])
               .then_text("done"))
        await worker(store, llm, box).run_once()

    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.WAITING
    [call] = await store.decisions(run.id)
    assert (call.tool_use_id, call.kind.value) == ("t_pay", "approval")
    assert http_server.recorder.of("charge") == []  # not called before a person says so


async def test_timeouts_and_garbage_are_error_results_and_the_session_goes_on(http_server: HttpServer) -> None:
    async with sessions({"name": "shop", "url": http_server.url,
                         "overrides": {"hang": {"timeoutSeconds": 0.5}}}) as mcp:
        box = ToolBox(sources=mcp.servers)
        ctx = ToolContext(uuid.uuid4(), "t_1")
        hung = await box.execute("shop__hang", {}, ctx)
        assert not hung.ok
        assert hung.output == "error: MCP server shop: hang timed out: no result and no progress for 0.5s"
        garbage = await box.execute("shop__garbage", {}, ctx)
        assert not garbage.ok
        assert garbage.output.startswith("error: MCP server shop answered the call of garbage with something that "
                                         "is not an MCP result: content: "), garbage  # then pydantic's words
        nonsense = await box.execute("shop__nonsense", {}, ctx)
        assert not nonsense.ok and nonsense.output.startswith("error: MCP server shop"), nonsense
        invalid = await box.execute("shop__lookup", {"q": 3}, ctx)
        assert not invalid.ok and invalid.output.startswith("error: invalid input for shop__lookup: ")  # jsonschema's why
        fine = await box.execute("shop__lookup", {"q": "still"}, ctx)
        assert fine.ok and fine.output == "found still"


async def test_an_unreachable_server_costs_its_own_tools_only(store: RunStore, http_server: HttpServer) -> None:
    async with sessions({"name": "shop", "url": http_server.url}) as up, \
            sessions({"name": "gone", "url": "http://127.0.0.1:9/mcp"}, wait=False) as down:
        gone = down.servers[0]

        async def failed_once() -> bool:
            return gone.error is not None and gone.error != "not connected yet"

        await eventually(failed_once, 30, "the first attempt to reach the server to fail")
        box = ToolBox(sources=[*up.servers, *down.servers])
        assert not any(n.startswith("gone__") for n in box.names)
        stand_in = box.get("gone__anything")
        assert stand_in is not None and stand_in.idempotent is False  # a call a crash cut is in doubt
        outcome = await box.execute("gone__anything", {}, ToolContext(uuid.uuid4(), "t_1"))
        assert not outcome.ok and outcome.output.startswith("error: MCP server gone has not answered yet")
        run, _ = await store.create(new_run())
        llm = ScriptedLlm().then_tool_use("t_look", "shop__lookup", {"q": "x"}).then_text("done")
        await worker(store, llm, box).run_once()
        after = await store.get(run.id)
        assert after is not None and after.status is RunStatus.SUCCEEDED


@pytest.mark.parametrize("found", ["done", "not done", "cannot tell"])
async def test_a_call_in_doubt_is_settled_by_the_servers_reconcile_tool(
    store: RunStore, db: psycopg.AsyncConnection[Any], http_server: HttpServer, found: str
) -> None:
    """`overrides.hold_once.reconcile: payment_status`: asked with the call's key before a person is."""
    recorder = http_server.recorder
    if found != "cannot tell":  # else the server knows nothing of the key: an error result
        recorder.ledger["toolu_1"] = "released once (per the ledger)" if found == "done" else None
    config = {"name": "shop", "url": http_server.url, "overrides": {"hold_once": {"reconcile": "payment_status"}}}
    async with sessions(config) as mcp:
        run, _ = await store.create(new_run())
        llm = ScriptedLlm().then_tool_use("toolu_1", "shop__hold_once", {}).then_text("done")

        async def started() -> bool:
            return len(recorder.of("hold_once")) == 1

        with pytest.raises(SimulatedCrash):
            await worker(store, llm, ToolBox(sources=[CrashInside(mcp.servers[0], started)]), "worker-A").run_once()
        await expire_lease(db, run.id)
        recorder.release.set()
        await worker(store, llm, ToolBox(sources=mcp.servers), "worker-B").run_once()

    after = await store.get(run.id)
    assert after is not None
    [probe] = recorder.of("payment_status")
    assert probe["args"] == {"idempotencyKey": "toolu_1"}
    assert probe["meta"]["agentrun.dev/idempotency-key"] == "toolu_1"
    [decided] = await store.decisions(run.id)
    calls = len(recorder.of("hold_once"))
    if found == "cannot tell":
        assert after.status is RunStatus.WAITING and calls == 1
        assert decided.decision is None and decided.kind.value == "in_doubt"
        return
    assert after.status is RunStatus.SUCCEEDED and decided.decided_by == "reconcile"
    if found == "done":
        assert calls == 1 and decided.decision is not None and decided.decision.value == "record"
        assert results_seen(llm, 1)[0]["content"] == "released once (per the ledger)"
    else:
        assert calls == 2 and decided.decision is not None and decided.decision.value == "retry"
        assert results_seen(llm, 1)[0]["content"] == "released once"


@pytest.mark.parametrize(("probe", "why"), [
    ("no_such_tool", "names 'no_such_tool', which the server does not list"),
    ("charge", "names 'charge', which is not read-only (readOnlyHint)"),
])
async def test_a_reconcile_tool_that_is_not_a_read_only_tool_of_the_server_is_a_config_error(
    http_server: HttpServer, probe: str, why: str
) -> None:
    config = {"name": "shop", "url": http_server.url, "overrides": {"hold_once": {"reconcile": probe}}}
    async with sessions(config, wait=False) as mcp:
        server = mcp.servers[0]

        async def refused() -> bool:
            return server.attempted.is_set() and why in (server.error or "")

        await eventually(refused, 60, "the config error")
        assert not server.available() and "overrides.hold_once.reconcile" in (server.error or "")
