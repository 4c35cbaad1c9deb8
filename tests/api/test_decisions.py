"""People in the loop over real HTTP, a real worker and real PostgreSQL: approvals, calls in doubt,
waiting runs' deadlines and cancels, and decisions that race."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from agentrun.worker.core.errors import CancelRequested
from agentrun.worker.core.records import DecisionKind, RunStatus
from agentrun.worker.runtime.runner import Worker
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import Tool, ToolBox, ToolContext, tool
from tests.support.api import make_app, status_is, submit
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.support.running import running
from tests.support.serving import serving

executed: list[str] = []


@tool(name="noop", description="Does nothing.")
async def noop(args: dict[str, Any], ctx: ToolContext) -> str:
    executed.append(f"noop:{ctx.tool_use_id}")
    return "ok"


@tool(name="charge", description="Charges a card.", requires_approval=True, idempotent=False)
async def charge(args: dict[str, Any], ctx: ToolContext) -> str:
    executed.append(f"charge:{ctx.tool_use_id}")
    return f"charged {args.get('usd')}"


@tool(name="refund", description="Refunds a card.")
async def refund(args: dict[str, Any], ctx: ToolContext) -> str:
    executed.append(f"refund:{ctx.tool_use_id}")
    return "refunded"


TOOLS = [noop, charge, refund]


@pytest.fixture(autouse=True)
def _clear() -> None:
    executed.clear()


@pytest.fixture
def toolbox() -> ToolBox:
    return ToolBox(TOOLS)


@contextlib.asynccontextmanager
async def api(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = make_app(store, toolbox, settings, metrics)
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield client


def parallel_turn() -> ScriptedLlm:
    return (
        ScriptedLlm()
        .then_tool_uses([("t_noop", "noop", {}), ("t_charge", "charge", {"usd": 10}), ("t_refund", "refund", {})],
                        10, 5)
        .then_text("all settled", 10, 5)
    )


async def test_approve_and_deny_with_parallel_tool_use(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    llm = parallel_turn()
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        run_id = await submit(client, requireApproval=["refund"])
        run = await status_is(client, run_id, "WAITING")
        assert run["pending"] == 2
        assert executed == ["noop:t_noop"]  # what needs no approval ran first
        pending = (await client.get(f"/api/runs/{run_id}/pending")).json()
        assert [(p["toolUseId"], p["tool"], p["kind"], p["input"]) for p in pending] == [
            ("t_charge", "charge", "approval", {"usd": 10}), ("t_refund", "refund", "approval", {})
        ]
        assert all(p["since"] for p in pending)
        r = await client.post(f"/api/runs/{run_id}/pending/t_charge", json={"decision": "approve"})
        assert r.status_code == 200 and r.json()["status"] == "WAITING" and r.json()["pending"] == 1, r.text
        r = await client.post(f"/api/runs/{run_id}/pending/t_refund",
                              json={"decision": "deny", "reason": "refunds need a ticket"})
        assert r.status_code == 200, r.text
        run = await status_is(client, run_id, "SUCCEEDED")
        assert run["output"] == "all settled" and run["pending"] == 0
        assert (await client.get(f"/api/runs/{run_id}/pending")).json() == []
        timeline = (await client.get(f"/api/runs/{run_id}/timeline")).json()
    assert sorted(executed) == ["charge:t_charge", "noop:t_noop"]  # refund denied: never ran
    last = llm.seen[-1].messages[-1]["content"]
    denied = next(b for b in last if b["tool_use_id"] == "t_refund")
    assert denied["is_error"] is True and "denied" in denied["content"] and "refunds need a ticket" in denied["content"]
    by_id = {row["toolUseId"]: row for row in timeline if row["toolUseId"]}
    assert by_id["t_refund"]["status"] == "ERROR" and by_id["t_refund"]["attempts"] == 0
    assert [d["decision"] for d in by_id["t_refund"]["decisions"]] == ["deny"]
    assert by_id["t_refund"]["decisions"][0]["reason"] == "refunds need a ticket"
    assert [d["decision"] for d in by_id["t_charge"]["decisions"]] == ["approve"]
    assert by_id["t_noop"]["decisions"] == []
    scraped = metrics.registry.get_sample_value("agentrun_decisions_total", {"kind": "approval", "decision": "deny"})
    assert scraped == 1.0
    assert metrics.registry.get_sample_value("agentrun_waiting_seconds_count") == 1.0


async def test_a_waiting_call_shows_in_the_timeline(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> None:
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, parallel_turn(), toolbox)):
        run_id = await submit(client, requireApproval=["*"])
        await status_is(client, run_id, "WAITING")
        timeline = (await client.get(f"/api/runs/{run_id}/timeline")).json()
    waiting = [row for row in timeline if row["status"] == "WAITING"]
    assert [(w["toolUseId"], w["seq"]) for w in waiting] == [("t_noop", None), ("t_charge", None), ("t_refund", None)]
    assert all(w["decisions"][0]["decision"] is None for w in waiting)
    assert executed == []  # "*": every call waits


async def test_decisions_that_do_not_fit_are_refused(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> None:
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, parallel_turn(), toolbox)):
        run_id = await submit(client)
        await status_is(client, run_id, "WAITING")
        base = f"/api/runs/{run_id}/pending"
        assert (await client.post(f"{base}/t_charge", json={"decision": "retry"})).status_code == 409
        assert (await client.post(f"{base}/t_nope", json={"decision": "approve"})).status_code == 404
        assert (await client.post(f"/api/runs/{uuid.uuid4()}/pending/t_charge",
                                  json={"decision": "approve"})).status_code == 404
        assert (await client.get(f"/api/runs/{uuid.uuid4()}/pending")).status_code == 404
        bad = await client.post(f"{base}/t_charge", json={"decision": "maybe"})
        assert bad.status_code == 422 and "decision" in bad.text
        record = await client.post(f"{base}/t_charge", json={"decision": "record"})
        assert record.status_code == 422 and "output" in record.json()["error"]
        assert (await client.post(f"{base}/t_charge", json={"decision": "approve"})).status_code == 200
        again = await client.post(f"{base}/t_charge", json={"decision": "deny"})
        assert again.status_code == 409 and "already decided" in again.json()["error"]
        await status_is(client, run_id, "SUCCEEDED")


async def test_two_decisions_at_once_one_wins(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> None:
    async with api(store, toolbox, settings, metrics) as client:
        run_id = await submit(client)
        w = worker(store, parallel_turn(), toolbox)
        async with running(w):
            await status_is(client, run_id, "WAITING")
            w.stop()  # nobody resumes it while the race is judged
        url = f"/api/runs/{run_id}/pending/t_charge"
        answers = await asyncio.gather(*(
            client.post(url, json={"decision": d}) for d in ("approve", "deny", "approve", "deny")
        ))
        assert sorted(a.status_code for a in answers) == [200, 409, 409, 409]
        [call] = [c for c in await store.decisions(uuid.UUID(run_id)) if c.tool_use_id == "t_charge"]
        winner = next(a for a in answers if a.status_code == 200)
        assert winner.request.content and call.decision is not None
        assert call.decision.value in winner.request.content.decode()


async def test_the_last_two_decisions_at_once_queue_the_run(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    async with api(store, toolbox, settings, metrics) as client:
        run_id = await submit(client, requireApproval=["refund"])
        w = worker(store, parallel_turn(), toolbox)
        async with running(w):
            await status_is(client, run_id, "WAITING")
            w.stop()
        answers = await asyncio.gather(
            client.post(f"/api/runs/{run_id}/pending/t_charge", json={"decision": "approve"}),
            client.post(f"/api/runs/{run_id}/pending/t_refund", json={"decision": "approve"}),
        )
        assert [a.status_code for a in answers] == [200, 200]
        assert (await client.get(f"/api/runs/{run_id}")).json()["status"] == "QUEUED"


async def test_a_waiting_run_past_its_deadline_times_out(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, parallel_turn(), toolbox)):
        run_id = await submit(client)
        await status_is(client, run_id, "WAITING")
        # Its deadline passes while it waits (set here, so the test does not race the run to the park).
        await db.execute("UPDATE run SET deadline_at = now() WHERE id = %s", (run_id,))
        run = await status_is(client, run_id, "TIMED_OUT", timeout=30)
    assert "waiting for a decision" in run["error"]
    assert executed == ["noop:t_noop", "refund:t_refund"]  # only charge needs approval


async def test_cancel_ends_a_waiting_run_at_once(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> None:
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, parallel_turn(), toolbox)):
        run_id = await submit(client)
        await status_is(client, run_id, "WAITING")
        r = await client.post(f"/api/runs/{run_id}/cancel")
        assert r.status_code == 202 and r.json()["status"] == "CANCELLED"
        assert (await client.get(f"/api/runs/{run_id}/pending")).json() == []
        late = await client.post(f"/api/runs/{run_id}/pending/t_charge", json={"decision": "approve"})
        assert late.status_code == 409


class CancelBeforePark(RunStore):
    """Someone cancels the run while it is still held, just before it parks for people."""

    async def park(self, run_id: uuid.UUID, worker: str, calls: Any, **kw: Any) -> None:
        await self.cancel(run_id, by="alice")
        await super().park(run_id, worker, calls, **kw)


async def test_a_cancel_just_before_the_park_ends_the_run_cancelled(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    """Not WAITING until someone decides or the deadline passes (then TIMED_OUT): nothing wakes a run
    parked for a decision, so the park itself must see the cancel."""
    async with api(store, toolbox, settings, metrics) as client, \
            running(worker(CancelBeforePark(store.pool), parallel_turn(), toolbox)):
        run_id = await submit(client)
        run = await status_is(client, run_id, "CANCELLED", "WAITING", "TIMED_OUT")
        assert (run["status"], run["cancelledBy"]) == ("CANCELLED", "alice"), run
        assert (await client.get(f"/api/runs/{run_id}/pending")).json() == []
    assert sorted(executed) == ["noop:t_noop", "refund:t_refund"]  # charge, which needs a person, never ran


@pytest.mark.parametrize("kind", [DecisionKind.APPROVAL, DecisionKind.IN_DOUBT])
async def test_a_park_after_a_cancel_asks_nobody_and_raises(store: RunStore, kind: DecisionKind) -> None:
    run, _ = await store.create(new_run())
    claimed = await store.claim("w", 30)
    assert claimed is not None and claimed.run.id == run.id
    await store.cancel(run.id, by="alice")
    with pytest.raises(CancelRequested):
        await store.park(run.id, "w", [("t_pay", kind, "pay", "{}", int(kind is DecisionKind.IN_DOUBT))], epoch=claimed.run.lease_epoch)
    after = await store.get(run.id)
    assert after is not None and (after.status, after.locked_by, after.pending) == (RunStatus.RUNNING, "w", 0)
    assert await store.decisions(run.id) == []


async def test_housekeeping_ends_a_run_left_waiting_though_asked_to_stop(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """A run parked for people while a cancel asked it to stop, before the park was fenced on the ask (the
    state issue 44 found): no worker holds it, so the housekeeping pass ends it, as the cancel would have."""
    run, _ = await store.create(new_run())
    claimed = await store.claim("w", 30)
    assert claimed is not None and claimed.run.id == run.id
    await store.park(run.id, "w", [("t_pay", DecisionKind.APPROVAL, "pay", "{}", 0)], epoch=claimed.run.lease_epoch)
    other, _ = await store.create(new_run())  # waiting too, and not asked to stop: left as it is
    claimed = await store.claim("w", 30)
    assert claimed is not None and claimed.run.id == other.id
    await store.park(other.id, "w", [("t_pay", DecisionKind.APPROVAL, "pay", "{}", 0)], epoch=claimed.run.lease_epoch)
    await db.execute("UPDATE run SET cancel_requested = true, cancelled_by = 'alice' WHERE id = %s", (run.id,))
    assert await store.end_cancelled_waiting() == [run.id]
    after = await store.get(run.id)
    assert after is not None and (after.status, after.error, after.cancelled_by) == (
        RunStatus.CANCELLED, "cancelled while waiting for a decision", "alice")
    still = await store.get(other.id)
    assert still is not None and still.status is RunStatus.WAITING
    assert await store.end_cancelled_waiting() == []


async def test_a_waiting_run_holds_no_lease_and_spends_nothing(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    llm = parallel_turn()
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        run_id = await submit(client)
        before = await status_is(client, run_id, "WAITING")
        cur = await db.execute("SELECT locked_by, locked_until FROM run WHERE id = %s", (run_id,))
        assert await cur.fetchone() == (None, None)
        assert len(llm.seen) == 1
        listed = (await client.get("/api/runs", params={"status": "WAITING"})).json()["items"]
        assert [r["id"] for r in listed] == [run_id]
    assert before["tokensUsed"] == 15


# -- crashes around decisions ------------------------------------------------------------------------


crash_in: set[str] = set()


@tool(name="pay", description="Pays, once.", idempotent=False)
async def pay(args: dict[str, Any], ctx: ToolContext) -> str:
    executed.append(f"pay:{ctx.tool_use_id}")
    if "pay" in crash_in:
        crash_in.discard("pay")
        raise SimulatedCrash()
    return "paid"


@tool(name="lookup", description="Looks up, safely repeated.", requires_approval=True)
async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    executed.append(f"lookup:{ctx.tool_use_id}")
    if "lookup" in crash_in:
        crash_in.discard("lookup")
        raise SimulatedCrash()
    return "found"


async def _crash_then_lapse(store: RunStore, db: psycopg.AsyncConnection[Any], w: Worker, run_id: str) -> None:
    with pytest.raises(SimulatedCrash):
        await w.run_once()
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run_id,))


@pytest.mark.parametrize("decision", ["retry", "record", "fail"])
async def test_a_call_in_doubt_waits_for_a_person(
    decision: str, store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    box = ToolBox([pay])
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {"usd": 5}, 10, 5).then_text("done", 10, 5)
    crash_in.add("pay")
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-A"), run_id)
        async with running(worker(store, llm, box, "worker-B")):
            await status_is(client, run_id, "WAITING")
            [p] = (await client.get(f"/api/runs/{run_id}/pending")).json()
            assert (p["toolUseId"], p["kind"]) == ("t_pay", "in_doubt")
            assert (await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "approve"})).status_code == 409
            body: dict[str, Any] = {"decision": decision, "reason": "checked the ledger"}
            if decision == "record":
                body.update(output="paid (found in the ledger)", isError=False)
            r = await client.post(f"/api/runs/{run_id}/pending/t_pay", json=body)
            assert r.status_code == 200, r.text
            run = await status_is(client, run_id, "SUCCEEDED", "FAILED")
        steps = await store.steps(uuid.UUID(run_id))
    pay_step = next(s for s in steps if s.tool_use_id == "t_pay")
    if decision == "retry":
        assert run["status"] == "SUCCEEDED" and executed == ["pay:t_pay", "pay:t_pay"]
        assert pay_step.attempts == 2 and pay_step.response == "paid"
    elif decision == "record":
        assert run["status"] == "SUCCEEDED" and executed == ["pay:t_pay"]
        assert pay_step.response == "paid (found in the ledger)" and pay_step.status.value == "DONE"
    else:
        assert run["status"] == "FAILED" and executed == ["pay:t_pay"]
        assert "t_pay" in run["error"] and "checked the ledger" in run["error"]
        assert pay_step.status.value == "STARTED"  # the evidence stays


async def test_a_worker_crash_while_waiting_loses_nothing(
    store: RunStore, settings: Any, metrics: Any
) -> None:
    box = ToolBox([lookup])
    llm = ScriptedLlm().then_tool_use("t_look", "lookup", {}, 10, 5).then_text("done", 10, 5)
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        async with running(worker(store, llm, box, "worker-A")):
            await status_is(client, run_id, "WAITING")
        # worker-A is gone; the decision is durable and any worker takes the run from here.
        assert (await client.post(f"/api/runs/{run_id}/pending/t_look", json={"decision": "approve"})).status_code == 200
        async with running(worker(store, llm, box, "worker-B")):
            run = await status_is(client, run_id, "SUCCEEDED")
    assert executed == ["lookup:t_look"] and run["output"] == "done"


async def test_a_crash_while_an_approved_call_runs(
    store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    """An approved idempotent call is run again with the same key; it needs no second approval."""
    box = ToolBox([lookup])
    llm = ScriptedLlm().then_tool_use("t_look", "lookup", {}, 10, 5).then_text("done", 10, 5)
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        async with running(worker(store, llm, box, "worker-A")):
            await status_is(client, run_id, "WAITING")
        await client.post(f"/api/runs/{run_id}/pending/t_look", json={"decision": "approve"})
        crash_in.add("lookup")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-B"), run_id)
        async with running(worker(store, llm, box, "worker-C")):
            await status_is(client, run_id, "SUCCEEDED")
    assert executed == ["lookup:t_look", "lookup:t_look"]


async def test_a_crash_while_an_approved_non_idempotent_call_runs_puts_it_in_doubt(
    store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    guarded_pay = Tool(pay.name, pay.description, pay.input_schema, pay.fn, idempotent=False,
                       requires_approval=True)
    box = ToolBox([guarded_pay])
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {}, 10, 5).then_text("done", 10, 5)
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        async with running(worker(store, llm, box, "worker-A")):
            await status_is(client, run_id, "WAITING")
        await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "approve"})
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-B"), run_id)
        async with running(worker(store, llm, box, "worker-C")):
            await status_is(client, run_id, "WAITING")
            [p] = (await client.get(f"/api/runs/{run_id}/pending")).json()
            assert p["kind"] == "in_doubt"
            r = await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "record", "output": "paid"})
            assert r.status_code == 200
            await status_is(client, run_id, "SUCCEEDED")
        timeline = (await client.get(f"/api/runs/{run_id}/timeline")).json()
    assert executed == ["pay:t_pay"]
    row = next(r for r in timeline if r["toolUseId"] == "t_pay")
    assert sorted((d["kind"], d["decision"]) for d in row["decisions"]) == [("approval", "approve"),
                                                                           ("in_doubt", "record")]


def test_the_run_statuses_include_waiting() -> None:
    assert RunStatus.WAITING.value == "WAITING" and not RunStatus.WAITING.terminal


async def test_the_last_decision_wakes_an_idle_worker_by_notification(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    """The worker polls once a minute: only the notification of the queued run can wake it in time."""
    async with api(store, toolbox, settings, metrics) as client:
        run_id = await submit(client)
        async with running(worker(store, parallel_turn(), toolbox, poll=60.0)):
            await status_is(client, run_id, "WAITING")
            assert (await client.post(f"/api/runs/{run_id}/pending/t_charge", json={"decision": "approve"})).status_code == 200
            await status_is(client, run_id, "SUCCEEDED", timeout=30)


# -- a decision authorises one execution (issue 24, item 1) ----------------------------------------------


async def _in_doubt(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """The run's one pending entry, which must be a call in doubt: the run is WAITING."""
    run = await status_is(client, run_id, "WAITING", "SUCCEEDED", "FAILED")
    assert run["status"] == "WAITING", f"the run went on without a decision: {run['status']}, ran {executed}"
    [p] = (await client.get(f"/api/runs/{run_id}/pending")).json()
    assert p["kind"] == "in_doubt", p
    return dict(p)


