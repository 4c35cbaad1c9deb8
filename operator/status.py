"""Status sync: run changes (notifications, a periodic sweep) become AgentRun status patches and Events.

One task serves every AgentRun: notified run ids collect in a set, a short debounce folds a burst into
one batch, one query reads the batch, and only statuses that visibly changed are patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
import psycopg_pool

from agentrun.operator import mapping
from agentrun.operator.kube import KubeApi, KubeError
from agentrun.operator.mapping import Ref
from agentrun.operator.settings import OperatorSettings
from agentrun.worker.core.records import Run, RunStatus
from agentrun.worker.store import RunStore

log = logging.getLogger("agentrun.operator.status")

Lookup = Callable[[uuid.UUID], "Ref | None"]


class StatusSync:
    def __init__(
        self,
        settings: OperatorSettings,
        store: RunStore,
        kube: KubeApi,
        lookup: Lookup,
        refs: Callable[[], Iterable[Ref]],
    ) -> None:
        self.settings = settings
        self.store = store
        self.kube = kube
        self.lookup = lookup  # kopf's index: the AgentRuns this operator serves, by uid
        self.refs = refs
        self.pending: set[uuid.UUID] = set()
        self.wake = asyncio.Event()
        self.full_resync = True
        # The status last written per AgentRun: kopf's index lags behind our own patches, and comparing
        # against it would repeat patches and Events.
        self.sent: dict[uuid.UUID, dict[str, Any]] = {}
        self.expiry: dict[uuid.UUID, datetime.datetime] = {}
        self._lock = asyncio.Lock()  # handlers and the loop both publish; one at a time per process

    # -- what the rest of the operator calls ------------------------------------------------------

    def notify(self, run_id: uuid.UUID) -> None:
        self.pending.add(run_id)
        self.wake.set()

    def resync(self) -> None:
        self.full_resync = True
        self.wake.set()

    def forget(self, run_id: uuid.UUID) -> None:
        """The AgentRun is gone: drop what we remember of it."""
        self.pending.discard(run_id)
        self.sent.pop(run_id, None)
        self.expiry.pop(run_id, None)

    async def publish(self, run: Run, ref: Ref) -> None:
        """Show the run in its AgentRun's status if that changes anything; post an Event on a new phase."""
        async with self._lock:
            await self._publish(run, ref)

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        next_sweep = time.monotonic()
        backoff = 0.5
        while True:
            timeout = max(0.0, min(next_sweep - time.monotonic(), self._seconds_to_expiry()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.wake.wait()
                    # Fold the burst: a running run notifies on every step and lease renewal.
                    await asyncio.sleep(self.settings.debounce_seconds)
            self.wake.clear()
            ids, self.pending = self.pending, set()
            sweep = self.full_resync or time.monotonic() >= next_sweep
            try:
                await self._flush(ids, sweep)
                await self._expire()
                backoff = 0.5
                if sweep:
                    self.full_resync = False
                    next_sweep = time.monotonic() + self.settings.resync_seconds
            except (psycopg.Error, psycopg_pool.PoolTimeout, KubeError) as e:
                log.warning("status sync failed: %s; retrying in %.1fs", e, backoff)
                self.pending |= ids
                self.full_resync = self.full_resync or sweep
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                self.wake.set()

    async def _flush(self, ids: set[uuid.UUID], sweep: bool) -> None:
        if sweep:
            # Unfinished runs, and runs whose AgentRun still shows them unfinished (a finish whose
            # notification was lost): one query each, however many AgentRuns there are.
            runs = {r.id: r for r in await self.store.unfinished_linked()}
            stale: set[uuid.UUID] = set()
            for ref in self.refs():
                shown = self._shown(ref)
                if ref.uid not in runs and shown.get("phase") not in mapping.FINISHED_PHASES:
                    stale.add(ref.uid)
                self._track_expiry(ref, shown)
            ids = (ids | stale) - runs.keys()
        else:
            runs = {}
        if ids:
            runs.update({r.id: r for r in await self.store.get_many(list(ids))})
        for run in runs.values():
            linked = self.lookup(run.id)
            if linked is not None:  # not ours (another namespace), or deleted meanwhile
                await self.publish(run, linked)

    async def _publish(self, run: Run, ref: Ref) -> None:
        old = self._shown(ref)
        waits_for_people = run.status is RunStatus.WAITING and run.waiting_for not in ("children", "timer", "event")
        pending = await self.store.decisions(run.id) if waits_for_people else []
        # Only a run with sub-agents has children to count (and totals beyond its own).
        children = await self.store.children_counts(run.id) if run.sub_agents else None
        new = mapping.run_status(run, ref.generation, old, datetime.datetime.now(datetime.UTC), pending, children)
        if mapping.visible_change(old, new):
            # The Events first, then the phase: whoever sees a phase finds its Event already there, and
            # one that cannot be posted is retried with the patch (a failed patch may repeat an Event:
            # at least once, never lost).
            for event in [*mapping.phase_events(old.get("phase"), run), *mapping.decision_events(old, new)]:
                await self.kube.event(ref.namespace, ref.name, ref.uid, *event, strict=True)
            if not await self.kube.patch_status(ref.namespace, ref.name, mapping.status_patch(old, new)):
                self.forget(ref.uid)
                return
            self.sent[ref.uid] = new
        self._track_expiry(ref, self._shown(ref))

    def _shown(self, ref: Ref) -> dict[str, Any]:
        return self.sent.get(ref.uid) or dict(ref.status)

    # -- ttlSecondsAfterFinished ------------------------------------------------------------------

    def _track_expiry(self, ref: Ref, status: dict[str, Any]) -> None:
        at = mapping.expires_at(ref, status)
        if at is not None:
            self.expiry[ref.uid] = at

    def _seconds_to_expiry(self) -> float:
        if not self.expiry:
            return float("inf")
        soonest = min(self.expiry.values())
        return (soonest - datetime.datetime.now(datetime.UTC)).total_seconds()

    async def _expire(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        for uid, at in list(self.expiry.items()):
            if at > now:
                continue
            del self.expiry[uid]
            ref = self.lookup(uid)
            if ref is not None:
                log.info("deleting %s/%s: finished and past ttlSecondsAfterFinished", ref.namespace, ref.name)
                await self.kube.delete(ref.namespace, ref.name)
