"""The engine's part for people in the loop: calls that need a person's approval, calls in doubt after a
crash (asked of the tool's reconcile probe first), what people decided, and the run parked for them."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from agentrun.worker.core import children as sub
from agentrun.worker.core.answer import FINAL_ANSWER
from agentrun.worker.core.decisions import Key, Next, Park, key_of, next_call
from agentrun.worker.core.guard import Stop
from agentrun.worker.core.observer import Observer
from agentrun.worker.core.records import Decision, DecisionKind, PendingCall, Run, RunStatus
from agentrun.worker.core.replay import Conversation
from agentrun.worker.runtime.durable import Durable, dumps, log
from agentrun.worker.runtime.lease import CancelRequested, LeaseKeeper
from agentrun.worker.store.decisions import Decisions
from agentrun.worker.tools import ToolBox, ToolContext

Decided = dict[Key, PendingCall]

AGAIN: Literal["again"] = "again"
"""What `next` answers when what was decided changed (read, or settled by a probe): look at the calls again."""


class People:
    def __init__(self, durable: Durable, store: Decisions, keeper: LeaseKeeper, tools: ToolBox,
                 observer: Observer) -> None:
        self.durable = durable
        self.store = store
        self.keeper = keeper
        self.tools = tools
        self.observer = observer
        # What people decided about each run's calls, read once when a call needs a decision, per drive.
        self._decisions: dict[uuid.UUID, Decided] = {}
        # Calls in doubt whose reconcile probe could not tell, per drive: asked once, then a person is.
        self._unsettled: dict[uuid.UUID, set[Key]] = {}

    def forget(self, run_id: uuid.UUID) -> None:
        """What was read and probed for the run goes: read again when next needed (its drive ended, or its
        loop starts again after a message or a refused finish)."""
        self._decisions.pop(run_id, None)
        self._unsettled.pop(run_id, None)

    def known(self, run_id: uuid.UUID) -> Decided | None:
        """What people decided about the run's calls, if it was read in this drive."""
        return self._decisions.get(run_id)

    def approved(self, run: Run, use: dict[str, Any], decided: Decided | None) -> bool:
        """Whether a call may go ahead as far as people are concerned: it needs no approval, or has it."""
        if not self.needs_approval(run, use["name"]):
            return True
        found = (decided or {}).get((use["id"], DecisionKind.APPROVAL, 0))
        return found is not None and found.decision is Decision.APPROVE

    def unasked(self, run: Run, calls: list[dict[str, Any]], conv: Conversation) -> list[dict[str, Any]]:
        """`calls`, the calls a model turn asks for, if the engine will run them all next, one after another,
        with nobody to ask and nothing to decide; else none. Each must be a tool this run may call, that is
        idempotent and needs no approval, not a sub-agent nor the structured answer, in a run that is no
        replay, and the step cap must leave room for them all. The turn's checkpoint then writes their
        STARTED rows (store/steps.py `checkpoint_turn`), as `_tool_step` would just before each runs, one
        round trip sooner: a worker that dies in between leaves a row STARTED, as after a write of its own,
        and the call runs again."""
        if not calls or run.replay_id is not None:
            return []
        if conv.steps + 1 - run.inherited_steps + len(calls) > run.max_steps:  # the guard's cap (core/guard.py)
            return []
        agents = sub.refs_by_tool(run.sub_agents)
        for use in calls:
            name = use["name"]
            tool = self.tools.get(name)
            if (tool is None or not tool.idempotent or name == FINAL_ANSWER or name in agents
                    or (run.tools is not None and name not in run.tools) or self.needs_approval(run, name)):
                return []
        return calls

    def needs_approval(self, run: Run, name: str) -> bool:
        tool = self.tools.get(name)
        return (tool is not None and tool.requires_approval) or run.needs_approval(name)

    def not_idempotent(self, name: str) -> bool:
        tool = self.tools.get(name)
        return tool is not None and not tool.idempotent

    async def next(self, run: Run, conv: Conversation, owed: list[dict[str, Any]]) -> Next | Literal["again"]:
        """The next thing to do about the calls owed (core/decisions.next_call), with what people decided;
        AGAIN once that was read, or a reconcile probe settled a call. Raises CancelRequested if the run
        was asked to stop during a probe."""
        decided = self._decisions.get(run.id)
        step = next_call(
            owed, {u: conv.attempts[u] for u in conv.started},
            in_doubt_if_started=self.not_idempotent,
            needs_approval=lambda name: self.needs_approval(run, name),
            decisions=decided or {},
        )
        assert step is not None, "a call is owed"
        if isinstance(step, Park) and decided is None:  # nothing decided was known: look at what people said
            known = await self.store.decisions(run.id)
            self.observer.decisions_read(run, known)
            self._decisions[run.id] = {key_of(d): d for d in known}
            return AGAIN
        if isinstance(step, Park) and decided is not None:
            if await self.reconcile(run, step, decided):  # a probe settled a call: act on its decision
                return AGAIN
        return step

    async def park(self, run: Run, step: Park) -> Stop | None:
        """Park the run for people: WAITING, one pending decision per call, no lease held (None); or, asked
        to stop while still held, its end (CANCELLED, no one asked)."""
        me = self.durable.me
        held = self.keeper.set_aside(run.id)
        calls = [(use["id"], kind, use["name"], dumps(use.get("input")), attempt) for use, kind, attempt in step.calls]
        try:
            await self.durable.write(lambda again: self.store.park(run.id, me, calls, epoch=run.lease_epoch,
                                                                   again=again))
        except CancelRequested:
            self.keeper.take_back(run.id, held)
            return Stop(RunStatus.CANCELLED, "cancel requested")
        self.observer.parked(run, [(tool_use_id, kind, name) for tool_use_id, kind, name, _, _ in calls])
        log.info(
            "%s run=%s waiting for %d decisions: %s", me, run.id.hex[:8], len(calls),
            ", ".join(f"{name} {tool_use_id} ({kind.value}{f' after attempt {attempt}' if attempt else ''})"
                      for tool_use_id, kind, name, _, attempt in calls),
        )
        return None

    async def reconcile(self, run: Run, park: Park, decided: Decided) -> bool:
        """Ask the reconcile probes of the calls in doubt that have one, before a person is asked: whether
        the call was done (its result is recorded) or not (it runs again). What a probe found is stored as
        the decision at that attempt (`decided_by` "reconcile") before it is acted on, so a crash after
        it neither loses nor repeats it. Returns whether any call was settled so."""
        settled = False
        unsettled = self._unsettled.setdefault(run.id, set())
        for use, kind, attempt in park.calls:
            key = (use["id"], kind, attempt)
            if kind is not DecisionKind.IN_DOUBT or key in unsettled:
                continue
            name = use["name"]
            ctx = ToolContext(run.id, use["id"], run.lease_epoch)
            probe = self.tools.reconcile_probe(name)
            if probe is None:
                continue
            found = await self.keeper.interruptible(run.id, probe(use.get("input"), ctx))
            if found.done is None:
                unsettled.add(key)
                log.info("%s run=%s TOOL %s id=%s in doubt, its reconcile probe cannot tell: %s", self.durable.me,
                         run.id.hex[:8], name, use["id"], found.output)
                continue
            stored = await self._store_probed(run, use, attempt, found.done, found.output)
            unsettled.add(key)  # probed once per drive, whatever it found
            decided[key] = stored
            settled = settled or stored.decision is not None
        return settled

    async def _store_probed(
        self, run: Run, use: dict[str, Any], attempt: int, done: bool, output: str
    ) -> PendingCall:
        """A probe's answer as the decision on the call at `attempt`: done is `record` (its result), not done
        is `retry`. Returns the decision stored (one stored before, after a crash, wins)."""
        me = self.durable.me
        decision = Decision.RECORD if done else Decision.RETRY
        why = f"the tool's reconcile probe found the call {'done' if done else 'not done'}"
        stored = await self.durable.write(lambda again: self.store.reconcile(
            run.id, me, self.durable.lease_seconds, epoch=run.lease_epoch, again=again, tool_use_id=use["id"],
            tool_name=use["name"],
            input=dumps(use.get("input")), attempt=attempt, decision=decision, output=output if done else None,
            reason=why,
        ))
        log.info("%s run=%s TOOL %s id=%s in doubt after attempt %d: %s (%s)", me, run.id.hex[:8],
                 use["name"], use["id"], attempt, why, stored.decision.value if stored.decision else "undecided")
        return stored