async def test_a_retry_authorises_one_execution_and_a_crash_in_it_asks_again(
    store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    """pay crashes, a person says retry, the retried pay crashes too: the next worker must ask again, not
    pay a third time on the first decision."""
    box = ToolBox([pay])
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {"usd": 5}, 10, 5).then_text("done", 10, 5)
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-A"), run_id)  # execution 1
        async with running(worker(store, llm, box, "worker-B")):
            first = await _in_doubt(client, run_id)
        r = await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "retry", "reason": "no charge"})
        assert r.status_code == 200, r.text
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-C"), run_id)  # execution 2
        async with running(worker(store, llm, box, "worker-D")):
            second = await _in_doubt(client, run_id)
            assert executed == ["pay:t_pay", "pay:t_pay"]
            again = await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "retry"})
            assert again.status_code == 200, again.text
            run = await status_is(client, run_id, "SUCCEEDED", "FAILED")
        timeline = (await client.get(f"/api/runs/{run_id}/timeline")).json()
        row = next(r for r in timeline if r["toolUseId"] == "t_pay")
        detail = (await client.get(f"/api/runs/{run_id}/steps/{row['seq']}")).json()
    assert run["status"] == "SUCCEEDED" and executed == ["pay:t_pay"] * 3  # one per authorisation
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert row["attempts"] == 3
    decided = [(d["kind"], d["decision"], d["attempt"], d["reason"]) for d in row["decisions"]]
    assert decided == [("in_doubt", "retry", 1, "no charge"), ("in_doubt", "retry", 2, None)]
    assert detail["decisions"] == row["decisions"]  # the step's own page shows the same list


