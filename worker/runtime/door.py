"""The one door for a new run. Whichever way it comes in (the API's create, continue and fork, an AgentRun, a
schedule's tick, a parent's sub-agent call), its agent is resolved, the submission policy applied, its agent
and sub-agents pinned, the way it came recorded as its `origin`, and it is written by the one statement that
inserts into `run` (store/insert.py). Nothing else makes a run: the architecture test holds the code to it.
A replay's runs come in by it too (`Door.replay`), each planned as any run, all written with their replay."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Sequence

from agentrun.worker.core.agents import Agent, planned
from agentrun.worker.core.errors import Refused
from agentrun.worker.core.recording import NewReplay, refused_for, replay_spec, unfit_sources
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

    async def replay(
        self, replay: NewReplay, recorded: Sequence[Run], caller: Caller, *, defaults: Defaults = Defaults(),
        offer: Offer = Offer(),
    ) -> tuple[uuid.UUID, bool]:
        """Make a replay: one run per recorded run (looked up by the caller, in its order), all written with
        the `replay` row in one transaction, or none. Returns the replay's id and whether this call made it:
        a replay with the same id or the caller's tenant's Idempotency-Key (`replay.idempotency_key`; the
        caller's own is not used) is returned as it is, and nothing made.

        Each run is planned as any run (Origin.REPLAY, the caller's tenant and identity): its source is the
        recorded run, whose fields it inherits, with the change applied (`core/recording.replay_spec`: a
        fork of the recorded run when it keeps some of its steps); it carries `replay_id`, `replay_of` and
        the tool policy, and no webhook (a replay tells nobody outside). Raises Refused, its fields named as
        the replay's request names them (`change.model`, `fromSeq`, `runs[2]`, ...): a recorded run of
        another tenant, unfinished or listed twice (core/recording.unfit_sources), a bad change or fromSeq;
        OverQuota if the tenant's quotas refuse one of the runs; ValueError for a text that cannot be
        stored (as `submit`)."""
        tenant = caller.tenant or (recorded[0].tenant if recorded else DEFAULT_TENANT)
        if (first := await self.store.first_replay(replay, tenant)) is not None:
            return first, False
        unfit_sources(recorded, tenant)
        # The replay's Idempotency-Key and id are the replay's, not each of its runs'.
        as_caller = dataclasses.replace(caller, tenant=tenant, idempotency_key=None, id=None)
        runs = []
        for i, run in enumerate(recorded):
            try:
                spec = replay_spec(replay, run)
                # The agent is resolved as for a new run, and the fork set again after: a replay may change
                # the agent of a run it keeps some steps of, which a fork requested by a client may not.
                applied, agent, sub_agents = await self.store.for_run(dataclasses.replace(spec, fork_from=None), tenant)
                applied = dataclasses.replace(applied, fork_from=spec.fork_from)
                new = planned((applied, agent, sub_agents), run, Origin.REPLAY, as_caller, defaults, offer)
            except Refused as e:
                raise refused_for(e, i) from e
            runs.append(dataclasses.replace(new, replay_id=replay.id, replay_of=run.id,
                                            tool_policy=replay.tool_policy.value, webhook=None))
        return await self.store.create_replay(replay, tenant, caller.created_by, runs)

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
