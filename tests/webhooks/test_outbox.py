"""The outbox and its sender in this process over real PostgreSQL, with a real receiver on 127.0.0.1:
the trigger writes a delivery with the status change and only then; a receiver down through the backoff's
steps and past its cap gets every delivery once it is back, each signature checked by an independent
verifier; the URL policy at send time; redirects and slow receivers are failed attempts, retried; two
senders never send one attempt twice."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp import web

from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.runtime.webhooks import WebhookSender
from agentrun.worker.serve import webhook_sender
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.store.retention import prune
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.waiting import eventually
from tests.webhooks.receiver import SECRET, SECRETS_FILE, Received, Receiver, verify

# Failed attempts while the receiver is down: the first, one after each step of the tests' backoff (0.3 s,
# 0.5 s), and two after waits at its cap (1 s).
FAILURES = 5


@pytest.fixture
def secrets_file(tmp_path: Path) -> Path:
    path = tmp_path / "webhook-secrets.json"
    path.write_text(SECRETS_FILE)
    return path


def sender_of(store: RunStore, secrets_file: Path, name: str = "sender-A", **settings: Any) -> WebhookSender:
    """The sender the worker builds (serve.webhook_sender), with the tests' small delays."""
    fields: dict[str, Any] = {"webhook_secrets_file": str(secrets_file), "webhook_allow": "127.0.0.1",
                              "webhook_backoff": (0.3, 0.5), "webhook_backoff_max": 1.0, "webhook_timeout": 2.0,
                              "webhook_poll_interval": 0.5, **settings}
    return webhook_sender(WorkerSettings(database_url="unused", worker_id=name, **fields), store,
                          Metrics(cache_seconds=0))


@dataclasses.dataclass
class Running:
    sender: WebhookSender
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def running(sender: WebhookSender) -> AsyncIterator[Running]:
    task = asyncio.create_task(sender.run())
    try:
        yield Running(sender, task)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def all_of(store: RunStore, runs: list[Any]) -> list[Any]:
    """Every delivery of `runs`."""
    return [d for run in runs for d in await store.webhooks_of(run.id)]


def hook(url: str, events: list[str] | None = None) -> dict[str, Any]:
    return {"url": url, "events": events or ["finished"], "secretRef": "hooks"}


async def deliveries(db: psycopg.AsyncConnection[Any], run_id: uuid.UUID | None = None) -> list[tuple[Any, ...]]:
    cur = await db.execute(
        "SELECT run_id, event, run_status, state FROM run_webhook WHERE %(id)s::uuid IS NULL OR run_id = %(id)s "
        "ORDER BY created_at", {"id": run_id})
    return await cur.fetchall()


# -- the trigger -----------------------------------------------------------------------------------------