async def test_a_crash_before_the_retried_execution_starts_keeps_the_decision(
    store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    """A worker that dies after reading `retry` and before the retried execution is recorded did not
    use the decision up: the next one runs the call on it, once, without asking again."""
    box = ToolBox([pay])
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {"usd": 5}, 10, 5).then_text("done", 10, 5)
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-A"), run_id)
        async with running(worker(store, llm, box, "worker-B")):
            await _in_doubt(client, run_id)
        assert (await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "retry"})).status_code == 200
        crashing = worker(store, llm, box, "worker-C")
        original = crashing.store.start_tool

        async def die_first(*args: Any, **kwargs: Any) -> Any:
            raise SimulatedCrash()

        crashing.store.start_tool = die_first  # type: ignore[method-assign]
        try:
            await _crash_then_lapse(store, db, crashing, run_id)
        finally:
            crashing.store.start_tool = original  # type: ignore[method-assign]
        assert executed == ["pay:t_pay"]
        async with running(worker(store, llm, box, "worker-D")):
            run = await status_is(client, run_id, "SUCCEEDED", "FAILED", "WAITING")
    assert run["status"] == "SUCCEEDED" and executed == ["pay:t_pay", "pay:t_pay"]


async def test_an_approval_authorises_one_execution_of_a_non_idempotent_call(
    store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    guarded_pay = Tool(pay.name, pay.description, pay.input_schema, pay.fn, idempotent=False,
                       requires_approval=True)
    box = ToolBox([guarded_pay])
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {}, 10, 5).then_text("done", 10, 5)
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        async with running(worker(store, llm, box, "worker-A")):
            await status_is(client, run_id, "WAITING")
        [p] = (await client.get(f"/api/runs/{run_id}/pending")).json()
        assert (p["kind"], p["attempt"]) == ("approval", 0)
        await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "approve"})
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-B"), run_id)
        async with running(worker(store, llm, box, "worker-C")):
            assert (await _in_doubt(client, run_id))["attempt"] == 1
            await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "retry"})
            await status_is(client, run_id, "SUCCEEDED")
        timeline = (await client.get(f"/api/runs/{run_id}/timeline")).json()
    assert executed == ["pay:t_pay", "pay:t_pay"]
    row = next(r for r in timeline if r["toolUseId"] == "t_pay")
    assert [(d["kind"], d["decision"], d["attempt"]) for d in row["decisions"]] == [
        ("approval", "approve", 0), ("in_doubt", "retry", 1)
    ]


