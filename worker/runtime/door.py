"""The one door for a new run. Whichever way it comes in (the API's create, continue and fork, an AgentRun, a
schedule's tick, a parent's sub-agent call), its agent is resolved, the submission policy applied, its agent
and sub-agents pinned, the way it came recorded as its `origin`, and it is written by the one statement that
inserts into `run` (store/insert.py). Nothing else makes a run: the architecture test holds the code to it."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Sequence

from agentrun.worker.core.agents import Agent, planned
from agentrun.worker.core.records import NewRun, Origin, Run
from agentrun.worker.core.schedules import Schedule
from agentrun.worker.core.submission import Caller, Defaults, Offer, RunSpec
from agentrun.worker.core.tenants import DEFAULT_TENANT
from agentrun.worker.store import RunStore
from agentrun.worker.store.schedules import Planner, Tick


@dataclasses.dataclass(frozen=True)
class Submitted:
    """A run the door was asked for: the run, whether this call made it, and what it asked for."""

    run: Run
    created: bool
    new: NewRun


class Door:
    """Every way a run is made, over the store."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    async def plan(
        self, spec: RunSpec, origin: Origin, caller: Caller = Caller(), *, source: Run | None = None,
        agent: Agent | None = None, defaults: Defaults = Defaults(), offer: Offer = Offer(),
    ) -> NewRun:
        """The run `spec` asks for as it would be written, without writing it (a schedule's template is
        checked so). Raises Refused: an unknown agent or sub-agent, or what the policy refuses.

        `source` is the run it continues or forks, looked up by the caller (each way in tells a missing one
        its own way). `agent` is a sub-agent's, already applied to `spec` with the budgets its parent carved
        (its parent pinned the version, which runs even if deleted since)."""
        tenant = caller.tenant or (source.tenant if source is not None else DEFAULT_TENANT)
        resolved = await self.store.for_run(spec, tenant)
        if agent is not None:
            resolved = (resolved[0], agent, resolved[2])
        return planned(resolved, source, origin, caller, defaults, offer)

    async def submit(
        self, spec: RunSpec, origin: Origin, caller: Caller = Caller(), *, source: Run | None = None,
        defaults: Defaults = Defaults(), offer: Offer = Offer(),
    ) -> Submitted:
        """Plan a run and write it, alone in its transaction (the API, the operator). A run with the same
        id (the operator retrying) or idempotency key (a client retrying) is returned as it is, not made
        again. Raises Refused as `plan`, ValueError naming a text that cannot be stored."""
        new = await self.plan(spec, origin, caller, source=source, defaults=defaults, offer=offer)
        run, created = await self.store.create(new)
        return Submitted(run, created, new)

    async def tick(self, plan: Planner) -> list[Tick]:
        """One pass of the schedules: each due one's run made in the transaction that moves it on to its next
        tick (store/schedules.py). `plan` makes a tick's run with `self.plan` (Origin.SCHEDULE)."""

        async def checked(s: Schedule, at: datetime.datetime) -> NewRun:
            return _through_the_door(await plan(s, at), Origin.SCHEDULE)

        return await self.store.tick(checked)

    async def spawn(
        self, parent: uuid.UUID, worker: str, children: Sequence[NewRun], *, epoch: int | None, again: bool = False,
    ) -> bool:
        """Make the children a held parent's calls start (each planned by `self.plan`, Origin.CHILD) and park
        the parent waiting for them, in one fenced statement (store/children.py: what it returns and raises)."""
        made = [_through_the_door(new, Origin.CHILD) for new in children]
        return await self.store.spawn(parent, worker, made, epoch=epoch, again=again)


def _through_the_door(new: NewRun, origin: Origin) -> NewRun:
    """`new`, planned by the door for that way in: one made otherwise is refused before it is written."""
    if new.origin is not origin:
        raise ValueError(f"a run made by {origin.value} not planned by the door (origin {new.origin})")
    return new