async def test_a_delivery_is_written_with_the_status_change_it_asks_for_and_only_then(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    finished, _ = await store.create(new_run(webhook=hook("http://127.0.0.1:9/h")))
    waits, _ = await store.create(new_run(webhook=hook("http://127.0.0.1:9/h", ["waiting"])))
    both, _ = await store.create(new_run(webhook=hook("http://127.0.0.1:9/h", ["finished", "waiting"])))
    none, _ = await store.create(new_run())
    assert await deliveries(db) == []  # a new run (QUEUED) owes nothing
    for run in (finished, waits, none):
        await store.cancel(run.id)
    assert await deliveries(db) == [(finished.id, "finished", "CANCELLED", "PENDING")]
    # Every path changes the status with an UPDATE of run: parked WAITING, then ended by a deadline.
    await db.execute("UPDATE run SET status = 'WAITING' WHERE id = %s", (both.id,))
    await db.execute("UPDATE run SET status = 'WAITING' WHERE id = %s", (both.id,))  # no change: nothing
    await db.execute("UPDATE run SET status = 'TIMED_OUT', finished_at = now() WHERE id = %s", (both.id,))
    assert [d[1:3] for d in await deliveries(db, both.id)] == [("waiting", "WAITING"), ("finished", "TIMED_OUT")]
    # In the status change's transaction: rolled back with it.
    other, _ = await store.create(new_run(webhook=hook("http://127.0.0.1:9/h")))
    async with db.transaction(force_rollback=True):
        await db.execute("UPDATE run SET status = 'CANCELLED' WHERE id = %s", (other.id,))
        assert len(await deliveries(db, other.id)) == 1
    assert await deliveries(db, other.id) == []


async def test_pruning_a_run_counts_and_deletes_its_deliveries_and_attempts(
    store: RunStore, db: psycopg.AsyncConnection[Any], secrets_file: Path
) -> None:
    run, _ = await store.create(new_run(webhook=hook("http://127.0.0.1:9/h")))
    await store.cancel(run.id)
    [delivery] = await store.claim_webhooks("w", 30, 10)
    await store.record_webhook_attempt(delivery, "w", datetime.datetime.now(datetime.UTC), status_code=500,
                                       latency_ms=3, error="answered 500", delivered=False, retry_in=1,
                                       give_up_seconds=3600)
    await db.execute("UPDATE run SET finished_at = now() - interval '2 days' WHERE id = %s", (run.id,))
    would = await prune(db, datetime.timedelta(days=1), dry_run=True)
    assert (would.rows["run_webhook"], would.rows["run_webhook_attempt"], would.runs) == (1, 1, 1)
    done = await prune(db, datetime.timedelta(days=1), rest=0)
    assert (done.rows["run_webhook"], done.rows["run_webhook_attempt"], done.runs) == (1, 1, 1)
    assert await deliveries(db) == []


# -- the sender ------------------------------------------------------------------------------------------


async def test_a_receiver_down_past_the_backoff_cap_gets_every_delivery_once_it_is_back(
    store: RunStore, db: psycopg.AsyncConnection[Any], secrets_file: Path
) -> None:
    """The outage lasts until every delivery has failed FAILURES times: its first attempt, one after each of
    the backoff's steps and two after waits at its cap. (It was a fixed 10 s, which only added more attempts
    at the cap, and waited for two failures only.)"""
    receiver = Receiver(free_port())  # nothing listens on its port yet: down
    runs = [(await store.create(new_run(f"run {i}", webhook=hook(receiver.url))))[0] for i in range(5)]
    for run in runs:
        await store.cancel(run.id)
    async with running(sender_of(store, secrets_file)):
        async def failed_past_the_cap() -> bool:
            return all(len(d.history) >= FAILURES for d in await all_of(store, runs))

        await eventually(failed_past_the_cap, 30, f"{FAILURES} failed attempts of every delivery while it is down")
        async with receiver:
            async def all_delivered() -> bool:
                return all(d.state == "DELIVERED" for d in await all_of(store, runs))

            await eventually(all_delivered, 30, "every delivery to be DELIVERED")
    by_id: dict[str, list[Received]] = {}
    for got in receiver.received:
        by_id.setdefault(got.id, []).append(got)
    expected = {f"msg_{d.id.hex}": next(r for r in runs if r.id == d.run_id) for d in await all_of(store, runs)}
    assert set(by_id) == set(expected)
    for msg_id, got_list in by_id.items():
        for got in got_list:
            assert verify(SECRET, got.headers, got.body), "the signature must verify independently"
            body = got.json
            assert body["id"] == str(expected[msg_id].id) and body["status"] == "CANCELLED"
            assert "output" in body and body["webhook"] == hook(receiver.url)
            assert got.headers["agentrun-event"] == "finished"
    for run in runs:
        [d] = await store.webhooks_of(run.id)
        assert d.history[0].status_code is None and d.history[0].error
        assert all(a.status_code is None and a.error for a in d.history[:FAILURES])
        assert d.history[-1].status_code == 204 and d.history[-1].error is None
        assert [a.attempt for a in d.history] == list(range(1, len(d.history) + 1))


async def test_a_name_that_resolves_to_the_metadata_address_is_refused_at_send_time(
    store: RunStore, secrets_file: Path
) -> None:
    sender = sender_of(store, secrets_file, webhook_allow="")
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["169.254.169.254"]

    sender.resolver = resolver
    run, _ = await store.create(new_run(webhook=hook("http://metadata.example.test/latest/")))
    await store.cancel(run.id)
    async with running(sender):
        async def refused() -> bool:
            [d] = await store.webhooks_of(run.id)
            return len(d.history) >= 1
        await eventually(refused, 20, "the attempt to be refused")
    [d] = await store.webhooks_of(run.id)
    assert asked and asked[0] == "metadata.example.test"
    assert d.history[0].status_code is None and "169.254.169.254" in (d.history[0].error or "")
    assert d.state == "PENDING"  # retried: the name may resolve elsewhere later, until the give-up time


async def test_a_redirect_and_a_slow_receiver_are_failed_attempts_retried(
    store: RunStore, secrets_file: Path
) -> None:
    calls: dict[str, int] = {}

    async def answer(got: Received) -> web.StreamResponse:
        n = calls[got.id] = calls.get(got.id, 0) + 1
        kind = got.json["input"]
        if n == 1 and kind == "redirect":
            raise web.HTTPFound("http://169.254.169.254/")
        if n == 1 and kind == "slow":
            await asyncio.sleep(5)  # past the 1 s timeout
        return web.Response(status=200)

    async with Receiver(free_port(), answer) as receiver:
        redirect, _ = await store.create(new_run("redirect", webhook=hook(receiver.url)))
        slow, _ = await store.create(new_run("slow", webhook=hook(receiver.url)))
        await store.cancel(redirect.id)
        await store.cancel(slow.id)
        async with running(sender_of(store, secrets_file, webhook_timeout=1.0)):
            async def delivered() -> bool:
                return all(d.state == "DELIVERED" for d in await all_of(store, [redirect, slow]))
            await eventually(delivered, 30, "both delivered on their second attempt")
    [r] = await store.webhooks_of(redirect.id)
    [s] = await store.webhooks_of(slow.id)
    assert r.history[0].status_code == 302 and "redirects are not followed" in (r.history[0].error or "")
    assert s.history[0].status_code is None and "no answer within 1s" in (s.history[0].error or "")
    assert [a.status_code for a in (r.history[-1], s.history[-1])] == [200, 200]
    assert len(receiver.received) == 4  # two attempts each; the redirect's target was never asked


async def test_two_senders_never_send_one_attempt_twice(store: RunStore, secrets_file: Path) -> None:
    async with Receiver(free_port()) as receiver:
        runs = [(await store.create(new_run(f"r{i}", webhook=hook(receiver.url))))[0] for i in range(30)]
        for run in runs:
            await store.cancel(run.id)
        async with running(sender_of(store, secrets_file, "sender-A")):
            async with running(sender_of(store, secrets_file, "sender-B")):
                async def delivered() -> bool:
                    return len({g.id for g in receiver.received}) == len(runs)
                await eventually(delivered, 30, "every delivery")
    ids = [g.id for g in receiver.received]
    assert len(ids) == len(set(ids)) == len(runs)


async def test_an_unknown_secret_is_a_failed_attempt_with_the_reason(store: RunStore, secrets_file: Path) -> None:
    run, _ = await store.create(new_run(webhook={**hook("http://127.0.0.1:9/h"), "secretRef": "gone"}))
    await store.cancel(run.id)
    async with running(sender_of(store, secrets_file)):
        async def tried() -> bool:
            return bool((await store.webhooks_of(run.id))[0].history)
        await eventually(tried, 20, "an attempt")
    [d] = await store.webhooks_of(run.id)
    assert "no webhook secret named 'gone'" in (d.history[0].error or "")


async def test_a_delivery_past_its_give_up_time_ends_failed_and_is_not_tried_again(
    store: RunStore, secrets_file: Path
) -> None:
    async def fail(_: Received) -> web.StreamResponse:
        return web.Response(status=500)

    async with Receiver(free_port(), fail) as receiver:
        run, _ = await store.create(new_run(webhook=hook(receiver.url)))
        await store.cancel(run.id)
        async with running(sender_of(store, secrets_file, webhook_give_up=1.5)):
            async def given_up() -> bool:
                return [d.state for d in await store.webhooks_of(run.id)] == ["FAILED"]
            await eventually(given_up, 30, "the delivery to be given up")
            sent = len(receiver.received)
            [d] = await store.webhooks_of(run.id)
        # Never claimed again: nothing is pending, and a claim finds nothing.
        assert await store.next_webhook_in() is None and await store.claim_webhooks("w", 30, 10) == []
    assert d.done_at is not None and d.last_error == "answered 500"
    assert all(a.status_code == 500 for a in d.history) and len(d.history) == sent >= 2


# -- an attempt that fails before or while sending (issue 44, item 7) -----------------------------------


async def test_an_attempt_that_raises_is_a_failed_attempt_with_its_reason_and_ends_at_the_give_up_time(
    store: RunStore, secrets_file: Path
) -> None:
    """A body that cannot be rendered (a bug in rendering, a run the renderer chokes on) and a URL the
    policy passed but the HTTP client cannot parse (a host IDNA 2008 refuses, stored before the API
    checked for it): each attempt is recorded with why it failed, retried, and given up at the give-up time,
    never claimed again. (Both raised out of the attempt: nothing was recorded, and the delivery came back
    after every lease, past its give-up time, forever.)"""
    sender = sender_of(store, secrets_file, webhook_give_up=1.5)

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    sender.resolver = resolver
    render = sender.render

    def failing_render(run: Any) -> bytes:
        if run.input == "unrenderable":
            raise RuntimeError("the renderer broke")
        return render(run)

    sender.render = failing_render
    async with Receiver(free_port()) as receiver:
        unrenderable, _ = await store.create(new_run("unrenderable", webhook=hook(receiver.url)))
        unparsable, _ = await store.create(new_run("unparsable", webhook=hook("http://ａ.example/h")))
        for run in (unrenderable, unparsable):
            await store.cancel(run.id)
        async with running(sender):
            async def given_up() -> bool:
                return all(d.state == "FAILED" for d in await all_of(store, [unrenderable, unparsable]))
            await eventually(given_up, 30, "both deliveries given up")
        assert receiver.received == []
    assert await store.next_webhook_in() is None and await store.claim_webhooks("w", 30, 10) == []
    [r] = await store.webhooks_of(unrenderable.id)
    [p] = await store.webhooks_of(unparsable.id)
    for d in (r, p):
        assert d.history and [a.attempt for a in d.history] == list(range(1, len(d.history) + 1))
        assert all(a.status_code is None and a.error for a in d.history)
        assert d.attempts == len(d.history) and d.done_at is not None and d.last_error == d.history[-1].error
    assert "RuntimeError: the renderer broke" in (r.last_error or "")
    assert "IDNA" in (p.last_error or "") and "ａ.example" in (p.last_error or "")


async def test_a_delivery_past_its_give_up_time_whose_last_attempt_was_never_recorded_ends_failed_unsent(
    store: RunStore, db: psycopg.AsyncConnection[Any], secrets_file: Path
) -> None:
    """A sender that died mid-attempt (or an attempt that was never recorded) leaves the delivery due again
    after its lease; past its give-up time it is ended FAILED, not sent again."""
    async with Receiver(free_port()) as receiver:
        late, _ = await store.create(new_run("late", webhook=hook(receiver.url)))
        fresh, _ = await store.create(new_run("fresh", webhook=hook(receiver.url)))
        for run in (late, fresh):
            await store.cancel(run.id)
        # Claimed three times, never recorded, its last lease lapsed a second ago, made two days ago.
        await db.execute("UPDATE run_webhook SET attempts = 3, claimed_by = 'gone', next_at = now() - interval '1 s', "
                         "created_at = now() - interval '2 days' WHERE run_id = %s", (late.id,))
        async with running(sender_of(store, secrets_file)):
            async def settled() -> bool:
                return [d.state for d in await all_of(store, [late, fresh])] == ["FAILED", "DELIVERED"]
            await eventually(settled, 30, "the late delivery given up, the fresh one delivered")
        assert [g.json["input"] for g in receiver.received] == ["fresh"]
    [d] = await store.webhooks_of(late.id)
    assert d.history == () and d.done_at is not None and "give-up time" in (d.last_error or "")