# -- forks and continuations never re-run a call in doubt (issue 24, item 7) --------------------------------


@pytest.mark.parametrize("at", ["the tool step", "the model step"])
async def test_a_fork_of_a_run_whose_call_was_in_doubt_asks_again(
    at: str, store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    """The parent's pay was in doubt and a person chose fail; a fork that goes on from that call inherits it
    in doubt, and the child asks a person rather than paying again."""
    box = ToolBox([pay])
    llm = (ScriptedLlm().then_tool_use("t_pay", "pay", {"usd": 5}, 10, 5)
           .then_text("done", 10, 5))
    async with api(store, box, settings, metrics) as client:
        parent = await submit(client)
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-A"), parent)
        async with running(worker(store, llm, box, "worker-B")):
            await _in_doubt(client, parent)
            r = await client.post(f"/api/runs/{parent}/pending/t_pay", json={"decision": "fail"})
            assert r.status_code == 200, r.text
            failed = await status_is(client, parent, "FAILED")
            seq = failed["steps"] if at == "the tool step" else 1
            fork = await client.post("/api/runs", json={"forkFrom": {"runId": parent, "seq": seq}})
            assert fork.status_code == 201, fork.text
            child = fork.json()["id"]
            p = await _in_doubt(client, child)
            assert executed == ["pay:t_pay"]  # the child did not pay again
            assert (p["toolUseId"], p.get("attempt")) == ("t_pay", 1)
            r = await client.post(f"/api/runs/{child}/pending/t_pay", json={"decision": "retry"})
            assert r.status_code == 200, r.text
            run = await status_is(client, child, "SUCCEEDED", "FAILED")
        timeline = (await client.get(f"/api/runs/{child}/timeline")).json()
    assert run["status"] == "SUCCEEDED" and executed == ["pay:t_pay", "pay:t_pay"]
    row = next(r for r in timeline if r["toolUseId"] == "t_pay")
    assert row["attempts"] == 2
    assert [(d["decision"], d["attempt"]) for d in row["decisions"]] == [("retry", 1)]  # the parent's fail is its own


# -- calls in doubt that the tool settles itself: reconcile probes (issue 24, item 8) ------------------------

ledger: dict[str, str | None] = {}  # idempotency key → what the probe answers (a result, or None: not done)
probed: list[str] = []


def _ask_ledger(args: dict[str, Any], ctx: ToolContext) -> str | None:
    probed.append(ctx.idempotency_key)
    if ctx.idempotency_key not in ledger:
        raise ConnectionError("the ledger is down")
    return ledger[ctx.idempotency_key]


async def _ask_ledger_async(args: dict[str, Any], ctx: ToolContext) -> str | None:
    return _ask_ledger(args, ctx)


def _reconciled_pay(probe: Any) -> ToolBox:
    return ToolBox([Tool(pay.name, pay.description, pay.input_schema, pay.fn, idempotent=False, reconcile=probe)])


@pytest.fixture(autouse=True)
def _clear_ledger() -> None:
    ledger.clear()
    probed.clear()


@pytest.mark.parametrize("probe", [_ask_ledger, _ask_ledger_async], ids=["sync", "async"])
async def test_a_probe_that_finds_the_call_done_records_its_result(
    probe: Any, store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    box = _reconciled_pay(probe)
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {"usd": 5}, 10, 5).then_text("done", 10, 5)
    ledger["t_pay"] = "paid, receipt 7"
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-A"), run_id)
        async with running(worker(store, llm, box, "worker-B")):
            run = await status_is(client, run_id, "SUCCEEDED", "FAILED", "WAITING")
        timeline = (await client.get(f"/api/runs/{run_id}/timeline")).json()
    assert run["status"] == "SUCCEEDED" and executed == ["pay:t_pay"] and probed == ["t_pay"]
    row = next(r for r in timeline if r["toolUseId"] == "t_pay")
    assert row["status"] == "DONE"
    [d] = row["decisions"]
    assert (d["kind"], d["decision"], d["attempt"], d["decidedBy"]) == ("in_doubt", "record", 1, "reconcile")
    result = next(b for b in llm.seen[-1].messages[-1]["content"] if b["tool_use_id"] == "t_pay")
    assert result["content"] == "paid, receipt 7" and not result.get("is_error")


async def test_a_probe_that_finds_the_call_not_done_runs_it_again(
    store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    box = _reconciled_pay(_ask_ledger_async)
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {"usd": 5}, 10, 5).then_text("done", 10, 5)
    ledger["t_pay"] = None
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-A"), run_id)
        async with running(worker(store, llm, box, "worker-B")):
            run = await status_is(client, run_id, "SUCCEEDED", "FAILED", "WAITING")
        [d] = await store.decisions(uuid.UUID(run_id))
    assert run["status"] == "SUCCEEDED" and executed == ["pay:t_pay", "pay:t_pay"]
    assert d.decision is not None and (d.decision.value, d.attempt, d.decided_by) == ("retry", 1, "reconcile")


async def test_a_probe_that_cannot_tell_asks_a_person(
    store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    box = _reconciled_pay(_ask_ledger)  # the ledger knows nothing of t_pay: the probe raises
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {"usd": 5}, 10, 5).then_text("done", 10, 5)
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-A"), run_id)
        async with running(worker(store, llm, box, "worker-B")):
            p = await _in_doubt(client, run_id)
            assert (p["toolUseId"], p["attempt"]) == ("t_pay", 1) and probed == ["t_pay"]
            r = await client.post(f"/api/runs/{run_id}/pending/t_pay", json={"decision": "record", "output": "paid"})
            assert r.status_code == 200, r.text
            await status_is(client, run_id, "SUCCEEDED")
    assert executed == ["pay:t_pay"] and probed == ["t_pay"]  # the person decided: not probed again


async def test_a_crash_after_the_probe_is_recorded_neither_loses_nor_repeats_it(
    store: RunStore, settings: Any, metrics: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    box = _reconciled_pay(_ask_ledger_async)
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {"usd": 5}, 10, 5).then_text("done", 10, 5)
    ledger["t_pay"] = None  # not done: the call is to run again, once
    async with api(store, box, settings, metrics) as client:
        run_id = await submit(client)
        crash_in.add("pay")
        await _crash_then_lapse(store, db, worker(store, llm, box, "worker-A"), run_id)
        crashing = worker(store, llm, box, "worker-B")
        original = crashing.store.reconcile

        async def stored_then_die(*args: Any, **kwargs: Any) -> Any:
            await original(*args, **kwargs)
            raise SimulatedCrash()

        crashing.store.reconcile = stored_then_die  # type: ignore[method-assign]
        try:
            await _crash_then_lapse(store, db, crashing, run_id)
        finally:
            crashing.store.reconcile = original  # type: ignore[method-assign]
        ledger["t_pay"] = "paid"  # what a second probe would say: it must not be asked
        async with running(worker(store, llm, box, "worker-C")):
            run = await status_is(client, run_id, "SUCCEEDED", "FAILED", "WAITING")
        decided = await store.decisions(uuid.UUID(run_id))
    assert run["status"] == "SUCCEEDED" and executed == ["pay:t_pay", "pay:t_pay"] and probed == ["t_pay"]
    assert [(d.decision.value if d.decision else None, d.decided_by) for d in decided] == [("retry", "reconcile")]


def test_reconcile_must_be_a_function() -> None:
    with pytest.raises(ValueError, match="reconcile must be a function"):
        tool(name="x", reconcile="lookup")  # type: ignore[arg-type]
