"""Live events held back only by transactions that write event rows (issue 24, item 5): an idle transaction
elsewhere (another database, ours without event rows, a prepared one) delays no event; idle streams cost
the change feed's query a second at most, however many; a slow reader of model text still gets its steps;
and a writer that started first and commits last leaves no gap and no duplicate for a resumed stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from fastapi import FastAPI
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agentrun.worker.cli.client import ServerEvent, SseParser
from agentrun.worker.store import RunStore
from agentrun.worker.store.channels import DELTA_CHANNEL
from tests.support.builders import new_run
from tests.support.serving import serving
from tests.support.sse import Stream, assert_resumed_whole, streaming
from tests.support.waiting import eventually

DEADLINE = 20.0
"""Generous: an event arrives in milliseconds here; on main it never arrives while the holder is open."""


@contextlib.asynccontextmanager
async def other_database(postgres_url: str) -> AsyncIterator[str]:
    name = f"agentrun_other_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(postgres_url, dbname=name)
    finally:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
            await admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.asynccontextmanager
async def open_transaction(url: str, *statements: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A session that runs `statements` in a transaction and then sits idle in it until the block ends."""
    conn = await psycopg.AsyncConnection.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement.encode())
        yield conn
    finally:
        with contextlib.suppress(psycopg.Error):
            await conn.rollback()
        await conn.close()


async def idle_in_transaction(db: psycopg.AsyncConnection[Any], pid: int) -> bool:
    cur = await db.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,))
    row = await cur.fetchone()
    return row is not None and row[0] == "idle in transaction"


async def add_step(db: psycopg.AsyncConnection[Any], run_id: uuid.UUID, seq: int, status: str = "DONE") -> None:
    await db.execute(
        "INSERT INTO run_step (run_id, seq, kind, status) VALUES (%s, %s, 'MODEL', %s)", (run_id, seq, status)
    )


def has_step(seq: int) -> Any:
    return lambda s: any(st["seq"] == seq for st in s.of("step"))


async def streams_events_while(app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any],
                               holder: psycopg.AsyncConnection[Any]) -> None:
    """A step and the run's end reach a stream while `holder` sits idle in its transaction."""
    run, _ = await store.create(new_run())
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        async with streaming(http, f"/api/runs/{run.id}/events") as stream:
            await stream.until(lambda s: bool(s.of("run")), timeout=DEADLINE, what="the run")
            await add_step(db, run.id, 1)
            await stream.until(has_step(1), timeout=DEADLINE, what="the step, with the other transaction open")
            await store.cancel(run.id)
            await stream.until(lambda s: s.ended, timeout=DEADLINE, what="the end, with the other transaction open")
    assert await idle_in_transaction(db, holder.info.backend_pid), "the holder's transaction ended meanwhile"
    assert stream.of("end") == [{"status": "CANCELLED"}]


async def test_an_open_transaction_in_another_database_delays_no_event(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any], postgres_url: str
) -> None:
    # A report in another database of the same server: it wrote a row (so it has a transaction id), and idles.
    async with other_database(postgres_url) as other, \
            open_transaction(other, "CREATE TABLE report (x int)", "INSERT INTO report VALUES (1)") as holder:
        await streams_events_while(app, store, db, holder)


@pytest.mark.parametrize("statements", [
    pytest.param(["SELECT pg_current_xact_id()"], id="wrote nothing"),
    pytest.param(["INSERT INTO report VALUES (1)"], id="wrote an unrelated table"),
    pytest.param(["SELECT count(*) FROM run", "SELECT pg_current_xact_id()"], id="read the runs"),
])
async def test_an_open_transaction_in_our_database_that_writes_no_event_row_delays_no_event(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str, statements: list[str]
) -> None:
    await db.execute("CREATE TABLE report (x int)")
    async with open_transaction(database_url, *statements) as holder:
        await streams_events_while(app, store, db, holder)


