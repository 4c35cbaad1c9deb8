"""The heartbeat that keeps a worker's leases alive while its steps run, however long a step takes.

One timer per worker, not per run: every third of the lease it renews all the runs the worker holds in
one fenced UPDATE. A run missing from the answer was taken over (or stopped); its driver is cancelled
at once so the in-flight step writes nothing more.
"""

from __future__ import annotations

import asyncio
import logging
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

    def hold(self, run_id: uuid.UUID, task: asyncio.Task[object]) -> None:
        self._lost.discard(run_id)
        self._held[run_id] = task

    def drop(self, run_id: uuid.UUID) -> None:
        """Stop renewing: the run is about to be finished or released by its driver."""
        self._held.pop(run_id, None)

    def lost(self, run_id: uuid.UUID) -> bool:
        return run_id in self._lost

    @property
    def held(self) -> list[uuid.UUID]:
        return list(self._held)

    async def renew(self) -> None:
        ids = list(self._held)
        if not ids:
            return
        alive = await self.store.renew(ids, self.worker_id, self.lease_seconds)
        for run_id in ids:
            task = self._held.get(run_id)
            if run_id not in alive and task is not None:
                self._held.pop(run_id)
                self._lost.add(run_id)
                task.cancel("lease lost")

    async def run(self) -> None:
        """Renew forever. A failed renewal is logged and retried at the next beat: the fence keeps
        a worker whose lease lapsed meanwhile from writing into a run another worker took."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.renew()
            except Exception as e:
                log.warning("%s could not renew its leases: %s", self.worker_id, e)
