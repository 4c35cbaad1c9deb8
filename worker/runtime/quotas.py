"""Tenants' daily budgets before each model step: a run whose tenant has spent its tokens or cost of the last
1,440 minutes is handed back until the window allows again (never failed; its own deadline still ends it)."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable

from agentrun.worker.core.records import Run
from agentrun.worker.core.tenants import Throttle
from agentrun.worker.runtime.durable import Durable
from agentrun.worker.store import LeaseLost
from agentrun.worker.store.tenants import Tenants

log = logging.getLogger("agentrun.worker.runtime.engine")

FRESH_FOR = 1.0
"""Seconds a tenant found within its budgets is trusted without asking again: a change of its quotas, or its
spending, is seen by every worker within a second, at one query per tenant and second per worker."""


class Budgets:
    """The check before a model step, and the hand-back when it fails. A tenant found within its budgets is
    cached FRESH_FOR seconds; one found over them is asked again before each hand-back, so a run is never held
    back on a stale answer (a quota raised, a window moved on)."""

    def __init__(self, durable: Durable, tenants: Tenants, clock: Callable[[], float] = time.monotonic) -> None:
        self.durable, self.tenants, self.clock = durable, tenants, clock
        self._within: dict[str, float] = {}
        """Tenants found within their budgets, and when (clock)."""

    async def over(self, run: Run) -> Throttle | None:
        """The daily budget the run's tenant is at or over now, with when the window allows again; None if
        it may take its model step."""
        now = self.clock()
        if now - self._within.get(run.tenant, -FRESH_FOR) < FRESH_FOR:
            return None
        found = (await self.tenants.over_budget([run.tenant])).get(run.tenant)
        if found is None:
            if len(self._within) > 10_000:  # tenants come and go: forget the old answers rather than grow
                self._within = {t: at for t, at in self._within.items() if now - at < FRESH_FOR}
            self._within[run.tenant] = now
        return found

    async def hand_back(self, run: Run, throttle: Throttle) -> None:
        """Hand the held run back until `throttle.until` (its deadline, if sooner: a claim then ends it
        TIMED_OUT), with `throttled` saying why; LeaseLost if it was not held under this claim any more.
        If the worker dies before this commits, the run is still RUNNING under its lease: whoever claims it
        next checks the budget again before the same model step."""
        if not await self.durable.write(lambda again: self.tenants.throttle(
            run.id, self.durable.me, throttle, epoch=run.lease_epoch, again=again,
        )):
            raise LeaseLost(run.id, self.durable.me)
        until = throttle.until.isoformat() if isinstance(throttle.until, datetime.datetime) else "its deadline"
        log.info("%s run=%s handed back: its tenant %s is at its %s, until %s", self.durable.me, run.id.hex[:8],
                 run.tenant, throttle.quota, until)