async def prepared_transactions_allowed(db: psycopg.AsyncConnection[Any]) -> bool:
    cur = await db.execute("SELECT current_setting('max_prepared_transactions')::int")
    row = await cur.fetchone()
    return row is not None and row[0] > 0


async def test_a_forgotten_prepared_transaction_that_wrote_no_event_row_delays_no_event(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    if not await prepared_transactions_allowed(db):
        pytest.skip("the test server has max_prepared_transactions = 0 (set it above 0 to run this test)")
    await db.execute("CREATE TABLE report (x int)")
    gid = f"forgotten-{uuid.uuid4().hex[:8]}"
    async with open_transaction(database_url, "INSERT INTO report VALUES (1)", f"PREPARE TRANSACTION '{gid}'"):
        pass  # the session is gone; the prepared transaction stays, as one forgotten by a crashed coordinator
    try:
        run, _ = await store.create(new_run())
        async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
            async with streaming(http, f"/api/runs/{run.id}/events") as stream:
                await stream.until(lambda s: bool(s.of("run")), timeout=DEADLINE, what="the run")
                await add_step(db, run.id, 1)
                await stream.until(has_step(1), timeout=DEADLINE, what="the step, with the prepared transaction there")
        cur = await db.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,))
        assert (await cur.fetchone()) == (1,)
    finally:
        await db.execute(f"ROLLBACK PREPARED '{gid}'".encode())


def pool_requests(store: RunStore) -> int:
    return int(store.pool.get_stats().get("requests_num", 0))


async def test_idle_streams_cost_about_one_query_a_second_however_many_there_are(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    """The streams wait on a change held back by a transaction that did write an event row (another run's):
    the one case where they must wait. Every query the API makes goes through the store's pool; count them."""
    other, _ = await store.create(new_run())
    window = 3.0
    async with open_transaction(database_url, f"UPDATE run SET cancel_requested = true WHERE id = '{other.id}'"):
        run, _ = await store.create(new_run())  # its row commits behind the open writer: held back
        limits = httpx.Limits(max_connections=80, max_keepalive_connections=0)
        async with serving(app) as url, httpx.AsyncClient(base_url=url, limits=limits) as http:
            streams = [Stream(http, f"/api/runs/{run.id}/events").start()]
            try:
                counts = []
                for total in (1, 50):
                    streams += [Stream(http, f"/api/runs/{run.id}/events").start() for _ in range(total - len(streams))]

                    async def subscribed(total: int = total) -> bool:
                        return len(app.state.events.subscribers.get(run.id, ())) == total

                    await eventually(subscribed, timeout=DEADLINE, what=f"{total} streams")
                    before, started = pool_requests(store), time.monotonic()
                    await asyncio.sleep(window)  # a measuring window, not a wait for a condition
                    counts.append((pool_requests(store) - before) / (time.monotonic() - started))
                one, fifty = counts
                assert one <= 2.0, f"one idle stream: {one:.1f} queries a second"
                assert fifty <= 2.0 and fifty <= one + 1.0, f"fifty idle streams: {fifty:.1f} queries a second (one: {one:.1f})"
            finally:
                await asyncio.gather(*(s.close() for s in streams))


class SlowClient:
    """An ASGI client that takes each message only when asked: the server's `send` waits meanwhile, as it
    does for a client that reads a socket slowly."""

    def __init__(self, app: FastAPI, path: str) -> None:
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1)
        self.parser = SseParser()
        self.pending: list[ServerEvent] = []
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"agentrun.test"), (b"accept", b"text/event-stream")],
            "client": ("127.0.0.1", 50000), "server": ("agentrun.test", 80),
        }
        self.gone = asyncio.Event()
        self.task = asyncio.create_task(app(scope, self._receive, self._send))
        self._asked = False
        self.writes = 0
        """Writes of the body taken so far."""

    async def _receive(self) -> dict[str, Any]:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        await self.messages.put(message)

    async def next_event(self) -> ServerEvent:
        """The next event; a comment (keep-alive) counts as none."""
        while not self.pending:
            message = await asyncio.wait_for(self.messages.get(), DEADLINE)
            self.writes += bool(message.get("body"))
            for line in message.get("body", b"").decode().split("\n"):
                event = self.parser.feed(line)
                if event is not None:
                    self.pending.append(event)
        return self.pending.pop(0)

    async def close(self) -> None:
        self.gone.set()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


