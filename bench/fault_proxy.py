"""A TCP proxy between workers and PostgreSQL that injects faults at the connection: it delays, stalls,
half-opens (one direction stops) and cuts single connections, and for a while slows every new
connection past the liveness grace. The chaos run (bench/chaos.py) puts it in front of the database.

The schedule is seeded and bounded: `FaultPlan` draws a fixed number of faults, each of bounded length,
at jittered intervals from its seed; which live connection a fault hits is drawn from the same seed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import random
import threading
from collections.abc import Sequence
from typing import Any, Literal

from psycopg.conninfo import conninfo_to_dict, make_conninfo

FaultKind = Literal["delay", "stall", "half_open", "cut", "slow_connects"]
KINDS: tuple[FaultKind, ...] = ("delay", "stall", "half_open", "cut", "slow_connects")
CHUNK = 65536


@dataclasses.dataclass(frozen=True)
class Fault:
    at: float
    """Seconds after the schedule starts."""
    kind: FaultKind
    seconds: float
    """How long it lasts: the delay window, the stall, the half-open time before its cut, the slow window."""
    pick: float
    """Which live connection it hits, as a fraction of their list (oldest first)."""
    direction: Literal["to_server", "to_client"] = "to_server"
    """For a half-open: the direction that stops."""


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    seed: int = 1
    faults: int = 12
    every: float = 0.6
    """Mean seconds between two faults (uniform between half and one and a half times this)."""
    longest: float = 1.2
    """The longest a delay window, a stall or a half-open lasts."""
    connect_delay: float = 1.5
    """How long a new connection waits during a slow window: past the liveness grace (1 s)."""
    slow_window: float = 1.5
    """How long a slow window lasts. Each slows every worker's reconnects and starts, so there are at
    most `slow_windows` of them: the run's length stays about what it is without the proxy."""
    slow_windows: int = 2

    def schedule(self) -> list[Fault]:
        rng = random.Random(self.seed)
        at, out = 0.0, []
        # The kinds in turn, each round shuffled: a short schedule still has them all, in a seeded order.
        kinds: list[FaultKind] = []
        while len(kinds) < self.faults:
            round_ = [k for k in KINDS if k != "slow_connects" or kinds.count(k) < self.slow_windows]
            rng.shuffle(round_)
            kinds += round_
        for kind in kinds[: self.faults]:
            at += self.every * rng.uniform(0.5, 1.5)
            seconds = self.slow_window if kind == "slow_connects" else rng.uniform(0.3, self.longest)
            out.append(Fault(at, kind, seconds, rng.random(), rng.choice(["to_server", "to_client"])))
        return out


