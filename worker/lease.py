"""The heartbeat that keeps a worker's leases alive while its steps run, however long a step takes.

One timer per worker, not per run: every third of the lease it renews all the runs the worker holds in
one fenced UPDATE. A run missing from the answer was taken over (or stopped); its driver is cancelled
at once so the in-flight step writes nothing more. While the database cannot be reached, a lease
that may have lapsed is given up the same way: another worker may hold the run by now.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from agentrun.worker.store import RunStore

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, store: RunStore, worker_id: str, lease_seconds: float) -> None:
        self.store = store
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self._held: dict[uuid.UUID, asyncio.Task[object]] = {}
        self._lost: set[uuid.UUID] = set()
        self._renewed_at = time.monotonic()  # the last moment every held lease was known to be ours

    def hold(self, run_id: uuid.UUID, task: asyncio.Task[object]) -> None:
        self._lost.discard(run_id)
        self._held[run_id] = task

    def drop(self, run_id: uuid.UUID) -> None:
        """Stop renewing: the run is about to be finished or released by its driver."""
        self._held.pop(run_id, None)

    def forget(self, run_id: uuid.UUID) -> None:
        """The run's driver has ended: stop renewing and drop the record of a loss, once it was read."""
        self._held.pop(run_id, None)
        self._lost.discard(run_id)

    def lost(self, run_id: uuid.UUID) -> bool:
        return run_id in self._lost

    @property
    def held(self) -> list[uuid.UUID]:
        return list(self._held)

    async def renew(self) -> None:
        ids = list(self._held)
        if not ids:
            self._renewed_at = time.monotonic()
            return
        started = time.monotonic()
        alive = await self.store.renew(ids, self.worker_id, self.lease_seconds)
        self._renewed_at = started
        self.give_up([run_id for run_id in ids if run_id not in alive])

    def give_up(self, run_ids: list[uuid.UUID]) -> None:
        """Count the runs as lost and cancel their drivers, which then raise LeaseLost."""
        for run_id in run_ids:
            self._lost.add(run_id)
            task = self._held.pop(run_id, None)
            if task is not None:
                task.cancel("lease lost")

    def lapsed(self) -> bool:
        """No renewal has succeeded for a whole lease: by the database's reckoning the runs may be free."""
        return time.monotonic() - self._renewed_at >= self.lease_seconds

    async def run(self) -> None:
        """Renew forever. A failed renewal is logged and retried at the next beat. Once renewals have
        failed for a whole lease (the database is down or unreachable), the held runs are given up:
        the fence would refuse their writes anyway, and stopping now keeps a tool from running on
        while another worker may already be running it again."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.renew()
            except Exception as e:
                log.warning("%s could not renew its leases: %s", self.worker_id, e)
                if self.lapsed() and self._held:
                    log.warning("%s gives up %d runs whose leases may have lapsed", self.worker_id, len(self._held))
                    self.give_up(list(self._held))
