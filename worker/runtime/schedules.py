"""The ticker: one task per worker process that starts the runs of due schedules (store/schedules.py
holds the exactly-once part). Idle it costs one statement per wake-up: the earliest due time, from an
index; it sleeps until then, a few seconds at most (a schedule created or resumed meanwhile is seen
within that bound)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import random

from agentrun.worker.core.observer import NoObserver, Observer
from agentrun.worker.core.records import NewRun, Origin
from agentrun.worker.core.schedules import Schedule, run_id_for, spec_of
from agentrun.worker.core.submission import Caller, Defaults
from agentrun.worker.runtime.door import Door
from agentrun.worker.runtime.tasks import honour_cancel
from agentrun.worker.store import RunStore
from agentrun.worker.store.schedules import Tick

log = logging.getLogger("agentrun.worker.runtime.schedules")

MAX_SLEEP = 2.0
"""The longest the ticker sleeps between looks at the due times."""


class Ticker:
    def __init__(self, store: RunStore, worker_id: str, default_model: str, observer: Observer | None = None,
                 max_sleep: float = MAX_SLEEP) -> None:
        self.store, self.worker_id, self.observer = store, worker_id, observer or NoObserver()
        self.door = Door(store)
        # The template was checked as a submission when the schedule was stored; budgets are in it.
        self.defaults = Defaults(model=default_model)
        self.max_sleep = max_sleep

    async def plan(self, s: Schedule, tick: datetime.datetime) -> NewRun:
        """The run of `s`'s tick at `tick`: its template planned by the door as a submission is, its id the tick's."""
        caller = Caller(id=run_id_for(s.name, tick, s.tenant), schedule_name=s.name, scheduled_time=tick,
                        created_by=s.created_by or f"schedule:{s.name}", tenant=s.tenant)
        return await self.door.plan(spec_of(s.spec), Origin.SCHEDULE, caller, defaults=self.defaults)

    async def once(self) -> list[Tick]:
        """One pass over the due schedules."""
        ticks = await self.door.tick(self.plan)
        created = sum(t.outcome == "created" for t in ticks)
        missed = sum(t.missed for t in ticks)
        if created or missed:
            self.observer.schedule_ticked(created, missed)
        for t in ticks:
            if t.outcome == "created":
                log.info("%s schedule=%s tick=%s run=%s", self.worker_id, t.schedule, t.scheduled_time,
                         t.run_id.hex[:8] if t.run_id else None)
            elif t.outcome == "failed":
                log.warning("%s schedule=%s: %s", self.worker_id, t.schedule, t.error)
            elif t.outcome == "stopped":
                log.error("%s schedule=%s %s", self.worker_id, t.schedule, t.error)
            if t.missed:
                log.info("%s schedule=%s missed %d tick(s)", self.worker_id, t.schedule, t.missed)
        return ticks

    async def run(self) -> None:
        """Until cancelled: sleep until the earliest due time (bounded), take what is due, repeat."""
        backoff = 0.5
        while True:
            try:
                wait = await self.store.next_due_in()
                if wait is not None and wait <= 0:
                    await self.once()
                    wait = await self.store.next_due_in()
                backoff = 0.5
            except Exception as e:  # an outage: the ticks wait in the table, nothing is lost
                honour_cancel(e)
                log.warning("%s schedules: %s; retrying in %.1fs", self.worker_id, str(e) or type(e).__name__, backoff)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, 5.0)
                continue
            sleep = self.max_sleep if wait is None else min(max(wait, 0.0) + 0.005, self.max_sleep)
            honour_cancel()
            await asyncio.sleep(sleep)