class _Link:
    """One proxied connection: a pump per direction, each of which may be held (stall, half-open) or
    slowed (delay)."""

    def __init__(self, number: int, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.number = number
        self.writers = (client, server)
        self.open = {"to_server": asyncio.Event(), "to_client": asyncio.Event()}
        for gate in self.open.values():
            gate.set()
        self.delay = 0.0
        self.tasks: list[asyncio.Task[None]] = []

    async def pump(self, direction: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                await self.open[direction].wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.cut()

    def cut(self) -> None:
        """Both sides closed at once, as a reset would: each end sees its connection end."""
        for w in self.writers:
            with contextlib.suppress(Exception):
                w.transport.abort()


class FaultProxy:
    """Listens on 127.0.0.1 and forwards every connection to the database of `url` (TCP or a Unix
    socket); `url` (the attribute) is the same database through the proxy. `run(plan)` plays a schedule."""

    def __init__(self, upstream_url: str) -> None:
        self.upstream = conninfo_to_dict(upstream_url)
        self.upstream_url = upstream_url
        self.links: dict[int, _Link] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self.connect_delay = 0.0
        self._server: asyncio.Server | None = None
        self._numbers = 0
        self._closing = asyncio.Event()
        self.port = 0
        self.last_upstream_error: str | None = None

    @property
    def url(self) -> str:
        return make_conninfo(self.upstream_url, host="127.0.0.1", port=str(self.port))

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        """Every connection cut, the listener closed; connections still waiting out a slow connect end."""
        self._closing.set()
        if self._server is not None:
            self._server.close()
        for link in list(self.links.values()):
            link.cut()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        self._server = None

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host = str(self.upstream.get("host") or "localhost")
        port = int(self.upstream.get("port") or 5432)
        if host.startswith("/"):
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        return await asyncio.open_connection(host, port)

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        if self.connect_delay:
            self.counts["slowed connects"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.connect_delay)
        try:
            if self._closing.is_set():
                raise ConnectionRefusedError("the proxy is closing")
            s_reader, s_writer = await self._open_upstream()
        except OSError as e:  # the database is down: the client sees its connection end, as it would
            self.counts["upstream unreachable"] += 1
            self.last_upstream_error = f"{type(e).__name__}: {e}"
            c_writer.transport.abort()
            return
        self._numbers += 1
        link = _Link(self._numbers, c_writer, s_writer)
        self.links[link.number] = link
        link.tasks = [
            asyncio.create_task(link.pump("to_server", c_reader, s_writer)),
            asyncio.create_task(link.pump("to_client", s_reader, c_writer)),
        ]
        try:
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self.links.pop(link.number, None)

    def _target(self, fault: Fault) -> _Link | None:
        links = [self.links[n] for n in sorted(self.links)]
        return links[min(int(fault.pick * len(links)), len(links) - 1)] if links else None

    async def inject(self, fault: Fault, connect_delay: float) -> None:
        """One fault, to its end (a stall resumes, a half-open is cut, a slow window closes)."""
        if fault.kind == "slow_connects":
            self.connect_delay = connect_delay
            try:
                await asyncio.sleep(fault.seconds)
            finally:
                self.connect_delay = 0.0
            self.counts[fault.kind] += 1
            return
        link = self._target(fault)
        if link is None:  # run() waits for one to be open; it closed since
            self.counts["missed"] += 1
            return
        self.counts[fault.kind] += 1
        if fault.kind == "cut":
            link.cut()
        elif fault.kind == "delay":
            link.delay = min(fault.seconds / 5, 0.2)
            await asyncio.sleep(fault.seconds)
            link.delay = 0.0
        elif fault.kind == "stall":
            for gate in link.open.values():
                gate.clear()
            await asyncio.sleep(fault.seconds)
            for gate in link.open.values():
                gate.set()
        elif fault.kind == "half_open":
            link.open[fault.direction].clear()
            await asyncio.sleep(fault.seconds)
            link.cut()

    async def run(self, plan: FaultPlan, faults: Sequence[Fault] | None = None) -> None:
        """Play the plan's schedule (or `faults`) from now; each fault runs beside the next ones."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        running: list[asyncio.Task[None]] = []
        try:
            for fault in plan.schedule() if faults is None else faults:
                await asyncio.sleep(max(t0 + fault.at - loop.time(), 0.0))
                # A fault meant for a connection waits for one (every worker restarting, the database
                # down), the rest of the schedule with it: each fault hits something.
                waited = loop.time()
                while fault.kind != "slow_connects" and not self.links and loop.time() - waited < 60:
                    await asyncio.sleep(0.05)
                t0 += loop.time() - waited
                running.append(asyncio.create_task(self.inject(fault, plan.connect_delay)))
            await asyncio.gather(*running)
        finally:
            for task in running:
                task.cancel()
            self.connect_delay = 0.0


class ProxyThread:
    """A FaultProxy on an event loop of its own, in a thread: its forwarding is never held up by what the
    caller's loop is doing (the chaos run's model server and bookkeeping), as a real network is not."""

    def __init__(self, upstream_url: str, plan: FaultPlan) -> None:
        self.plan = plan
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self.proxy = self._call(self._start(upstream_url))
        self._faults: concurrent.futures.Future[None] | None = None

    async def _start(self, upstream_url: str) -> FaultProxy:
        return await FaultProxy(upstream_url).start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    @property
    def url(self) -> str:
        return self.proxy.url

    def play(self) -> None:
        """Start the schedule (once)."""
        if self._faults is None:
            self._faults = asyncio.run_coroutine_threadsafe(self.proxy.run(self.plan), self._loop)

    @property
    def played(self) -> bool:
        return self._faults is not None and self._faults.done() and not self._faults.cancelled() \
            and self._faults.exception() is None

    def counts(self) -> dict[str, int]:
        return dict(self.proxy.counts)

    def stop(self) -> None:
        if self._faults is not None and not self._faults.done():
            self._faults.cancel()
        with contextlib.suppress(Exception):
            self._call(self.proxy.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()
