"""Priorities and schedules: higher priority first, then oldest; nothing claimed before its time; the
deadline counts from then; an idle worker wakes for a scheduled run on time, without polling faster."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import httpx
import psycopg
import pytest

from agentrun.operator.mapping import InvalidSpec
from agentrun.operator.mapping import new_run as spec_run
from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import new_run, worker
from tests.support.waiting import eventually

RUN = {"input": "go", "tokenBudget": 1000, "timeoutSeconds": 60}


async def test_higher_priority_first_then_oldest(store: RunStore) -> None:
    low, _ = await store.create(new_run("low"))
    high_old, _ = await store.create(new_run("high-old", priority=5))
    high_new, _ = await store.create(new_run("high-new", priority=5))
    negative, _ = await store.create(new_run("negative", priority=-3))
    order = []
    for _ in range(4):
        claim = await store.claim("w", 30)
        assert claim is not None
        order.append(claim.run.id)
    assert order == [high_old.id, high_new.id, low.id, negative.id]
    assert await store.claim("w", 30) is None


async def test_a_run_is_not_claimed_before_its_time(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    later, _ = await store.create(new_run("later", delay_seconds=3600, priority=100))
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)
    scheduled, _ = await store.create(new_run("scheduled", run_at=at, priority=100))
    now, _ = await store.create(new_run("now"))
    claim = await store.claim("w", 30)
    assert claim is not None and claim.run.id == now.id  # the high-priority future runs wait
    assert await store.claim("w", 30) is None
    assert scheduled.run_at == at
    # The deadline counts from when the run becomes claimable, not from its creation.
    assert scheduled.deadline_at - at == datetime.timedelta(seconds=300)
    assert later.run_at is not None and later.deadline_at - later.run_at == datetime.timedelta(seconds=300)
    assert later.run_at - later.created_at >= datetime.timedelta(seconds=3599)
    await db.execute("UPDATE run SET run_at = now() - interval '1 second' WHERE id = %s", (later.id,))
    claim = await store.claim("w", 30)
    assert claim is not None and claim.run.id == later.id
    # A time in the past means at once.
    past, _ = await store.create(new_run("past", run_at=at - datetime.timedelta(days=3)))
    assert past.run_at is not None and abs((past.run_at - past.created_at).total_seconds()) < 1


async def test_idle_worker_wakes_for_a_scheduled_run_at_its_time_not_at_its_poll(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    # A 300 s poll interval: only the wake-up at the run's time can start it within the test's bounds.
    w = worker(store, ScriptedLlm().then_text("done"), poll=300.0)
    serving = asyncio.create_task(w.run())
    try:
        await asyncio.sleep(0)  # let the worker reach its idle wait first (not a timing assumption)
        run, _ = await store.create(new_run(delay_seconds=2.0))
        assert run.run_at is not None

        async def started() -> bool:
            got = await store.get(run.id)
            return got is not None and got.started_at is not None

        await eventually(started, timeout=20, what="the scheduled run to start")
        got = await store.get(run.id)
        assert got is not None and got.started_at is not None
        cur = await db.execute("SELECT min(claimed_at) FROM run_lease WHERE run_id = %s", (run.id,))
        claimed_at = (await cur.fetchone())[0]  # type: ignore[index]
        # Not before its time (the lower bound), and long before the next poll (sub-second when quiet; the
        # bound is one a loaded machine keeps).
        assert claimed_at >= run.run_at, f"claimed {(run.run_at - claimed_at).total_seconds():.3f}s early"
        late = (got.started_at - run.run_at).total_seconds()
        assert 0 <= late < 10.0, f"started {late:.3f}s after its time"
        await eventually(lambda: _status(store, run.id, RunStatus.SUCCEEDED), timeout=20, what="the run to end")
    finally:
        w.stop()
        await asyncio.wait_for(serving, 20)


async def test_idle_worker_does_not_poll_faster_for_future_runs(store: RunStore) -> None:
    """Far-off scheduled runs do not shorten the idle wait: claims stay at the poll interval."""
    for i in range(20):
        await store.create(new_run(f"later {i}", delay_seconds=3600 + i))
    claims = 0
    real = store.claim_many

    async def counting(*a: Any, **kw: Any) -> Any:
        nonlocal claims
        claims += 1
        return await real(*a, **kw)

    store.claim_many = counting  # type: ignore[method-assign]
    w = worker(store, ScriptedLlm(), poll=0.5)
    serving = asyncio.create_task(w.run())
    t0 = time.monotonic()
    try:
        await eventually(lambda: _after(t0, 2.0), timeout=20, what="two seconds to pass")
    finally:
        w.stop()
        await asyncio.wait_for(serving, 20)
    elapsed = time.monotonic() - t0
    assert claims <= elapsed / 0.5 + 2, f"{claims} claims in {elapsed:.1f}s"


async def _after(t0: float, seconds: float) -> bool:
    return time.monotonic() - t0 >= seconds


async def _status(store: RunStore, run_id: Any, status: RunStatus) -> bool:
    got = await store.get(run_id)
    return got is not None and got.status is status


async def test_api_fields(client: httpx.AsyncClient) -> None:
    at = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).replace(microsecond=0)
    r = await client.post("/api/runs", json={**RUN, "priority": 7, "runAt": at.isoformat().replace("+00:00", "Z")})
    assert r.status_code == 201, r.text
    view = (await client.get(f"/api/runs/{r.json()['id']}")).json()
    assert view["priority"] == 7
    assert datetime.datetime.fromisoformat(view["runAt"]) == at
    assert datetime.datetime.fromisoformat(view["deadlineAt"]) == at + datetime.timedelta(seconds=60)
    r = await client.post("/api/runs", json={**RUN, "delaySeconds": 90})
    view = (await client.get(f"/api/runs/{r.json()['id']}")).json()
    delay = datetime.datetime.fromisoformat(view["runAt"]) - datetime.datetime.fromisoformat(view["createdAt"])
    assert abs(delay.total_seconds() - 90) < 1 and view["priority"] == 0


@pytest.mark.parametrize(("body", "field"), [
    ({"priority": 1.5}, "priority"),
    ({"priority": "high"}, "priority"),
    ({"priority": 10**7}, "priority"),
    ({"runAt": "tomorrow"}, "runAt"),
    ({"runAt": "2026-12-01T10:00:00"}, "runAt"),  # no offset: no instant
    ({"runAt": "9999-12-31T23:59:59Z"}, "runAt"),
    ({"runAt": None, "delaySeconds": 5}, "body"),
    ({"runAt": 12}, "runAt"),
    ({"delaySeconds": -1}, "delaySeconds"),
    ({"delaySeconds": "soon"}, "delaySeconds"),
    ({"delaySeconds": 5, "runAt": "2026-12-01T10:00:00Z"}, "body"),
])
async def test_bad_schedule_is_a_422_naming_the_field(client: httpx.AsyncClient, body: dict[str, Any], field: str) -> None:
    r = await client.post("/api/runs", json={**RUN, **body})
    assert r.status_code == 422, r.text
    assert field in [f["field"] for f in r.json()["fields"]], r.json()


def test_crd_spec_fields() -> None:
    spec = {"input": "go", "priority": 3, "runAt": "2030-01-02T03:04:05Z"}
    new = spec_run(spec, "6f1c2e0a-0000-4000-8000-000000000001", "ns", "name")
    assert new.priority == 3 and new.run_at == datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    new = spec_run({"input": "go", "delaySeconds": 60}, "6f1c2e0a-0000-4000-8000-000000000001", "ns", "name")
    assert new.delay_seconds == 60 and new.priority == 0
    for bad in ({"priority": True}, {"runAt": "never"}, {"runAt": "2030-01-02T03:04:05"}, {"delaySeconds": -5},
                {"delaySeconds": 5, "runAt": "2030-01-02T03:04:05Z"}):
        with pytest.raises(InvalidSpec):
            spec_run({"input": "go", **bad}, "6f1c2e0a-0000-4000-8000-000000000001", "ns", "name")