async def test_a_slow_reader_of_model_text_still_gets_its_step_and_run_events(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    run, _ = await store.create(new_run())
    client = SlowClient(app, f"/api/runs/{run.id}/events")
    stop = asyncio.Event()

    async def publish() -> None:  # model text, faster than the client reads it
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                payload = orjson.dumps({"run": str(run.id), "seq": 1, "text": f"word{n} " * 20}).decode()
                await conn.execute("SELECT pg_notify(%s, %s)", (DELTA_CHANNEL, payload))
                await asyncio.sleep(0.005)

    publisher = asyncio.create_task(publish())
    try:
        assert (await client.next_event()).event == "run"
        while (await client.next_event()).event != "delta":
            pass
        for _ in range(5):  # text piles up behind the slow client
            await asyncio.sleep(0.05)
            await client.next_event()

        async def within(limit: int, kind: str) -> list[str]:
            seen = []
            for _ in range(limit):
                await asyncio.sleep(0.05)
                event = await client.next_event()
                seen.append(event.event)
                if event.event == kind:
                    return seen
            raise AssertionError(f"no {kind} event in the next {limit} events: {seen}")

        await add_step(db, run.id, 1)
        await within(20, "step")
        await store.cancel(run.id)
        await within(20, "end")
    finally:
        stop.set()
        await publisher
        await client.close()


async def test_a_stream_behind_its_client_gathers_the_changes_into_one_write_every_event_once_in_order(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """Six commits while the client reads nothing: at most two writes wait on it (the one it has not taken
    and the one being handed over); everything after goes together in the next write, each row's latest
    change once, in order of position, nothing lost."""
    run, _ = await store.create(new_run())
    client = SlowClient(app, f"/api/runs/{run.id}/events")
    try:
        assert (await client.next_event()).event == "run"
        taken = client.writes
        for seq in range(1, 6):
            await add_step(db, run.id, seq, status="STARTED")
        await db.execute("UPDATE run_step SET status = 'DONE' WHERE run_id = %s", (run.id,))
        cur = await db.execute("SELECT max(event_xid::text::bigint) FROM run_step WHERE run_id = %s", (run.id,))
        last = (await cur.fetchone() or [0])[0]

        async def given_everything() -> bool:
            return all(sub.seen[0] >= last for sub in app.state.events.subscribers.get(run.id, ()))

        await eventually(given_everything, timeout=DEADLINE, what="the feed to give the stream every change")
        events = []
        while not events or events[-1].id != f"{last}.0.5":  # step 5's last change
            events.append(await client.next_event())
    finally:
        await client.close()
    ids = [tuple(int(p) for p in e.id.split(".")) for e in events]
    assert ids == sorted(set(ids)), f"out of order or twice: {ids}"
    latest = {orjson.loads(e.data)["seq"]: orjson.loads(e.data)["status"] for e in events if e.event == "step"}
    assert latest == dict.fromkeys(range(1, 6), "DONE"), latest
    assert client.writes - taken <= 3, f"{client.writes - taken} writes for six commits"


async def test_a_writer_that_starts_first_and_commits_last_leaves_no_gap_for_a_resumed_stream(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    """Two cases: the late writer wrote its event row first (the stream must wait for it), or it had a
    transaction id from an unrelated write before another writer committed, and wrote its event row after
    (the stream may go on; the late row must still come after what was sent)."""
    await db.execute("CREATE TABLE report (x int)")
    hub = app.state.events
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        for first in ("UPDATE run_step SET latency_ms = 111 WHERE run_id = %(run)s AND seq = 1",
                      "INSERT INTO report VALUES (1)"):
            run, _ = await store.create(new_run())
            await add_step(db, run.id, 1, "STARTED")
            await add_step(db, run.id, 2, "STARTED")
            path = f"/api/runs/{run.id}/events"
            async with streaming(http, path) as before:
                await before.until(has_step(2), timeout=DEADLINE, what="the stored steps")
                async with await psycopg.AsyncConnection.connect(database_url) as late:
                    await late.execute(first.encode(), {"run": run.id})
                    rounds = hub.rounds
                    await db.execute("UPDATE run_step SET latency_ms = 222 WHERE run_id = %s AND seq = 2", (run.id,))
                    if first.startswith("UPDATE run_step"):
                        # Held back: the late writer's step 1 may commit below it. The feed looks again
                        # every second meanwhile; after two rounds it has seen that commit, and held it.
                        async def two_more_rounds(rounds: int = rounds) -> bool:
                            return bool(hub.rounds >= rounds + 2)

                        await eventually(two_more_rounds, timeout=DEADLINE, what="the feed to read the commit")
                        assert not any(st["seq"] == 2 and st["latencyMs"] == 222 for st in before.of("step"))
                    else:  # the late writer holds nothing back yet: the change goes out
                        await before.until(lambda s: any(st["seq"] == 2 and st["latencyMs"] == 222
                                                         for st in s.of("step")), timeout=DEADLINE, what="step 2")
                    await late.execute("UPDATE run_step SET status = 'DONE', latency_ms = 111 "
                                       "WHERE run_id = %(run)s AND seq = 1", {"run": run.id})
                    await late.commit()
                resume_from = before.events[-1].id
            await db.execute("UPDATE run_step SET status = 'DONE' WHERE run_id = %s AND seq = 2", (run.id,))
            await store.cancel(run.id)
            async with streaming(http, path, last_event_id=resume_from) as after:
                await after.until(lambda s: s.ended, timeout=DEADLINE, what="the end")
            async with streaming(http, path) as whole:
                await whole.until(lambda s: s.ended, timeout=DEADLINE, what="the end")
            _, final = assert_resumed_whole(before, after, whole, first)
            assert final[1]["status"] == "DONE" and final[1]["latencyMs"] == 111 and final[2]["latencyMs"] == 222


async def test_a_client_that_keeps_reconnecting_under_concurrent_writers_misses_nothing_and_gets_nothing_twice(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    """Writers whose transactions overlap, start and end in every order, and one client that drops its
    stream after every few events and resumes with the last id it got."""
    run, _ = await store.create(new_run())
    seqs = range(1, 7)
    for seq in seqs:
        await add_step(db, run.id, seq, "STARTED")
    done = asyncio.Event()

    async def write(n: int) -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            for i in range(12):
                await conn.execute("UPDATE run_step SET latency_ms = coalesce(latency_ms, 0) + 1 "
                                   "WHERE run_id = %s AND seq = %s", (run.id, seqs[(n + i) % len(seqs)]))
                await asyncio.sleep(0.005 * ((n * 7 + i * 3) % 5))  # a transaction open for 0 to 20 ms
                await conn.commit()

    async def writers() -> None:
        try:
            await asyncio.gather(*(write(n) for n in range(5)))
        finally:
            done.set()

    writing = asyncio.create_task(writers())
    connections: list[Stream] = []
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        last: str | None = None
        while not done.is_set():
            async with streaming(http, f"/api/runs/{run.id}/events", last_event_id=last) as s:
                with contextlib.suppress(TimeoutError):
                    await s.until(lambda s: len(s.events) >= 3 or done.is_set(), timeout=2)
            connections.append(s)
            last = next((e.id for e in reversed(s.events) if e.id), last)
        await writing
        await store.cancel(run.id)
        async with streaming(http, f"/api/runs/{run.id}/events", last_event_id=last) as s:
            await s.until(lambda s: s.ended, timeout=DEADLINE, what="the end")
        connections.append(s)
    sent = [e for c in connections for e in c.events if e.event in ("step", "run")]
    ids = [e.id for e in sent]
    assert len(ids) == len(set(ids)), "an event was sent twice"
    latest = {step["seq"]: step["latencyMs"] for step in (Stream.decode(e) for e in sent if e.event == "step")}
    cur = await db.execute("SELECT seq, latency_ms FROM run_step WHERE run_id = %s", (run.id,))
    assert latest == dict(await cur.fetchall())
    assert sum(latest.values()) == 5 * 12 and len(connections) > 2


async def test_positions_keep_growing_across_the_upgrade_so_older_event_ids_still_resume(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database that ran 0010's trigger (positions were transaction ids) and then takes 0013: every new
    position is above every old one, so a client resuming with an id from before the upgrade misses
    nothing and gets nothing twice."""
    from agentrun.worker.store import migrate

    async with other_database(postgres_url) as url:
        every = migrate.available()
        monkeypatch.setattr(migrate, "available", lambda: [m for m in every if m.version < 13])
        await migrate.migrate(url)
        insert = ("INSERT INTO run (id, input, model, token_budget, timeout_seconds, deadline_at) "
                  "VALUES (%s, 'x', 'm', 10, 10, now()) RETURNING event_xid::text::bigint")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for _ in range(20):  # transaction ids move on meanwhile, as they do in a busy database
                await conn.execute("CREATE TEMP TABLE IF NOT EXISTS t (x int); INSERT INTO t VALUES (1)")

            async def positions() -> list[int]:
                found = []
                for _ in range(3):
                    row = await (await conn.execute(insert, (uuid.uuid4(),))).fetchone()
                    assert row is not None
                    found.append(int(row[0]))
                return found

            old = await positions()
            monkeypatch.setattr(migrate, "available", lambda: every)
            assert 13 in [m.version for m in await migrate.migrate(url)]
            new = await positions()
            assert max(old) < min(new) and new == sorted(new)
            cur = await conn.execute("SELECT agentrun_event_horizon()")
            assert (await cur.fetchone()) == (new[-1] + 1,)


async def test_many_streams_of_one_run_cost_one_read_per_change_and_one_encoding_per_event(
    app: FastAPI, store: RunStore, db: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fan-out (issue 48 §4): the feed reads a changed run once for all its streams, and each event is
    encoded once and the same bytes sent to every stream, not once per stream."""
    from agentrun.worker.api import events

    run, _ = await store.create(new_run())
    hub = app.state.events
    reads: list[int] = []
    read = hub.feed.read

    async def counted(since: Any) -> Any:
        reads.append(len(since))
        return await read(since)

    encoded: list[str] = []
    sse = events.encode

    def counted_sse(kind: str, position: Any, data: Any) -> bytes:
        encoded.append(kind)
        return sse(kind, position, data)

    monkeypatch.setattr(hub.feed, "read", counted)
    monkeypatch.setattr(events, "encode", counted_sse)
    limits = httpx.Limits(max_connections=40, max_keepalive_connections=0)
    async with serving(app) as url, httpx.AsyncClient(base_url=url, limits=limits) as http:
        streams = [Stream(http, f"/api/runs/{run.id}/events").start() for _ in range(20)]
        try:
            await asyncio.gather(*(s.until(lambda s: bool(s.of("run")), what="the run") for s in streams))
            reads.clear()
            encoded.clear()
            await add_step(db, run.id, 1)
            await asyncio.gather(*(s.until(has_step(1), timeout=DEADLINE, what="step 1") for s in streams))
        finally:
            await asyncio.gather(*(s.close() for s in streams))
    assert reads and all(n == 1 for n in reads) and len(reads) <= 3, f"reads of the run: {reads}"
    assert 1 <= encoded.count("step") <= len(reads), f"encodings: {encoded}"
