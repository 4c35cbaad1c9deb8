"""The worker loop: keeps up to N runs in flight, claims when a slot is free, and lets go cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import uuid
from collections.abc import Sequence
from importlib import metadata

import psycopg

from agentrun.worker.core.observer import NoObserver, Observer
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import Run, RunStatus
from agentrun.worker.core.types import LlmClient
from agentrun.worker.runtime.engine import DriverSettings, RunDriver
from agentrun.worker.runtime.lease import LeaseKeeper
from agentrun.worker.runtime.presence import Presence
from agentrun.worker.runtime.schedules import Ticker
from agentrun.worker.runtime.tasks import honour_cancel
from agentrun.worker.runtime.webhooks import WebhookSender
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import Claim, LeaseLost, RunStore
from agentrun.worker.store.groupcommit import transient
from agentrun.worker.store.waits import SWEEP_BATCH
from agentrun.worker.tools import ToolBox

log = logging.getLogger("agentrun.worker.runtime.runner")

CLAIM_BATCH = 256
"""The most runs one claim statement takes. At 64, a worker with 10,000 free slots needed 157 claims, each
waiting its turn on an event loop busy with the runs already in flight: at 1 s model latency the first runs
ended before the last were claimed (B7, issue 48 §1: 6,480 of 10,000 in flight at most; all at 256)."""

try:
    VERSION = metadata.version("agentrun")
except metadata.PackageNotFoundError:
    VERSION = "unknown"

SWEEP_MAX_SLEEP = 2.0
"""The longest the wait sweep sleeps between two looks: a timer parked by another worker (whose sweep would
have woken it, had it not died) fires at most this late."""


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        store: RunStore,
        llm: LlmClient,
        tools: ToolBox,
        prices: PriceTable | None = None,
        observer: Observer | None = None,
        webhooks: WebhookSender | None = None,
        mcp_servers: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.mcp_servers = tuple(mcp_servers)  # the names of its MCP servers, as GET /api/workers lists them
        self.webhooks = webhooks  # the completion webhooks' sender, run beside the housekeeping
        self.observer: Observer = observer or NoObserver()
        self.store = store
        self.keeper = LeaseKeeper(store, settings.worker_id, settings.lease_seconds)
        self.stopping = asyncio.Event()
        self.wake = asyncio.Event()  # set when a run may have become claimable
        self.presence = Presence(
            store, settings.worker_id, self.wake, liveness_lock=settings.liveness_lock,
            on_cancel=self.keeper.request_cancel, grace=settings.takeover_grace,
        )
        self.driver = RunDriver(
            DriverSettings(
                settings.worker_id, settings.lease_seconds, settings.max_tokens, settings.max_crash_claims,
                max_agent_depth=settings.max_agent_depth, max_children_per_turn=settings.max_children_per_turn,
                event_retention=settings.event_retention,
            ),
            store,
            llm,
            tools,
            prices or PriceTable.load(settings.prices_file),
            self.keeper,
            self.stopping,
            self.observer,
        )
        self.driving: dict[uuid.UUID, asyncio.Task[RunStatus | None]] = {}  # run id → its driver task
        self.sweep_poke = asyncio.Event()  # a run parked for a timer or an event: the sweep looks again
        self.driver.parked_wait = self.sweep_poke.set
        self.leaving: set[uuid.UUID] = set()  # held runs whose last write is on its way: their slots are free
        self.slot_freed = asyncio.Event()  # set when a run starts leaving
        self.driver.leaving = self._leaving
        self.sweeps = 0  # sweep statements sent (tests count them)
        self.ticker = Ticker(store, settings.worker_id, settings.default_model, self.observer)  # schedules

    @property
    def in_flight(self) -> set[asyncio.Task[RunStatus | None]]:
        """The driver tasks of the runs this worker holds now."""
        return set(self.driving.values())

    @property
    def id(self) -> str:
        return self.settings.worker_id

    def stop(self) -> None:
        """Stop claiming; in-flight runs hand themselves back after their current step."""
        if not self.stopping.is_set():
            log.info("%s stopping: no new claims, in-flight steps finish", self.id)
        self.stopping.set()
        self.wake.set()

    async def run_once(self) -> uuid.UUID | None:
        """Claim one run and drive it to its end (for tests and tools); None if nothing was claimable."""
        await self.presence.start()
        try:
            claims = await self._claim(1)
            if not claims:
                return None
            claimed = claims[0]
            heartbeat = asyncio.create_task(self.keeper.run())
            self.observer.in_flight(1)
            try:
                await self.driver.drive(claimed.run, claimed.progress, fresh=claimed.fresh, leased_at=claimed.sent_at)
            except LeaseLost:
                self.observer.lease_lost()
                raise
            finally:
                self.observer.in_flight(0)
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat
            return claimed.run.id
        finally:
            await self.presence.close()

    async def _claim(self, limit: int) -> list[Claim]:
        claims = await self.store.claim_many(
            self.id, self.settings.lease_seconds, liveness=self.settings.liveness_lock,
            liveness_grace=self.settings.takeover_grace, limit=limit,
        )
        for claimed in claims:
            self.observer.claimed(
                takeover=claimed.taken_from not in (None, self.id), run_id=claimed.run.id, taken_from=claimed.taken_from
            )
        return claims

    async def _idle_for(self) -> float:
        """How long to idle after a claim found nothing: the poll interval, or less when a scheduled run
        comes due sooner (it is claimed on time, by one wake-up, not by polling faster) or a holder's
        liveness lock was found free, so its runs are taken as soon as its grace has passed."""
        idle = self.settings.poll_interval
        due = await self.store.next_run_in()
        if due is not None:
            idle = min(idle, due + 0.005)
        if not self.settings.liveness_lock:
            return idle
        wait = await self.store.suspect(self.id, self.settings.takeover_grace)
        if wait is None:
            return idle
        return min(idle, wait + 0.02)

    async def run(self) -> None:
        """Serve until stop(): claim, drive, repeat; then wait for in-flight runs within the grace."""
        # The liveness lock is taken before the first claim: a run held without it looks dead to others.
        await self.presence.start()
        heartbeat = asyncio.create_task(self.keeper.run(), name=f"{self.id}-heartbeat")
        housekeeping = asyncio.create_task(self._housekeeping(), name=f"{self.id}-housekeeping")
        sweep = asyncio.create_task(self._sweep(), name=f"{self.id}-wait-sweep")
        ticker = asyncio.create_task(self.ticker.run(), name=f"{self.id}-schedules")
        await self._announce_once()  # listed from its first claim on
        announce = asyncio.create_task(self._announce(), name=f"{self.id}-announce")
        background = [housekeeping, sweep, ticker, announce]
        if self.webhooks is not None:
            background.append(asyncio.create_task(self.webhooks.run(), name=f"{self.id}-webhooks"))
        backoff = self.settings.poll_interval
        try:
            while not self.stopping.is_set():
                if self._free() <= 0:
                    await self._wait_for_slot()
                    continue
                if self.settings.liveness_lock and not self.presence.ready.is_set():
                    self.wake.clear()
                    await self._idle(self.settings.poll_interval)  # the lock is being taken again
                    continue
                # Cleared before looking, not after: a wake-up (a notification, stop()) that arrives
                # while the claim is in flight must not be lost, or the worker sleeps a whole poll.
                self.wake.clear()
                try:
                    # As many as there are free slots, in one statement (up to CLAIM_BATCH): a worker
                    # with thousands of slots fills them in moments, not one round trip per run.
                    claims = await self._claim(min(self._free(), CLAIM_BATCH))
                    idle = await self._idle_for() if not claims else 0.0
                    backoff = self.settings.poll_interval
                except Exception as e:
                    # Whatever the database says (gone, read-only in a failover, out of connections),
                    # the loop goes on: a worker that exits in an outage only crash-loops its pod.
                    log.warning("%s cannot claim: %s; retrying in %.1fs", self.id, str(e) or type(e).__name__, backoff)
                    await self._idle(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, 5.0)
                    continue
                if not claims:
                    await self._idle(idle)
                    continue
                for claimed in claims:
                    await self._supersede(claimed.run.id)
                    task = asyncio.create_task(
                        self._drive(claimed), name=f"run-{claimed.run.id}"
                    )
                    self.driving[claimed.run.id] = task
                    task.add_done_callback(functools.partial(self._done, claimed.run.id))
                self.observer.in_flight(len(self.driving))
        finally:
            for task in background:
                task.cancel()
            # Awaited, also when Worker.run leaves by an exception: none may outlive the worker.
            await asyncio.gather(*background, return_exceptions=True)
            await self._drain()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            with contextlib.suppress(Exception):  # a database gone: the row ages out within a lease
                await self.store.retire(self.id)
            await self.presence.close()  # only now: the runs it covered are finished or released

    async def _announce_once(self) -> None:
        try:
            await self.store.announce(self.id, VERSION, self.settings.concurrency, self.settings.lease_seconds,
                                      self.mcp_servers)
        except Exception as e:  # presence in the list is no reason to stop working
            honour_cancel(e)
            log.debug("%s could not announce itself: %s", self.id, str(e) or type(e).__name__)

    async def _announce(self) -> None:
        """The worker's row in the worker table (GET /api/workers), renewed at the heartbeat's pace: every
        third of the lease, so a live worker's row is never older than its lease and a killed one's soon is."""
        while True:
            await asyncio.sleep(self.settings.lease_seconds / 3)
            await self._announce_once()
            honour_cancel()

    async def _housekeeping(self) -> None:
        """Every couple of seconds, end the waiting runs whose deadline has passed or that were asked to stop,
        and cancel the children of parents that have ended: no worker holds them, so none would notice
        otherwise. Cheap (indexes on each) and harmless from many workers."""
        while True:
            await asyncio.sleep(random.uniform(1.0, 2.0))
            try:
                for run_id in await self.store.expire_waiting():
                    log.info("%s run=%s TIMED_OUT while waiting", self.id, run_id.hex[:8])
                for run_id in await self.store.end_cancelled_waiting():
                    log.info("%s run=%s CANCELLED while waiting: it was asked to stop", self.id, run_id.hex[:8])
                for run_id in await self.store.cancel_orphans():
                    log.info("%s run=%s cancelled: its parent run ended", self.id, run_id.hex[:8])
            except Exception as e:
                honour_cancel(e)
                log.debug("%s could not look for expired waiting runs: %s", self.id, e)
            honour_cancel()

    async def _sweep(self) -> None:
        """Wake the runs whose timer is due or whose event wait timed out: ONE statement for all of them (the
        database notifies every worker of the runs queued), then sleep until the next wait comes due, at most
        SWEEP_MAX_SLEEP, or until this worker parks a run. Sleeping runs cost no query of their own."""
        while True:
            self.sweep_poke.clear()
            sleep = SWEEP_MAX_SLEEP
            try:
                self.sweeps += 1
                woke, nxt = await self.store.wake_due()
                if woke:
                    log.info("%s woke %d waiting runs (timers due, event waits timed out)", self.id, len(woke))
                    self.wake.set()
                if nxt is not None:
                    sleep = min(sleep, nxt + 0.005)
                if len(woke) >= SWEEP_BATCH:
                    sleep = 0.0
            except Exception as e:
                honour_cancel(e)
                log.debug("%s could not sweep the waiting runs: %s", self.id, e)
            honour_cancel()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sleep):
                    await self.sweep_poke.wait()

    def _free(self) -> int:
        """Slots free for claims: the concurrency less the runs held, not counting those whose last write is on
        its way. A run's successor is claimed while that write commits, not after: at concurrency 8 a slot stood
        empty for the length of a claim after every run (B1 lost a tenth of its steps to it, issue 48 §2)."""
        return self.settings.concurrency - len(self.driving) + len(self.leaving)

    def _leaving(self, run_id: uuid.UUID, leaving: bool) -> None:
        if not leaving:
            self.leaving.discard(run_id)
        elif run_id in self.driving:
            self.leaving.add(run_id)
            self.slot_freed.set()

    def _done(self, run_id: uuid.UUID, task: asyncio.Task[RunStatus | None]) -> None:
        self.leaving.discard(run_id)
        if self.driving.get(run_id) is task:
            del self.driving[run_id]
        self.observer.in_flight(len(self.driving))
        self.wake.set()

    async def _supersede(self, run_id: uuid.UUID) -> None:
        """Stop this worker's earlier driver of a run it has just claimed again.

        That happens when the lease lapsed while the driver was still at work (the database was
        unreachable for longer than the lease, say) and no other worker took the run first. Both drivers
        would write as this worker, which the fence cannot tell apart: the old one must go first.
        """
        old = self.driving.get(run_id)
        if old is None or old.done():
            return
        self.keeper.give_up([run_id])
        old.cancel("claimed again")
        await asyncio.gather(old, return_exceptions=True)

    async def _wait_for_slot(self) -> None:
        """Until a run ends, or one sends its last write (`_leaving`), or the worker stops."""
        self.slot_freed.clear()
        if self._free() > 0:
            return
        waits = [asyncio.ensure_future(self.stopping.wait()), asyncio.ensure_future(self.slot_freed.wait())]
        try:
            await asyncio.wait({*self.in_flight, *waits}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _idle(self, seconds: float) -> None:
        """Sleep until the poll interval passes or something wakes us (at once if it already has)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.wake.wait()

    async def _drain(self) -> None:
        if not self.driving:
            return
        log.info(
            "%s waiting up to %.0fs for %d in-flight runs", self.id, self.settings.shutdown_grace, len(self.driving)
        )
        _, late = await asyncio.wait(self.in_flight, timeout=self.settings.shutdown_grace)
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)

    async def _fail(self, run: Run, reason: str) -> None:
        self.keeper.drop(run.id)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.keeper.renew_timeout):
                await self.store.finish(run.id, self.id, RunStatus.FAILED, reason, epoch=run.lease_epoch)

    async def _drive(self, claimed: Claim) -> RunStatus | None:
        run = claimed.run
        try:
            return await self.driver.drive(run, claimed.progress, fresh=claimed.fresh, leased_at=claimed.sent_at)
        except LeaseLost:
            self.observer.lease_lost()
            # Logged here and only here, whichever way the loss was noticed (the heartbeat or a fenced write).
            log.warning(
                "%s run=%s lease lost (taken over, ended, or lapsed while the database was unreachable); "
                "stopped driving it", self.id, run.id.hex[:8],
            )
        except asyncio.CancelledError:
            # Cancelled past the shutdown grace: the in-flight step is abandoned (it will be redone),
            # and the lease is given back so another worker resumes at once. Under this claim's epoch:
            # a driver cancelled because this worker claimed the run again (supersede) must not hand
            # back the new claim.
            with contextlib.suppress(Exception):
                if not await asyncio.shield(self.store.release(run.id, self.id, epoch=run.lease_epoch)):
                    log.warning("%s run=%s not handed back: no longer held under claim %d", self.id,
                                run.id.hex[:8], run.lease_epoch)
            raise
        except psycopg.Error as e:
            if not transient(e):
                await self._fail(run, f"the database refused a write of this run: {type(e).__name__}: {e}")
                return None
            log.warning("%s run=%s database error, left for another attempt: %s", self.id, run.id.hex[:8], e)
            # If the database answers again (a dropped connection rather than an outage), hand the run
            # back now: any worker resumes it from its last checkpoint without waiting out the lease.
            # Fenced, so harmless if another worker has it already.
            self.keeper.drop(run.id)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.keeper.renew_timeout):  # not past the lease: moot then
                    await self.store.release(run.id, self.id, epoch=run.lease_epoch)
        except Exception as e:
            # Not a crash of the worker but a bug or bad data in this run: end it with the reason, so it
            # does not poison every worker that claims it.
            log.exception("%s run=%s failed unexpectedly", self.id, run.id.hex[:8])
            await self._fail(run, f"the worker failed on this run: {type(e).__name__}: {e}")
        return None
