"""The heartbeat that keeps a worker's leases alive while its steps run, however long a step takes.

One timer per worker, not per run: every third of the lease it renews all the runs the worker holds in
one fenced UPDATE. A run missing from the answer was taken over (or stopped); its driver is cancelled
at once so the in-flight step writes nothing more. A run whose cancel flag the answer (or a cancel
notification) carries has the call or tool in flight interrupted.

Every renewal is bounded in time, and after a failed one the next comes sooner. When no renewal of a
run has succeeded for two thirds of its lease, counted from when the last good one (or its claim) was
sent, the run is given up and its step cancelled: the lease may lapse for others a third of a lease
later, and by then this worker has stopped. The mark is kept by the clock, never by the renewal's
query: a query on a stalled connection can take seconds to give in when cancelled (psycopg waits for
it and then for its cancel request), so a renewal past its time is abandoned, not waited for.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrun.worker.core.errors import CancelRequested as CancelRequested
from agentrun.worker.runtime.tasks import honour_cancel
from agentrun.worker.store import RunStore

log = logging.getLogger(__name__)

T = TypeVar("T")

GIVE_UP_AT = 2 / 3
"""The fraction of the lease without a successful renewal after which the held runs are given up."""


@dataclass(slots=True)
class _Held:
    """A run whose lease this worker renews."""

    driver: asyncio.Task[object]
    epoch: int | None  # the lease epoch its claim was made under, if known: renewals are fenced on it
    since: float  # when its lease was last known extended (time.monotonic() when that was sent)


class LeaseKeeper:
    def __init__(self, store: RunStore, worker_id: str, lease_seconds: float) -> None:
        self.store = store
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self._held: dict[uuid.UUID, _Held] = {}
        self._lost: set[uuid.UUID] = set()
        self._cancel: set[uuid.UUID] = set()  # held runs someone asked to stop
        self._interruptible: dict[uuid.UUID, asyncio.Future[object]] = {}  # the call or tool in flight, per run
        self._changed = asyncio.Event()  # a run was held: the heartbeat's next renewal may be due sooner
        self._urgent = False  # ...and it must be at once
        self._abandoned: set[asyncio.Future[Any]] = set()  # renewals past their time, still being cancelled
        self.renewals = 0  # renewals that succeeded

    @property
    def renew_timeout(self) -> float:
        """The longest one renewal may take, pool checkout included: it must never outlast the lease."""
        return self.lease_seconds / 10

    def hold(
        self, run_id: uuid.UUID, task: asyncio.Task[object], epoch: int | None = None, since: float | None = None
    ) -> None:
        """Renew the run's lease from now on. Its claim, of lease epoch `epoch`, wrote it; `since` is when
        that claim was sent (time.monotonic()), the latest moment its lease can have begun: the give-up
        mark counts from there. Without it, from now."""
        self._lost.discard(run_id)
        self._cancel.discard(run_id)
        now = time.monotonic()
        self._held[run_id] = _Held(task, epoch, now if since is None else since)
        if since is not None and now - since >= self.lease_seconds / 3:
            self._urgent = True  # as old as a renewal's interval already: renew it now
        self._changed.set()

    def drop(self, run_id: uuid.UUID) -> None:
        """Stop renewing: the run is about to be finished or released by its driver."""
        self._held.pop(run_id, None)

    def set_aside(self, run_id: uuid.UUID) -> _Held | None:
        """Stop renewing while a statement may park the run (a renewal must not find it parked and count
        it lost); `take_back` what this returns if it did not park."""
        return self._held.pop(run_id, None)

    def take_back(self, run_id: uuid.UUID, held: _Held | None) -> None:
        """Renew again a run set aside that did not park, its give-up mark where it was."""
        if held is not None:
            self.hold(run_id, held.driver, held.epoch, since=held.since)

    def forget(self, run_id: uuid.UUID) -> None:
        """The run's driver has ended: stop renewing and drop the record of a loss, once it was read."""
        self._held.pop(run_id, None)
        self._lost.discard(run_id)
        self._cancel.discard(run_id)

    def lost(self, run_id: uuid.UUID) -> bool:
        return run_id in self._lost

    def cancel_requested(self, run_id: uuid.UUID) -> bool:
        return run_id in self._cancel

    @property
    def held(self) -> list[uuid.UUID]:
        return list(self._held)

    def request_cancel(self, run_id: uuid.UUID) -> None:
        """Someone asked a held run to stop: interrupt its call or tool in flight, if any; the driver
        sees the flag at its next guard either way. Runs this worker does not hold are ignored."""
        if run_id not in self._held or run_id in self._cancel:
            return
        log.info("%s run=%s cancel requested: interrupting the step in flight", self.worker_id, run_id.hex[:8])
        self._cancel.add(run_id)
        step = self._interruptible.get(run_id)
        if step is not None:
            step.cancel("cancel requested")

    async def interruptible(self, run_id: uuid.UUID, work: Awaitable[T]) -> T:
        """Await `work` (a model call or a tool) so that a cancel of the run interrupts it.

        It runs as a task of its own, so a cancel reaches the call and never a checkpoint write; the
        driver gets `CancelRequested`. A cancel of the driver itself passes through as ever.
        """
        if run_id in self._cancel:
            if asyncio.iscoroutine(work):
                work.close()
            raise CancelRequested(run_id)
        step: asyncio.Future[T] = asyncio.ensure_future(work)
        self._interruptible[run_id] = step  # type: ignore[assignment]
        try:
            return await step
        except asyncio.CancelledError:
            if step.cancelled() and run_id in self._cancel:
                current = asyncio.current_task()
                if current is None or not current.cancelling():
                    raise CancelRequested(run_id) from None
            raise
        finally:
            if self._interruptible.get(run_id) is step:
                del self._interruptible[run_id]

    def _give_up_at(self, run_ids: list[uuid.UUID]) -> float:
        """The monotonic time at which the first of these runs must be given up."""
        since = min((self._held[i].since for i in run_ids if i in self._held), default=0.0)
        return since + self.lease_seconds * GIVE_UP_AT

    async def renew(self) -> None:
        """Renew every held run in one fenced statement, within `renew_timeout` and never past the give-up
        mark (a renewal still waiting then would be too late to count). Raises TimeoutError past that:
        the statement is cancelled and left to end in the background, never waited for."""
        held = dict(self._held)
        ids = list(held)
        if not ids:
            return
        if len(self._abandoned) >= 2:  # connections stuck in earlier renewals: do not pile more on them
            raise TimeoutError("earlier renewals are still being cancelled")
        started = time.monotonic()
        budget = max(min(self.renew_timeout, self._give_up_at(ids) - started), 0.0)
        renewal: asyncio.Future[dict[uuid.UUID, bool]] = asyncio.ensure_future(self.store.renew(
            ids, self.worker_id, self.lease_seconds, {i: h.epoch for i, h in held.items() if h.epoch is not None}
        ))
        try:
            done, _ = await asyncio.wait({renewal}, timeout=budget)
        except asyncio.CancelledError:
            self._abandon(renewal)
            raise
        if not done:
            self._abandon(renewal)
            raise TimeoutError(f"no answer to the renewal in {budget:.2f}s")
        alive = renewal.result()
        self.renewals += 1
        for run_id, was in held.items():
            if run_id in alive and self._held.get(run_id) is was:  # still the same hold: it was extended
                was.since = max(was.since, started)
        self.give_up([run_id for run_id in ids if run_id not in alive])
        for run_id, cancel in alive.items():
            if cancel:
                self.request_cancel(run_id)

    def _abandon(self, renewal: asyncio.Future[Any]) -> None:
        renewal.cancel()
        if renewal.done():
            return
        self._abandoned.add(renewal)

        def ended(f: asyncio.Future[Any]) -> None:
            self._abandoned.discard(f)
            if not f.cancelled():
                f.exception()  # retrieved: its outcome no longer counts either way

        renewal.add_done_callback(ended)

    def give_up(self, run_ids: list[uuid.UUID]) -> None:
        """Count the runs as lost and cancel their drivers, which then raise LeaseLost."""
        for run_id in run_ids:
            self._lost.add(run_id)
            held = self._held.pop(run_id, None)
            if held is not None:
                held.driver.cancel("lease lost")

    def lapsed(self) -> list[uuid.UUID]:
        """The held runs with no renewal for two thirds of their lease: they must be given up now, before
        the database could count their leases as lapsed and let another worker take them."""
        mark = time.monotonic() - self.lease_seconds * GIVE_UP_AT
        return [run_id for run_id, held in self._held.items() if held.since <= mark]

    async def _pause(self, interval: float) -> None:
        """Sleep until the next renewal is due: `interval` after the last, or the first give-up mark if
        that comes sooner. A run held meanwhile with a third of its lease already spent (a claim slow to
        answer) cuts it short: it is renewed at once, not at a renewal planned past its mark."""
        started = time.monotonic()
        while not self._urgent:
            self._changed.clear()
            held = list(self._held)
            due = min(started + interval, self._give_up_at(held)) if held else started + interval
            wait = due - time.monotonic()
            if wait <= 0:
                await asyncio.sleep(0)  # never a loop that does not yield, whatever the marks say
                return
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except TimeoutError:
                return
        self._urgent = False

    async def run(self) -> None:
        """Renew forever: every third of the lease, and every fifteenth after a failure, and give up each
        run at its two-thirds mark. The fence would refuse their writes anyway once another worker has
        them; stopping first keeps a tool from running on meanwhile."""
        interval = self.lease_seconds / 3
        while True:
            honour_cancel()
            await self._pause(interval)
            if lapsed := self.lapsed():
                log.warning(
                    "%s gives up %d runs: no lease renewal succeeded for %.1fs", self.worker_id, len(lapsed),
                    self.lease_seconds * GIVE_UP_AT,
                )
                self.give_up(lapsed)
                continue
            try:
                await self.renew()
                interval = self.lease_seconds / 3
            except Exception as e:
                honour_cancel(e)
                interval = max(self.lease_seconds / 15, 0.05)
                log.warning("%s could not renew its leases: %s", self.worker_id, str(e) or type(e).__name__)
