"""The engine's part for durable waits: a call that waits for a timer or an event parks the run, holding no
lease and no slot, and its result is recorded once the wait has ended."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from typing import Any, Literal

from agentrun.worker.core import waits
from agentrun.worker.core.records import Progress, Run
from agentrun.worker.core.replay import Conversation
from agentrun.worker.runtime.durable import Durable, log
from agentrun.worker.runtime.lease import LeaseKeeper
from agentrun.worker.store.waits import Waits as WaitStore
from agentrun.worker.store.waits import WaitState


class Waits:
    def __init__(self, durable: Durable, store: WaitStore, keeper: LeaseKeeper, event_retention: float, *,
                 parked: Callable[[], None]) -> None:
        self.durable = durable
        self.store = store
        self.keeper = keeper
        self.event_retention = event_retention
        # The last wait of each run driven (a timer or an event), read once per drive when a call is owed.
        self._waits: dict[uuid.UUID, WaitState | None] = {}
        self.parked = parked
        """Called when a run parks for a timer or an event: the worker's sweep looks at its wake time."""

    def forget(self, run_id: uuid.UUID) -> None:
        """The run's drive has ended: what was read for it goes."""
        self._waits.pop(run_id, None)

    async def ended(
        self, run: Run, conv: Conversation, owed: list[dict[str, Any]]
    ) -> Progress | None | Literal[False]:
        """The result of a wait the run parked for (a timer or an event), once it has ended: recorded as the
        call's step, once (the tool_use id is its key: a crash before the write leaves the wait's row to
        decide it again, the same way); a wait not ended yet parks the run again (None). False: no call
        owed is a wait that was parked."""
        if not any(u["id"] in conv.started for u in owed):  # a parked wait's call has its STARTED row
            return False
        if run.id not in self._waits:
            self._waits[run.id] = await self.store.wait_state(run.id)
        state = self._waits[run.id]
        use = next((u for u in owed if state is not None and u["id"] == state.tool_use_id), None)
        if state is None or use is None:
            return False
        settle = self.durable.settle
        if state.key is None:
            if state.due:
                return await settle(run, conv, use, True, waits.waited((state.now - state.since).total_seconds()))
            return await self.park(run, conv, use, waits.WaitForTimer(until=state.wake_at))
        if state.event_id is not None:
            return await settle(run, conv, use, True, waits.delivered(state.payload))
        if state.due:
            return await settle(run, conv, use, False, waits.timed_out(state.key))
        return await self.park(run, conv, use, waits.WaitForEvent(state.key, 0.0), at=state.wake_at)

    async def park(
        self, run: Run, conv: Conversation, use: dict[str, Any], wait: waits.WaitRequest,
        at: datetime.datetime | None = None,
    ) -> Progress | None:
        """Park the run WAITING for a call's timer or event, holding no lease and no slot (None); an event
        on the key kept from before is the call's result at once, the run still held."""
        me = self.durable.me
        held = self.keeper.set_aside(run.id)
        if isinstance(wait, waits.WaitForTimer):
            await self.durable.write(lambda again: self.store.park_timer(
                run.id, me, use["id"], seconds=wait.seconds, at=wait.until or at, epoch=run.lease_epoch,
                again=again,
            ))
            self.parked()
            log.info("%s run=%s TOOL %s id=%s waiting for a timer (%s)", me, run.id.hex[:8], use["name"],
                     use["id"], f"{wait.seconds:g}s" if wait.seconds is not None else (wait.until or at))
            return None
        got, payload = await self.durable.write(lambda again: self.store.park_event(
            run.id, me, use["id"], wait.key, retention=self.event_retention,
            seconds=wait.timeout_seconds, at=at, epoch=run.lease_epoch, again=again,
        ))
        if not got:
            self.parked()
            log.info("%s run=%s TOOL %s id=%s waiting for event %r", me, run.id.hex[:8], use["name"],
                     use["id"], wait.key)
            return None
        self.keeper.take_back(run.id, held)
        log.info("%s run=%s TOOL %s id=%s event %r was kept already", me, run.id.hex[:8], use["name"],
                 use["id"], wait.key)
        return await self.durable.settle(run, conv, use, True, waits.delivered(payload))
