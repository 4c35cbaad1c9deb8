"""/api/schedules over a real database, and the ticker's passes: the run template checked as a run is,
bad cron and time zones named, one run per tick with scheduleName and scheduledTime, the concurrency
policies, suspend and resume."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import httpx
import psycopg
import pytest

from agentrun.worker.core.records import RunStatus
from agentrun.worker.runtime.schedules import Ticker
from agentrun.worker.store import RunStore
from tests.support.builders import SimulatedCrash

RUN = {"input": "report", "tokenBudget": 1000, "timeoutSeconds": 60}


def problems(r: httpx.Response) -> dict[str, str]:
    body = r.json()
    assert isinstance(body["error"], str) and body["error"], body
    return {p["field"]: p["problem"] for p in body["fields"]}


async def due_now(db: psycopg.AsyncConnection[Any], name: str) -> None:
    await db.execute("UPDATE schedule SET next_due_at = date_trunc('second', now()) WHERE name = %s", (name,))


async def second_tick_due(db: psycopg.AsyncConnection[Any], name: str) -> None:
    """Another tick due now, half an hour before the first (an hourly schedule): never the first's own time,
    whichever second the first fell on and however slow the machine is."""
    await db.execute("UPDATE schedule SET next_due_at = (SELECT max(scheduled_time) FROM schedule_tick "
                     "WHERE schedule_name = %(n)s) - interval '30 minutes' WHERE name = %(n)s", {"n": name})


async def test_create_read_patch_delete(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/schedules", json={"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
                                                  "run": RUN})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["concurrencyPolicy"] == "Allow" and body["startingDeadlineSeconds"] == 60
    assert body["suspend"] is False and body["lastScheduleTime"] is None and body["run"] == RUN
    nxt = datetime.datetime.fromisoformat(body["nextScheduleTime"])
    assert nxt.astimezone(datetime.timezone(datetime.timedelta(hours=1))).hour in (3, 4)  # 03:00 Berlin
    assert (await client.post("/api/schedules", json={"name": "nightly", "intervalSeconds": 5, "run": RUN})
            ).status_code == 409
    got = (await client.get("/api/schedules/nightly")).json()
    assert got["nextScheduleTime"] == body["nextScheduleTime"]
    patched = (await client.patch("/api/schedules/nightly", json={"intervalSeconds": 30})).json()
    assert patched["cron"] is None and patched["intervalSeconds"] == 30
    suspended = (await client.patch("/api/schedules/nightly", json={"suspend": True})).json()
    assert suspended["suspend"] is True and suspended["nextScheduleTime"] is None
    resumed = (await client.patch("/api/schedules/nightly", json={"suspend": False})).json()
    assert resumed["nextScheduleTime"] is not None
    assert [s["name"] for s in (await client.get("/api/schedules")).json()["items"]] == ["nightly"]
    assert (await client.get("/api/schedules/nightly/runs")).json() == []
    assert (await client.delete("/api/schedules/nightly")).status_code == 204
    for call in (client.get("/api/schedules/nightly"), client.delete("/api/schedules/nightly"),
                 client.get("/api/schedules/nightly/runs"), client.patch("/api/schedules/nightly", json={})):
        assert (await call).status_code == 404


async def test_bad_bodies_are_4xx_naming_the_field(client: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"name": "a", "cron": "61 * * * *", "run": RUN}, 422, "cron"),
        ({"name": "a", "cron": "* * *", "run": RUN}, 422, "cron"),
        ({"name": "a", "cron": "* * * * *", "timezone": "Mars/Olympus", "run": RUN}, 422, "timezone"),
        ({"name": "a", "run": RUN}, 422, "cron"),
        ({"name": "a", "cron": "* * * * *", "intervalSeconds": 5, "run": RUN}, 422, "cron"),
        ({"name": "a", "intervalSeconds": 0, "run": RUN}, 422, "intervalSeconds"),
        ({"name": "a", "intervalSeconds": 5}, 422, "run"),
        ({"name": "Bad_Name", "intervalSeconds": 5, "run": RUN}, 422, "name"),
        ({"name": "a" * 64, "intervalSeconds": 5, "run": RUN}, 422, "name"),
        ({"name": "a", "intervalSeconds": 5, "run": RUN, "concurrencyPolicy": "Sometimes"}, 422, "concurrencyPolicy"),
        ({"name": "a", "intervalSeconds": 5, "run": RUN, "startingDeadlineSeconds": -1}, 422,
         "startingDeadlineSeconds"),
        ({"name": "a", "intervalSeconds": 5, "run": {**RUN, "tools": ["nosuch"]}}, 422, "run.tools[0]"),
        ({"name": "a", "intervalSeconds": 5, "run": {**RUN, "agent": "nobody"}}, 404, "run.agent"),
        ({"name": "a", "intervalSeconds": 5, "run": {**RUN, "model": "nosuch/x"}}, 422, ""),
        ({"name": "a", "intervalSeconds": 5, "run": {**RUN, "delaySeconds": 5}}, 422, "run.delaySeconds"),
        ({"name": "a", "intervalSeconds": 5, "run": {"input": "no budgets"}}, 422, "run.tokenBudget"),
        ({"name": "a", "intervalSeconds": 5, "run": {**RUN, "input": "nul \x00 inside"}}, 422, "run"),
    ]
    for body, status, field in cases:
        r = await client.post("/api/schedules", json=body)
        assert r.status_code == status, (body, r.text)
        if field:
            named = problems(r)
            assert any(f == field or f.startswith(field) for f in named) or field in r.json()["error"], (body, r.text)
    assert (await client.get("/api/schedules")).json()["items"] == []
    await client.post("/api/schedules", json={"name": "ok", "intervalSeconds": 5, "run": RUN})
    r = await client.patch("/api/schedules/ok", json={"cron": "bad"})
    assert r.status_code == 422 and "cron" in problems(r)
    r = await client.patch("/api/schedules/ok", json={"run": {**RUN, "tools": ["nosuch"]}})
    assert r.status_code == 422 and "run.tools[0]" in problems(r)


async def test_a_due_tick_creates_one_run_with_its_schedule_and_time(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await client.post("/api/schedules", json={"name": "every", "intervalSeconds": 3600, "run": RUN})
    await due_now(db, "every")
    ticker = Ticker(store, "t1", "claude-sonnet-4-5")
    other = Ticker(store, "t2", "claude-sonnet-4-5")
    ticks = [*await ticker.once(), *await other.once(), *await ticker.once()]
    assert [t.outcome for t in ticks] == ["created"]
    runs = (await client.get("/api/schedules/every/runs")).json()
    assert len(runs) == 1 and runs[0]["scheduleName"] == "every" and runs[0]["input"] == "report"
    tick = datetime.datetime.fromisoformat(runs[0]["scheduledTime"])
    assert tick == ticks[0].scheduled_time
    got = (await client.get(f"/api/runs/{runs[0]['id']}")).json()
    assert got["scheduleName"] == "every" and got["scheduledTime"] == runs[0]["scheduledTime"]
    view = (await client.get("/api/schedules/every")).json()
    assert datetime.datetime.fromisoformat(view["lastScheduleTime"]) == tick and view["active"] == 1
    assert datetime.datetime.fromisoformat(view["nextScheduleTime"]) > tick
    # The same tick again (a worker that crashed after its commit and looks again) inserts nothing.
    await db.execute("UPDATE schedule SET next_due_at = %s WHERE name = 'every'", (tick,))
    again = await ticker.once()
    assert [t.outcome for t in again] == ["taken"]
    assert len((await client.get("/api/schedules/every/runs")).json()) == 1


async def test_forbid_skips_and_replace_cancels(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    ticker = Ticker(store, "t1", "claude-sonnet-4-5")
    for name, policy in (("forbid", "Forbid"), ("replace", "Replace")):
        await client.post("/api/schedules", json={"name": name, "intervalSeconds": 3600, "run": RUN,
                                                  "concurrencyPolicy": policy})
        await due_now(db, name)
        assert [t.outcome for t in await ticker.once()] == ["created"]
        await second_tick_due(db, name)
        await db.execute("UPDATE schedule SET starting_deadline_seconds = 100000 WHERE name = %s", (name,))
        second = await ticker.once()
        first_run = (await client.get(f"/api/schedules/{name}/runs")).json()[-1]
        if policy == "Forbid":
            assert [t.outcome for t in second] == ["skipped"]
            assert len((await client.get(f"/api/schedules/{name}/runs")).json()) == 1
        else:
            assert [t.outcome for t in second] == ["created"] and second[0].replaced == (
                uuid.UUID(first_run["id"]),)
            runs = (await client.get(f"/api/schedules/{name}/runs")).json()
            assert len(runs) == 2
            old = await store.get(uuid.UUID(first_run["id"]))
            assert old is not None and old.status is RunStatus.CANCELLED and old.cancelled_by == "schedule:replace"


async def test_replace_cancels_the_run_before_only_in_the_commit_that_makes_the_next(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """A pass that dies after deciding to replace (a worker killed) leaves the run before as it was: never
    cancelled with no run after it. (A statement that fails fails the tick alone, its savepoint undone: the
    test below.)"""
    ticker = Ticker(store, "t1", "claude-sonnet-4-5")
    await client.post("/api/schedules", json={"name": "swap", "intervalSeconds": 3600, "run": RUN,
                                              "concurrencyPolicy": "Replace", "startingDeadlineSeconds": 100000})
    await due_now(db, "swap")
    assert [t.outcome for t in await ticker.once()] == ["created"]
    [first] = (await client.get("/api/schedules/swap/runs")).json()
    await second_tick_due(db, "swap")

    async def dies(*_: Any) -> Any:
        raise SimulatedCrash  # the worker dies while planning the next run

    with pytest.raises(SimulatedCrash):
        await store.tick(dies)
    before = await store.get(uuid.UUID(first["id"]))
    assert before is not None and before.status is RunStatus.QUEUED and not before.cancel_requested
    second = await ticker.once()
    assert [t.outcome for t in second] == ["created"] and second[0].replaced == (uuid.UUID(first["id"]),)
    before = await store.get(uuid.UUID(first["id"]))
    assert before is not None and before.status is RunStatus.CANCELLED


async def test_suspended_schedules_do_not_tick_and_a_deleted_agent_fails_the_tick(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    ticker = Ticker(store, "t1", "claude-sonnet-4-5")
    await client.post("/api/schedules", json={"name": "quiet", "intervalSeconds": 1, "run": RUN, "suspend": True})
    assert await ticker.once() == [] and await store.next_due_in() is None
    await client.post("/api/agents", json={"name": "helper", "tokenBudget": 100, "timeoutSeconds": 60})
    await client.post("/api/schedules", json={"name": "agented", "intervalSeconds": 3600,
                                              "run": {"input": "x", "agent": "helper"}})
    await client.delete("/api/agents/helper")
    await due_now(db, "agented")
    ticks = await ticker.once()
    assert [t.outcome for t in ticks] == ["failed"]
    view = (await client.get("/api/schedules/agented")).json()
    assert "helper" in view["lastError"] and view["nextScheduleTime"] is not None


async def test_after_an_outage_one_catch_up_run_and_the_rest_counted_missed(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    from agentrun.worker.obs.metrics import Metrics

    metrics = Metrics()
    ticker = Ticker(store, "t1", "claude-sonnet-4-5", metrics)
    await client.post("/api/schedules", json={"name": "sec", "intervalSeconds": 1, "run": RUN})
    await client.post("/api/schedules", json={"name": "strict", "intervalSeconds": 1, "run": RUN,
                                              "startingDeadlineSeconds": 0})
    # Every worker down for five minutes: the first due tick was 300 s ago.
    await db.execute("UPDATE schedule SET next_due_at = date_trunc('second', now()) - interval '300 seconds', "
                     "anchor = date_trunc('second', now()) - interval '301 seconds'")
    await db.execute("UPDATE schedule SET next_due_at = next_due_at - interval '2 seconds', "
                     "anchor = anchor - interval '2 seconds' WHERE name = 'strict'")
    ticks = {t.schedule: t for t in await ticker.once()}
    assert ticks["sec"].outcome == "created" and ticks["sec"].missed >= 299
    assert len((await client.get("/api/schedules/sec/runs")).json()) == 1
    view = (await client.get("/api/schedules/sec")).json()
    assert view["missed"] == ticks["sec"].missed
    assert datetime.datetime.fromisoformat(view["nextScheduleTime"]) > ticks["sec"].scheduled_time  # type: ignore[operator]
    # startingDeadlineSeconds 0: the latest tick is late by the pass's own delay, or on time to the second.
    assert ticks["strict"].outcome in ("created", "missed")
    missed = ticks["sec"].missed + ticks["strict"].missed
    assert metrics.registry.get_sample_value("agentrun_schedule_missed_total") == missed
    created = sum(t.outcome == "created" for t in ticks.values())
    assert metrics.registry.get_sample_value("agentrun_schedule_runs_total") == created


async def test_an_agentschedules_schedule_is_not_changed_through_rest(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await client.post("/api/schedules", json={"name": "owned", "intervalSeconds": 60, "run": RUN})
    await db.execute("UPDATE schedule SET k8s_namespace = 'team', k8s_name = 'owned' WHERE name = 'owned'")
    for r in (await client.patch("/api/schedules/owned", json={"suspend": True}),
              await client.delete("/api/schedules/owned")):
        assert r.status_code == 409 and "team/owned" in r.json()["error"]
    for bad in ("%00", "a%2F..", "UPPER", "x" * 64):
        assert (await client.get(f"/api/schedules/{bad}")).status_code in (404, 422)


# -- one schedule that fails does not stall the others (issue 44, item 8) -------------------------------


async def test_a_schedule_whose_time_zone_is_gone_stops_with_its_reason_and_the_others_tick(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """A time zone tzdata has since removed: its ticks cannot be computed. It was the oldest due schedule of
    every pass and its error rolled back the whole pass: no schedule ticked again. Now it stops (no next
    tick, its `lastError` says why and how to start it again), is not taken again, and the others tick."""
    ticker = Ticker(store, "t1", "claude-sonnet-4-5")
    await client.post("/api/schedules", json={"name": "gone", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
                                              "run": RUN, "startingDeadlineSeconds": 100000})
    await client.post("/api/schedules", json={"name": "fine", "intervalSeconds": 3600, "run": RUN,
                                              "startingDeadlineSeconds": 100000})
    await db.execute("UPDATE schedule SET timezone = 'Europe/Atlantis' WHERE name = 'gone'")  # tzdata dropped it
    await db.execute("UPDATE schedule SET next_due_at = date_trunc('second', now()) - interval '1 minute' "
                     "WHERE name = 'gone'")
    await due_now(db, "fine")
    ticks = {t.schedule: t for t in await ticker.once()}
    assert ticks["fine"].outcome == "created"
    assert ticks["gone"].outcome == "stopped" and "Europe/Atlantis" in (ticks["gone"].error or "")
    view = (await client.get("/api/schedules/gone")).json()
    assert view["nextScheduleTime"] is None and view["suspend"] is False
    assert "Europe/Atlantis" in view["lastError"] and "PATCH" in view["lastError"]
    assert (await client.get("/api/schedules/gone/runs")).json() == []
    # Not taken again: the next pass takes the others' ticks, then finds nothing to do.
    await second_tick_due(db, "fine")
    assert [(t.schedule, t.outcome) for t in await ticker.once()] == [("fine", "created")]
    assert await ticker.once() == []
    # Its time zone set right, it ticks again from the first tick after now.
    r = await client.patch("/api/schedules/gone", json={"timezone": "Europe/Berlin"})
    assert r.status_code == 200, r.text
    assert r.json()["nextScheduleTime"] is not None and r.json()["lastError"] is None


async def test_a_tick_that_fails_unexpectedly_fails_alone_and_its_schedule_goes_on(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """A tick whose planning raises something unforeseen, and one whose run the database refuses (which
    aborts the transaction the pass shares): each fails alone, says why in `lastError`, and its schedule
    moves on to its next tick; the other schedules of the pass get their runs."""
    ticker = Ticker(store, "t1", "claude-sonnet-4-5")
    for name in ("breaks", "refused", "fine"):
        await client.post("/api/schedules", json={"name": name, "intervalSeconds": 3600, "run": RUN})
    await db.execute("UPDATE schedule SET next_due_at = date_trunc('second', now()) - "
                     "CASE name WHEN 'breaks' THEN interval '2 seconds' WHEN 'refused' THEN interval '1 second' "
                     "ELSE interval '0 seconds' END")

    async def plan(s: Any, tick: datetime.datetime) -> Any:
        if s.name == "breaks":
            raise KeyError("a template field the planner did not expect")
        new = await ticker.plan(s, tick)
        return dataclasses.replace(new, token_budget=-1) if s.name == "refused" else new  # CHECK (> 0)

    ticks = {t.schedule: t for t in await store.tick(plan)}
    assert {n: t.outcome for n, t in ticks.items()} == {"breaks": "failed", "refused": "failed", "fine": "created"}
    for name, why in (("breaks", "a template field the planner did not expect"), ("refused", "token_budget")):
        view = (await client.get(f"/api/schedules/{name}")).json()
        assert why in view["lastError"] and view["nextScheduleTime"] is not None, view
        assert datetime.datetime.fromisoformat(view["nextScheduleTime"]) > ticks[name].scheduled_time  # type: ignore[operator]
        assert (await client.get(f"/api/schedules/{name}/runs")).json() == []
        assert [t["outcome"] for t in await store.schedule_ticks(name)] == ["failed"]
    assert len((await client.get("/api/schedules/fine/runs")).json()) == 1
    assert await ticker.once() == []  # nothing is due again: no failing tick is retried hot
