"""The driver: takes a claimed run from its last checkpoint to the end, one checkpointed step at a time.

guard ▶ next step (a tool the model asked for, else the model) ▶ checkpoint, until the run finishes or
the worker must let go of it. Resuming after a crash is the same code path as continuing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any, Literal, TypeVar

import orjson
import psycopg

from agentrun.worker.core import children as sub
from agentrun.worker.core import context, waits
from agentrun.worker.core.agents import Agent, with_agent
from agentrun.worker.core.answer import FINAL_ANSWER, MAX_CORRECTIONS, answer_of, problem, system_sent, tools_sent
from agentrun.worker.core.children import MAX_CHILDREN_PER_TURN, MAX_DEPTH
from agentrun.worker.core.decisions import Execute, Fail, Key, Park, Settle, key_of, next_call
from agentrun.worker.core.errors import Refused
from agentrun.worker.core.guard import Stop, deadline_passed, final, guard, remaining
from agentrun.worker.core.observer import NO_NOTES, UNKNOWN_TOOL, NoObserver, Observer, StepNotes
from agentrun.worker.core.pricing import Limits, PriceTable
from agentrun.worker.core.records import (
    Decision,
    DecisionKind,
    ModelTurn,
    NewRun,
    Origin,
    PendingCall,
    Progress,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from agentrun.worker.core.replay import CORRECTION, Conversation, dump_content
from agentrun.worker.core.submission import Caller, Offer, RunSpec
from agentrun.worker.core.text import clean, clean_json
from agentrun.worker.core.types import LlmClient, LlmError, LlmRequest, LlmResponse, Message, ServerContext, Usage
from agentrun.worker.llm.providers import BUILTIN, split
from agentrun.worker.obs import logs
from agentrun.worker.runtime.deltas import DeltaPublisher
from agentrun.worker.runtime.door import Door
from agentrun.worker.runtime.lease import CancelRequested, LeaseKeeper
from agentrun.worker.store import LeaseLost, RunStore
from agentrun.worker.store.groupcommit import transient
from agentrun.worker.store.waits import WaitState
from agentrun.worker.tools import ToolBox, ToolContext

log = logging.getLogger("agentrun.worker.runtime.engine")

T = TypeVar("T")

ANSWER_REMINDER = "You ended without calling final_answer. Call final_answer with your answer now."


@dataclasses.dataclass(frozen=True)
class DriverSettings:
    worker_id: str
    lease_seconds: float = 30.0
    max_tokens: int = 4096
    """The `max_tokens` of every model request."""
    max_crash_claims: int = 10
    """Claims after a holder died mid-step before the run ends FAILED (WorkerSettings.max_crash_claims)."""
    max_agent_depth: int = MAX_DEPTH
    max_children_per_turn: int = MAX_CHILDREN_PER_TURN
    event_retention: float = 86400.0
    """Seconds an event is kept and delivered to waits that begin after it (AGENTRUN_EVENT_RETENTION)."""
    outage_backoff_base: float = 10.0
    outage_backoff_cap: float = 300.0
    """A model step whose every attempt failed on a retryable error (the API is down or overloaded for
    longer than the client's retries) hands the run back for base × 2^n seconds (n: such failures in a
    row), capped, the upper half jittered so a fleet does not stampede the API when it recovers."""


def outage_backoff(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds before a run handed back in a model API outage may be claimed again (equal jitter)."""
    ceiling: float = min(cap, base * 2.0 ** min(failures, 32))
    return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


SERVER_TRIGGER = 150_000
"""The compaction trigger of `server` for a model whose window the price table does not name (the API's own)."""


def _strategy(asked: str, model: str, limits: Limits | None) -> str:
    """The strategy a run's policy comes to for its model: `auto` is `server` where the provider compacts the
    model's conversations (the Messages API, for a model the price table marks `server_compaction`), else
    `summarize`. `server` on a provider that has no such thing is refused before the request is sent."""
    messages_api = split(model).provider in BUILTIN
    if asked == "auto":
        return "server" if messages_api and limits is not None and limits.server_compaction else "summarize"
    if asked == "server" and not messages_api:
        raise context.DoesNotFit(
            f"contextManagement strategy server needs a provider that compacts the conversation itself (the "
            f"Messages API: {', '.join(BUILTIN)}); {model} is served by an OpenAI-compatible endpoint: use auto, "
            "summarize or clear_tool_results")
    return asked


def _hint(strategy: str) -> str:
    if strategy == "none":
        return ": choose auto, summarize or clear_tool_results to keep long runs going"
    return ", which cannot shrink it further: the newest turns alone are too long"


def _context_notes(
    strategy: str, estimate: int, limits: Limits | None, response: LlmResponse, compacted_at: int | None
) -> dict[str, Any]:
    """What a MODEL step's request summary says about the window: the strategy, the engine's estimate, the
    COMPACT step whose summary or placeholders the request was sent with, the provider's count of what the
    model saw (replay's base for the next estimate) and its own compaction."""
    notes: dict[str, Any] = {"strategy": strategy, "estimatedTokens": estimate}
    if compacted_at is not None:
        notes["compactedAt"] = compacted_at
    if limits is not None:
        notes["window"] = limits.context_window
    if response.context_tokens:
        notes["contextTokens"] = response.context_tokens
    if any(isinstance(b, dict) and b.get("type") == "compaction" for b in response.content):
        notes["compacted"] = True
    cleared = sum(e.get("cleared_tool_uses", 0) for e in response.applied_edits
                  if isinstance(e.get("cleared_tool_uses"), int))
    if cleared:
        notes["clearedToolUses"] = cleared
    return notes


def _since_last_assistant(messages: list[Message]) -> list[Message]:
    i = len(messages)
    while i > 0 and messages[i - 1]["role"] != "assistant":
        i -= 1
    return messages[i:]


class RunDriver:
    def __init__(
        self,
        settings: DriverSettings,
        store: RunStore,
        llm: LlmClient,
        tools: ToolBox,
        prices: PriceTable,
        keeper: LeaseKeeper,
        stopping: asyncio.Event | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.door = Door(store)  # how its sub-agents' runs are made
        self.llm = llm
        self.tools = tools
        self.prices = prices
        self.keeper = keeper
        self.stopping = stopping or asyncio.Event()
        self.observer: Observer = observer or NoObserver()
        self._rng = random.Random()
        # What people decided about each run's calls, read once when a call needs a decision, per drive.
        self._decisions: dict[uuid.UUID, dict[Key, PendingCall]] = {}
        # Calls in doubt whose reconcile probe could not tell, per drive: asked once, then a person is.
        self._unsettled: dict[uuid.UUID, set[Key]] = {}
        # The pinned sub-agents of each run driven, by tool name, read once per drive.
        self._agents: dict[uuid.UUID, dict[str, Agent]] = {}
        # The last wait of each run driven (a timer or an event), read once per drive when a call is owed.
        self._waits: dict[uuid.UUID, WaitState | None] = {}
        self.parked_wait: Callable[[], None] = lambda: None
        """Called when a run parks for a timer or an event: the worker's sweep looks at its wake time."""
        self.deltas = DeltaPublisher(store.pool)  # the text of a call in flight, for live watchers only

    @property
    def me(self) -> str:
        return self.settings.worker_id

    async def drive(
        self, run: Run, progress: Progress, *, fresh: bool = False, leased_at: float | None = None
    ) -> RunStatus | None:
        """Drive a claimed run until it ends (its final status) or is handed back (None).

        `fresh`: the run was claimed QUEUED with no step (Claim.fresh), so there is no step log to read.
        `leased_at`: when its claim was sent (Claim.sent_at), which the heartbeat counts its lease from.

        Raises LeaseLost if another worker took the run; lets database errors and BaseExceptions
        through, leaving the run to whichever worker claims it next.
        """
        task = asyncio.current_task()
        assert task is not None
        self.keeper.hold(run.id, task, run.lease_epoch, since=leased_at)
        try:
            with logs.step_context(run_id=str(run.id)), self.observer.driving(run):
                return await self._resume(run, progress, fresh)
        except asyncio.CancelledError:
            if self.keeper.lost(run.id):
                task.uncancel()
                raise LeaseLost(run.id, self.me) from None
            raise
        finally:
            self.keeper.forget(run.id)
            self._decisions.pop(run.id, None)
            self._unsettled.pop(run.id, None)
            self._agents.pop(run.id, None)
            self._waits.pop(run.id, None)

    async def _resume(self, run: Run, progress: Progress, fresh: bool) -> RunStatus | None:
        if run.crashes >= self.settings.max_crash_claims:
            failed = await self._finish(run, Stop(
                RunStatus.FAILED,
                f"the run was taken over {run.crashes} times from a worker that died or lost its lease mid-step "
                f"(at most {self.settings.max_crash_claims}): a step of it may be killing its workers",
            ))
            assert isinstance(failed, RunStatus)  # only a success waits for messages
            return failed
        # A queued run with no step yet (most claims, in a busy fleet) has nothing to replay: no read.
        # Only a claim of a QUEUED run may say so: no holder can be writing to it meanwhile.
        steps = [] if fresh else await self.store.steps(run.id)
        conv = Conversation.replay(run.input, steps)
        if steps:
            log.info("%s run=%s resumed at seq=%d", self.me, run.id.hex[:8], self._resume_seq(steps))
        # The deadline interrupts a step in flight, never the finishing write: _loop only decides.
        deadline_at = asyncio.get_running_loop().time() + max(remaining(run, progress.db_now), 0)
        while True:
            try:
                async with asyncio.timeout_at(deadline_at) as deadline:
                    stop = await self._loop(run, progress, conv)
            except TimeoutError:
                if not deadline.expired():
                    raise
                stop = deadline_passed(run)
            if stop is None:
                return None
            sent = time.monotonic()
            ended = await self._finish(run, stop)
            if isinstance(ended, RunStatus):
                return ended
            # A message came in as the run was about to succeed (the finish was refused for it, and wrote
            # nothing): the run is still held; it goes on, and delivers it first.
            task = asyncio.current_task()
            assert task is not None
            self.keeper.hold(run.id, task, run.lease_epoch, since=sent)
            progress = dataclasses.replace(ended, messages=max(ended.messages, 1))

    @staticmethod
    def _resume_seq(steps: list[Step]) -> int:
        started = [s.seq for s in steps if s.status is StepStatus.STARTED]
        return started[0] if started else steps[-1].seq + 1

    async def _loop(self, run: Run, progress: Progress, conv: Conversation) -> Stop | None:
        """Take steps until the run must end (the reason) or be handed back (None)."""
        self._decisions.pop(run.id, None)
        self._unsettled.pop(run.id, None)
        correction_id = uuid.uuid4()
        while True:
            if self.stopping.is_set():
                self.keeper.drop(run.id)
                await self._release(run)
                log.info("%s run=%s released at seq=%d", self.me, run.id.hex[:8], conv.steps)
                return None
            if self.keeper.cancel_requested(run.id):
                return Stop(RunStatus.CANCELLED, "cancel requested")
            stop = self._decide(run, progress, conv)
            if stop is not None:
                return stop
            if progress.messages and conv.at_boundary:  # a turn boundary, with messages waiting
                delivered = await self._deliver(run, progress, conv)
                if isinstance(delivered, Stop):
                    return delivered
                progress = delivered
                continue
            if conv.pending:
                step = await self._owed(run, progress, conv)
                if isinstance(step, Stop):
                    return step
                if step is None:  # parked: people decide now
                    return None
                progress = step
                continue
            if conv.finished:
                stop = final(conv.last_stop, self.settings.max_tokens, conv.ignored_tool_uses)
                if stop.status is not RunStatus.SUCCEEDED:
                    return stop
                if run.output_schema is None:
                    return dataclasses.replace(stop, output=conv.final_text)
                if conv.rejected_answers >= MAX_CORRECTIONS:
                    return Stop(RunStatus.FAILED, "the model ended without calling final_answer with an answer "
                                "that matches outputSchema, after a corrective turn")
                progress = await self._durably(lambda again: self.store.add_user_step(
                    run.id, self.me, self.settings.lease_seconds, write_id=correction_id, epoch=run.lease_epoch,
                    again=again, text=ANSWER_REMINDER, request=CORRECTION,
                ))
                conv.apply(Step(run.id, conv.steps + 1, StepKind.USER, StepStatus.DONE, request=CORRECTION,
                                response=ANSWER_REMINDER))
            else:
                try:
                    # The seq is the database's to give; this is the one it gives unless the lease is lost.
                    with logs.step_context(step_seq=conv.steps + 1), self.observer.model_call(run) as notes:
                        progress = await self._model_step(run, conv, notes)
                except CancelRequested:
                    return Stop(RunStatus.CANCELLED, "cancel requested")
                except context.DoesNotFit as e:
                    return Stop(RunStatus.FAILED, str(e))
                except LlmError as e:
                    if not e.retryable:
                        return Stop(RunStatus.FAILED, str(e))
                    await self._hand_back_in_outage(run, e)
                    return None

    async def _deliver(self, run: Run, progress: Progress, conv: Conversation) -> Progress | Stop:
        """Deliver the messages posted to the run as USER steps, in the order received: at a turn boundary
        (the model's turn and all its tool calls done, so never between a tool_use and its result), before
        the next model call. The write marks them delivered with the steps, once (store/messages.py)."""
        own = conv.steps - run.inherited_steps
        room = run.max_steps - own - 1  # the messages, and one step left for the model to answer them
        if room < 1:
            return Stop(RunStatus.FAILED, f"step cap reached: a message came at step {own} of at most "
                        f"{run.max_steps}, which leaves no step to answer it")
        stop = guard(run, progress, own, before_model_step=True)  # no message the model cannot answer
        if stop is not None:
            return stop
        write_id = uuid.uuid4()
        steps, progress = await self._durably(lambda again: self.store.deliver_messages(
            run.id, self.me, self.settings.lease_seconds, write_id=write_id, epoch=run.lease_epoch, again=again,
            limit=room,
        ))
        for step in steps:
            conv.apply(step)
            log.info("%s run=%s seq=%d USER message from %s", self.me, run.id.hex[:8], step.seq,
                     step.created_by or "-")
        return progress

    async def _owed(self, run: Run, progress: Progress, conv: Conversation) -> Progress | Stop | None:
        """Take the next step about the tool calls the run owes: a structured answer, a call that runs, a
        result recorded without running it, the run's end; or park the run for people (None), or for its
        sub-agents once every other call of the turn has its result."""
        answer = next((u for u in conv.pending.values() if u.get("name") == FINAL_ANSWER), None)
        if answer is not None and run.output_schema is not None:
            return await self._final_answer(run, conv, answer)
        agents = sub.refs_by_tool(run.sub_agents)
        decided = self._decisions.get(run.id)
        # A sub-agent call that needs a person's approval ("*", or its tool named) is owed like a tool call
        # until one approved it: asked for, or denied (an error result); no child is made before.
        others = [u for u in conv.pending.values()
                  if u.get("name") not in agents or not self._approved(run, u, decided)]
        if not others:
            try:
                return await self._children(run, progress, conv, list(conv.pending.values()))
            except CancelRequested:
                return Stop(RunStatus.CANCELLED, "cancel requested")
        waited = await self._wait_ended(run, conv, others)
        if waited is not False:
            return waited
        step = next_call(
            others, {u: conv.attempts[u] for u in conv.started},
            in_doubt_if_started=self._not_idempotent,
            needs_approval=lambda name: self._needs_approval(run, name),
            decisions=decided or {},
        )
        if isinstance(step, Park) and decided is None:  # nothing decided was known: look at what people said
            known = await self.store.decisions(run.id)
            self.observer.decisions_read(run, known)
            self._decisions[run.id] = {key_of(d): d for d in known}
            return await self._owed(run, progress, conv)
        if isinstance(step, Park) and decided is not None:
            try:
                if await self._reconcile(run, step, decided):  # a probe settled a call: act on its decision
                    return await self._owed(run, progress, conv)
            except CancelRequested:
                return Stop(RunStatus.CANCELLED, "cancel requested")
        try:
            with logs.step_context(step_seq=None):
                if isinstance(step, Execute):
                    use = step.use
                    with self.observer.tool_call(run, use["name"], use["id"], use.get("input")) as notes:
                        return await self._tool_step(run, conv, use, notes)
                if isinstance(step, Settle):
                    return await self._settle(run, conv, step.use, step.ok, step.output)
        except CancelRequested:
            return Stop(RunStatus.CANCELLED, "cancel requested")
        if isinstance(step, Fail):
            return Stop(RunStatus.FAILED, step.reason)
        assert isinstance(step, Park)
        held = self.keeper.set_aside(run.id)
        calls = [(use["id"], kind, use["name"], _json(use.get("input")), attempt) for use, kind, attempt in step.calls]
        try:
            await self._durably(lambda again: self.store.park(run.id, self.me, calls, epoch=run.lease_epoch,
                                                              again=again))
        except CancelRequested:  # asked to stop while still held: it ends CANCELLED, no one asked
            self.keeper.take_back(run.id, held)
            return Stop(RunStatus.CANCELLED, "cancel requested")
        self.observer.parked(run, [(tool_use_id, kind, name) for tool_use_id, kind, name, _, _ in calls])
        log.info(
            "%s run=%s waiting for %d decisions: %s", self.me, run.id.hex[:8], len(calls),
            ", ".join(f"{name} {tool_use_id} ({kind.value}{f' after attempt {attempt}' if attempt else ''})"
                      for tool_use_id, kind, name, _, attempt in calls),
        )
        return None

    async def _children(
        self, run: Run, progress: Progress, conv: Conversation, calls: list[dict[str, Any]]
    ) -> Progress | None:
        """The turn's sub-agent calls, once every other call has its result: the result of each child that
        has ended is recorded; otherwise the children not made yet are made and the run waits for them
        (None), holding no lease and no slot. A call that cannot start a child gets an error result."""
        ids = {u["id"] for u in calls}
        known = {c.parent_tool_use_id: c for c in await self.store.children(run.id) if c.parent_tool_use_id in ids}
        ended = [(u, known[u["id"]]) for u in calls if u["id"] in known and known[u["id"]].status.terminal]
        if ended:
            for use, child in ended:
                ok, output = sub.result_of(child, use["name"].removeprefix(sub.TOOL_PREFIX))
                progress = await self._settle(run, conv, use, ok, output)
            return progress
        made: list[NewRun] = []
        refused: list[tuple[dict[str, Any], str]] = []
        new = [u for u in calls if u["id"] not in known]
        room = max(self.settings.max_children_per_turn - len(known), 0)
        for use in new[room:]:
            refused.append((use, f"error: at most {self.settings.max_children_per_turn} sub-agent calls start in "
                                 "one turn; call it again in a later turn"))
        new = new[:room]
        if new and run.depth + 1 > self.settings.max_agent_depth:
            refused += [(u, f"error: sub-agents nest at most {self.settings.max_agent_depth} deep; this run is "
                            f"at depth {run.depth}") for u in new]
            new = []
        tasks: list[tuple[dict[str, Any], str, Agent]] = []
        for use in new:
            try:
                tasks.append((use, sub.task_of(use.get("input")), await self._agent(run, use["name"])))
            except (ValueError, Refused) as e:
                refused.append((use, f"error: {e}"))
        if tasks:
            try:
                share = sub.shares(run, progress.tokens_used, progress.cost_usd, progress.db_now, len(tasks))
            except ValueError as e:
                refused += [(use, f"error: {e}") for use, _, _ in tasks]
                tasks = []
        for use, task, agent in tasks:
            try:
                made.append(await self._child(run, use, task, agent, share))
            except (ValueError, Refused) as e:
                refused.append((use, f"error: sub-agent {agent.ref} cannot start: {e}"))
        for use, why in refused:
            progress = await self._settle(run, conv, use, False, why)
        if not made and len(known) == 0:
            return progress  # nothing to wait for: the model hears of the errors
        held = self.keeper.set_aside(run.id)
        try:
            parked = await self._durably(lambda again: self.door.spawn(
                run.id, self.me, made, epoch=run.lease_epoch, again=again
            ))
        except CancelRequested:  # asked to stop before the spawn: no child made, the run still held
            self.keeper.take_back(run.id, held)
            raise
        if not parked:  # every child had ended by then: their results are next
            self.keeper.take_back(run.id, held)
            if not made and not any(c.status.terminal for c in await self.store.children(run.id)):
                # The parent's count says none is at work, its children's rows say otherwise: never loop.
                raise RuntimeError(f"run {run.id} counts no sub-agent at work but none of its children has ended")
            return await self._children(run, progress, conv, list(conv.pending.values()))
        log.info("%s run=%s waiting for %d sub-agents: %s", self.me, run.id.hex[:8], len(made) + len(known),
                 ", ".join(f"{n.agent}@{n.agent_version} {n.spawned_by[1] if n.spawned_by else ''}" for n in made))
        return None

    async def _wait_ended(
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
        if state.key is None:
            if state.due:
                return await self._settle(run, conv, use, True, waits.waited((state.now - state.since).total_seconds()))
            return await self._park_wait(run, conv, use, waits.WaitForTimer(until=state.wake_at))
        if state.event_id is not None:
            return await self._settle(run, conv, use, True, waits.delivered(state.payload))
        if state.due:
            return await self._settle(run, conv, use, False, waits.timed_out(state.key))
        return await self._park_wait(run, conv, use, waits.WaitForEvent(state.key, 0.0), at=state.wake_at)

    async def _park_wait(
        self, run: Run, conv: Conversation, use: dict[str, Any], wait: waits.WaitRequest,
        at: datetime.datetime | None = None,
    ) -> Progress | None:
        """Park the run WAITING for a call's timer or event, holding no lease and no slot (None); an event
        on the key kept from before is the call's result at once, the run still held."""
        held = self.keeper.set_aside(run.id)
        if isinstance(wait, waits.WaitForTimer):
            await self._durably(lambda again: self.store.park_timer(
                run.id, self.me, use["id"], seconds=wait.seconds, at=wait.until or at, epoch=run.lease_epoch,
                again=again,
            ))
            self.parked_wait()
            log.info("%s run=%s TOOL %s id=%s waiting for a timer (%s)", self.me, run.id.hex[:8], use["name"],
                     use["id"], f"{wait.seconds:g}s" if wait.seconds is not None else (wait.until or at))
            return None
        got, payload = await self._durably(lambda again: self.store.park_event(
            run.id, self.me, use["id"], wait.key, retention=self.settings.event_retention,
            seconds=wait.timeout_seconds, at=at, epoch=run.lease_epoch, again=again,
        ))
        if not got:
            self.parked_wait()
            log.info("%s run=%s TOOL %s id=%s waiting for event %r", self.me, run.id.hex[:8], use["name"],
                     use["id"], wait.key)
            return None
        self.keeper.take_back(run.id, held)
        log.info("%s run=%s TOOL %s id=%s event %r was kept already", self.me, run.id.hex[:8], use["name"],
                 use["id"], wait.key)
        return await self._settle(run, conv, use, True, waits.delivered(payload))

    async def _agent(self, run: Run, tool: str) -> Agent:
        """The pinned agent version the sub-agent tool `tool` of the run starts (read once per drive)."""
        agents = self._agents.setdefault(run.id, {})
        if tool not in agents:
            name, version = sub.refs_by_tool(run.sub_agents)[tool]
            found = await self.store.agent(name, version, deleted=True)
            if found is None:
                raise ValueError(f"sub-agent {name}@{version} is no longer defined")
            agents[tool] = found
        return agents[tool]

    async def _child(self, run: Run, use: dict[str, Any], task: str, agent: Agent, share: sub.Share) -> NewRun:
        """The child run a call asks for, planned by the door: the agent's definition, with budgets cut to its
        share of the parent's remainder and the parent's model, approvals policy, priority, author and trace
        where the agent names none of its own. Raises Refused or ValueError when it cannot run."""
        spec = with_agent(RunSpec(
            input=task, token_budget=sub.lowered(agent.token_budget, share.token_budget),
            cost_budget_usd=sub.lowered_cost(agent.cost_budget_usd, share.cost_budget_usd),
            timeout_seconds=sub.lowered(agent.timeout_seconds, share.timeout_seconds), priority=run.priority,
        ), agent)
        # As a sub-agent's run has always been made: no webhook of its own, the default context policy, and
        # sub-agents pinned only when its agent names some.
        spec = dataclasses.replace(spec, webhook=None, context_management=None, sub_agents=spec.sub_agents or None)
        if spec.model is None:
            spec = dataclasses.replace(spec, model=run.model)
        if spec.require_approval is None and run.require_approval is not None:
            # The parent's names of its own sub-agents' tools mean nothing to the child unless it has them too.
            own = {sub.tool_name(ref) for ref in spec.sub_agents or ()}
            spec = dataclasses.replace(spec, require_approval=tuple(
                name for name in run.require_approval if not name.startswith(sub.TOOL_PREFIX) or name in own))
        caller = Caller(id=uuid.uuid4(), created_by=run.created_by,
                        traceparent=self.observer.traceparent(run) or sub.traceparent(run, use["id"]),
                        spawned_by=(run.id, use["id"]), root_run_id=run.root_run_id or run.id, depth=run.depth + 1)
        return await self.door.plan(spec, Origin.CHILD, caller, agent=agent, offer=Offer(
            has_tool=lambda name: self.tools.get(name) is not None, tool_names=self.tools.names))

    async def _reconcile(self, run: Run, park: Park, decided: dict[Key, PendingCall]) -> bool:
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
                log.info("%s run=%s TOOL %s id=%s in doubt, its reconcile probe cannot tell: %s", self.me,
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
        decision = Decision.RECORD if done else Decision.RETRY
        why = f"the tool's reconcile probe found the call {'done' if done else 'not done'}"
        stored = await self._durably(lambda again: self.store.reconcile(
            run.id, self.me, self.settings.lease_seconds, epoch=run.lease_epoch, again=again, tool_use_id=use["id"],
            tool_name=use["name"],
            input=_json(use.get("input")), attempt=attempt, decision=decision, output=output if done else None,
            reason=why,
        ))
        log.info("%s run=%s TOOL %s id=%s in doubt after attempt %d: %s (%s)", self.me, run.id.hex[:8],
                 use["name"], use["id"], attempt, why, stored.decision.value if stored.decision else "undecided")
        return stored

    def _not_idempotent(self, name: str) -> bool:
        tool = self.tools.get(name)
        return tool is not None and not tool.idempotent

    def _approved(self, run: Run, use: dict[str, Any], decided: dict[Key, PendingCall] | None) -> bool:
        """Whether a call may go ahead as far as people are concerned: it needs no approval, or has it."""
        if not self._needs_approval(run, use["name"]):
            return True
        found = (decided or {}).get((use["id"], DecisionKind.APPROVAL, 0))
        return found is not None and found.decision is Decision.APPROVE

    def _needs_approval(self, run: Run, name: str) -> bool:
        tool = self.tools.get(name)
        return (tool is not None and tool.requires_approval) or run.needs_approval(name)

    async def _final_answer(self, run: Run, conv: Conversation, use: dict[str, Any]) -> Progress | Stop:
        """The model called final_answer: the run succeeds with that answer if it matches the schema;
        otherwise the model is told why, once, and the run fails the second time."""
        assert run.output_schema is not None
        value = answer_of(run.output_schema, use.get("input"))
        why = problem(run.output_schema, value)
        if why is None:
            await self._settle(run, conv, use, True, "accepted")
            return Stop(RunStatus.SUCCEEDED, "", output=value)
        if conv.rejected_answers >= MAX_CORRECTIONS:
            return Stop(RunStatus.FAILED, f"the answer does not match outputSchema after a corrective turn: {why}")
        return await self._settle(run, conv, use, False, f"this answer does not match the schema: {why}. "
                                  "Call final_answer again with an answer that does.")

    async def _settle(self, run: Run, conv: Conversation, use: dict[str, Any], ok: bool, output: str) -> Progress:
        """Record a call's result without executing it (denied, recorded by a person, an answer checked)."""
        tool_use_id, name = use["id"], use["name"]
        write_id = uuid.uuid4()
        progress = await self._durably(lambda again: self.store.settle_tool(
            run.id, self.me, self.settings.lease_seconds, write_id=write_id, epoch=run.lease_epoch, again=again,
            tool_use_id=tool_use_id, tool_name=name, request=_json(use.get("input")), ok=ok, output=output,
        ))
        status = StepStatus.DONE if ok else StepStatus.ERROR
        conv.apply(Step(run.id, conv.steps + 1, StepKind.TOOL, status, tool_name=name, tool_use_id=tool_use_id,
                        response=output))
        log.info("%s run=%s TOOL %s id=%s recorded without running: %s", self.me, run.id.hex[:8], name,
                 tool_use_id, "ok" if ok else "error")
        return progress

    async def _hand_back_in_outage(self, run: Run, error: LlmError) -> None:
        """Every attempt of the model step failed, retryably: the API is down or overloaded for longer
        than the client retries. Failing the run would lose it for an outage; the run is handed back to
        be tried again later, with backoff, until its deadline (which still ends it TIMED_OUT)."""
        delay = outage_backoff(
            run.model_retries, self.settings.outage_backoff_base, self.settings.outage_backoff_cap, self._rng
        )
        self.keeper.drop(run.id)
        await self._release(run, delay)
        log.warning(
            "%s run=%s model step failed after its retries (%s); handed back, to be retried in %.0fs",
            self.me, run.id.hex[:8], error, delay,
        )

    async def _release(self, run: Run, delay: float | None = None) -> None:
        """Hand the run back (QUEUED, no holder; claimable after `delay` seconds); LeaseLost if it was not
        held under this claim any more, so the loss is logged like any other."""
        if not await self._durably(lambda again: self.store.release(
            run.id, self.me, delay=delay, epoch=run.lease_epoch, again=again
        )):
            raise LeaseLost(run.id, self.me)

    async def _durably(self, write: Callable[[bool], Awaitable[T]]) -> T:
        """Send a fenced write until its outcome is known.

        A connection that drops after a write was sent leaves its outcome unknown; the write is sent
        again (`write(True)`), and each write is made so that a second copy finds the first instead
        of applying twice (store.py: write ids), even while the first is still executing. A statement
        or lock timeout, a serialization failure or a deadlock rolled the write back: sent again too.
        It is bounded by the lease: a worker that cannot write for two thirds of it gives the run up
        (lease.py), which cancels this.
        """
        again, delay = False, 0.05
        while True:
            try:
                return await write(again)
            except psycopg.Error as e:
                if not transient(e):
                    raise
                log.warning("%s write failed (%s); sending it again", self.me, str(e).strip() or type(e).__name__)
                await asyncio.sleep(self._rng.uniform(delay / 2, delay))
                again, delay = True, min(delay * 2, 1.0)

    @staticmethod
    def _decide(run: Run, progress: Progress, conv: Conversation) -> Stop | None:
        """Why the run ends before its next step: model output it cannot act on, or the guard's reason."""
        if conv.refused is not None:
            # The turn is checkpointed (its tokens and cost count); acting on it is what is refused.
            return Stop(RunStatus.FAILED, f"model output refused: {conv.refused}")
        model_next = not conv.pending and not conv.finished
        own_steps = conv.steps - run.inherited_steps  # the step cap counts what this run did, not its parent
        if run.children_tokens or run.children_cost:  # the budgets bound the run with its sub-agents
            progress = dataclasses.replace(progress, tokens_used=progress.tokens_used + run.children_tokens,
                                           cost_usd=progress.cost_usd + run.children_cost)
        return guard(run, progress, own_steps, before_model_step=model_next, owed=conv.owed)

    async def _finish(self, run: Run, stop: Stop) -> RunStatus | Progress:
        """End the run; or, if it may not succeed yet for messages posted to it that it has not seen, its
        progress now (nothing was written, the run is still held)."""
        self.keeper.drop(run.id)
        tokens = await self._durably(
            lambda again: self.store.finish(
                run.id, self.me, stop.status, stop.reason or None, again=again, output=stop.output,
                epoch=run.lease_epoch, lease_seconds=self.settings.lease_seconds,
            )
        )
        if isinstance(tokens, Progress):
            log.info("%s run=%s has messages to deliver before it ends", self.me, run.id.hex[:8])
            return tokens
        self.observer.run_ended(run, stop.status, stop.reason or None)
        why = f" reason={stop.reason!r}" if stop.reason else ""
        log.info("%s run=%s %s tokens=%d%s", self.me, run.id.hex[:8], stop.status.value, tokens, why)
        return stop.status

    async def _agent_definitions(self, run: Run) -> list[dict[str, Any]]:
        """The run's sub-agents as tools: one per pinned sub-agent still defined."""
        found = []
        for tool in sub.refs_by_tool(run.sub_agents):
            try:
                agent = await self._agent(run, tool)
            except ValueError:
                continue  # not offered; a call of it anyway gets an error result
            found.append(sub.definition(agent.name, agent.version, agent.description))
        return found

    async def _model_step(self, run: Run, conv: Conversation, notes: StepNotes = NO_NOTES) -> Progress:
        system = system_sent(run.system, run.output_schema)
        tools = tools_sent(self.tools.definitions(run.tools), await self._agent_definitions(run), run.output_schema)
        limits = self.prices.limits(run.model)
        max_tokens = min(self.settings.max_tokens, limits.max_output_tokens) if limits else self.settings.max_tokens
        policy = context.ContextPolicy.of(run.context_management)
        strategy = _strategy(policy.strategy, run.model, limits)
        estimate = conv.estimate(system, tools)
        if limits is not None and strategy in ("summarize", "clear_tool_results"):
            trigger = min(policy.trigger(limits.context_window), limits.context_window - max_tokens)
            if estimate > trigger and await self._compact(run, conv, strategy, policy, limits, estimate, trigger,
                                                          system, tools):
                estimate = conv.estimate(system, tools)
        if limits is not None and estimate + max_tokens > limits.context_window:
            raise context.DoesNotFit(
                f"the next model request does not fit the context window of {run.model}: about {estimate} input "
                f"tokens + max_tokens {max_tokens} > {limits.context_window} tokens (contextManagement strategy "
                f"{strategy}{_hint(strategy)}); it was not sent")
        server = None
        if strategy == "server":
            trigger = policy.trigger(limits.context_window) if limits else policy.trigger_tokens or SERVER_TRIGGER
            server = ServerContext(min(trigger, limits.context_window - max_tokens) if limits else trigger,
                                   policy.keep_recent_turns)
        request = LlmRequest(
            model=run.model,
            max_tokens=max_tokens,
            messages=list(conv.messages),
            system=system,
            tools=tools,
            on_text=(deltas := self.deltas.sink(run.id, conv.steps + 1)),
            server_context=server,
            stable_messages=conv.stable,
        )
        notes.sent(request)
        t0 = time.perf_counter()
        try:
            response = await self.keeper.interruptible(run.id, self.llm.send(request))
            await deltas.close()
        except LlmError:
            self.observer.model_step(run.model, Usage(), None, time.perf_counter() - t0, ok=False)
            raise
        finally:
            deltas.discard()
        seconds = time.perf_counter() - t0
        notes.answered(response)
        latency_ms = round(seconds * 1000)
        usage = response.usage
        cost = self.prices.cost(run.model, usage)
        # The request is summarised, not stored whole: the conversation is the step log itself, and
        # storing it again with every step would make a run's storage quadratic in its length.
        summary = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "system": request.system,
            "tools": [t["name"] for t in request.tools],
            "message_count": len(request.messages),
            "new_messages": _since_last_assistant(request.messages),
            "context": _context_notes(strategy, estimate, limits, response, conv.compacted_at),
        }
        # Model output is untrusted text: ids and names in it become column values, where a NUL would
        # make the checkpoint fail on every worker. Cleaned once, here, so the live conversation and
        # the replayed one are the same.
        # Written even when it will be refused (an integer beyond 64 bits, say): its tokens are billed
        # and the turn is evidence; replay refuses it again.
        content = dump_content(clean_json(response.content))
        stop_reason = clean(response.stop_reason) if response.stop_reason is not None else None
        write_id = uuid.uuid4()
        turn = ModelTurn(_json(summary), content, stop_reason, usage, cost, latency_ms)
        seq, progress = await self._durably(lambda again: self.store.checkpoint_model(
            run.id,
            self.me,
            self.settings.lease_seconds,
            turn,
            write_id=write_id,
            epoch=run.lease_epoch,
            again=again,
        ))
        logs.set_context(step_seq=seq)
        notes.checkpointed(seq)
        self.observer.model_step(run.model, usage, cost, seconds, ok=True)
        conv.apply(Step(run.id, seq, StepKind.MODEL, StepStatus.DONE, request=turn.request, response=content,
                        stop_reason=stop_reason, output_tokens=usage.output_tokens))
        log.info(
            "%s run=%s seq=%d MODEL stop=%s in=%d out=%d latency=%dms",
            self.me, run.id.hex[:8], seq, stop_reason, usage.input_tokens, usage.output_tokens, latency_ms,
        )
        return progress

    async def _compact(
        self, run: Run, conv: Conversation, strategy: str, policy: context.ContextPolicy, limits: Limits,
        estimate: int, trigger: int, system: str | None, tools: list[dict[str, Any]],
    ) -> bool:
        """Bring the conversation under the trigger before the next model call, as a COMPACT step: the turns
        before the newest `keepRecentTurns` summarised by a model call of their own, or their tool results
        cleared. Returns whether a step was written (False: nothing old enough to compact).

        A crash during the summarising call leaves no trace (the next holder makes it again); a crash after
        its checkpoint leaves the summary in the step log, which replay applies, so the estimate is then
        under the trigger and no second summary is made."""
        at = conv.cut(policy.keep_recent_turns)
        if at is None or conv.steps - run.inherited_steps + 2 > run.max_steps:
            return False  # nothing to compact, or no room under the step cap for it and the call it is for
        covered = [s for s in conv.origins[:at] if s > 0]
        described: dict[str, Any] = {
            "strategy": strategy, "keepFromSeq": conv.origins[at] if at < len(conv.messages) else None,
            "coversSeqs": [min(covered, default=1), conv.origins[at] - 1 if at < len(conv.messages) else conv.steps],
            "estimatedTokens": estimate, "window": limits.context_window, "triggerTokens": trigger,
        }
        usage, latency_ms, stop_reason = Usage(), 0, None
        cost: Decimal | None = Decimal(0)
        if strategy == "clear_tool_results":
            found = conv.uncleared(at)
            if not found:
                return False
            response = _json(found)
        else:
            response, usage, cost, latency_ms, stop_reason = await self._summarise(run, conv.messages[:at], limits)
        # What it leaves, in the provider's tokens: its characters at the rate the provider counted the
        # conversation before it (the estimate of the added part included, which only overestimates).
        before = context.estimate_tokens([system, tools, conv.messages])
        left = conv.compacted(Step(run.id, conv.steps + 1, StepKind.COMPACT, StepStatus.DONE,
                                   request=_json(described), response=response))
        after = context.estimate_tokens([system, tools, left])
        described["estimatedAfter"] = -(-after * estimate // max(before, 1))
        write_id = uuid.uuid4()
        request = _json(described)
        seq, _ = await self._durably(lambda again: self.store.checkpoint_model(
            run.id, self.me, self.settings.lease_seconds,
            ModelTurn(request, response, stop_reason, usage, cost, latency_ms),
            write_id=write_id, epoch=run.lease_epoch, again=again, kind=StepKind.COMPACT,
        ))
        conv.apply(Step(run.id, seq, StepKind.COMPACT, StepStatus.DONE, request=request, response=response))
        log.info("%s run=%s seq=%d COMPACT %s of steps %d-%d (about %d tokens, trigger %d)", self.me,
                 run.id.hex[:8], seq, strategy, *described["coversSeqs"], estimate, trigger)
        return True

    async def _summarise(
        self, run: Run, covered: list[Message], limits: Limits
    ) -> tuple[str, Usage, Decimal | None, int, str | None]:
        """The summarising call of a COMPACT step: (summary, usage, cost, latency in ms, stop reason).
        Retried, timed and handed back in an outage like any model call (the client's decorators)."""
        max_tokens = min(context.SUMMARY_MAX_TOKENS, limits.max_output_tokens)
        room = (limits.context_window - max_tokens) * context.CHARS_PER_TOKEN * 9 // 10
        text = context.transcript(covered, room - len(context.SUMMARY_SYSTEM) - len(context.SUMMARY_ASK))
        request = LlmRequest(model=run.model, max_tokens=max_tokens, system=context.SUMMARY_SYSTEM, tools=[],
                             messages=[{"role": "user", "content": f"{text}\n\n{context.SUMMARY_ASK}"}])
        t0 = time.perf_counter()
        try:
            answer: LlmResponse = await self.keeper.interruptible(run.id, self.llm.send(request))
        except LlmError:
            self.observer.model_step(run.model, Usage(), None, time.perf_counter() - t0, ok=False)
            raise
        seconds = time.perf_counter() - t0
        cost = self.prices.cost(run.model, answer.usage)
        self.observer.model_step(run.model, answer.usage, cost, seconds, ok=True)
        summary = clean("\n".join(str(b.get("text", "")) for b in answer.content
                                   if isinstance(b, dict) and b.get("type") == "text")).strip()
        if not summary:
            raise context.DoesNotFit(
                f"the conversation passed its trigger and the summarising call made to keep it within the context "
                f"window of {run.model} returned no text (stop_reason {answer.stop_reason!r})")
        return summary, answer.usage, cost, round(seconds * 1000), answer.stop_reason

    async def _tool_step(
        self, run: Run, conv: Conversation, use: dict[str, Any], notes: StepNotes = NO_NOTES,
    ) -> Progress | None:
        tool_use_id, name = use["id"], use["name"]
        started_id, finished_id = uuid.uuid4(), uuid.uuid4()
        seq, attempts, _ = await self._durably(lambda again: self.store.start_tool(
            run.id, self.me, self.settings.lease_seconds, write_id=started_id, epoch=run.lease_epoch, again=again,
            tool_use_id=tool_use_id, tool_name=name, request=_json(use.get("input")),
        ))
        logs.set_context(step_seq=seq)
        notes.checkpointed(seq, attempts)
        again = f" (attempt {attempts})" if attempts > 1 else ""
        log.info("%s run=%s seq=%d TOOL %s id=%s started%s", self.me, run.id.hex[:8], seq, name, tool_use_id, again)
        t0 = time.perf_counter()
        # The call's progress (an MCP server's notifications) goes to live watchers only, as model text does.
        progress_sink = self.deltas.progress(run.id, seq, tool_use_id, name)
        ctx = ToolContext(run.id, tool_use_id, run.lease_epoch, progress=progress_sink)
        try:
            outcome = await self.keeper.interruptible(
                run.id, self.tools.execute(name, use.get("input"), ctx, run.tools))
        except CancelRequested:
            progress_sink.discard()
            await self._durably(lambda again: self.store.finish_tool(
                run.id, self.me, self.settings.lease_seconds, write_id=finished_id, epoch=run.lease_epoch,
                again=again, tool_use_id=tool_use_id, ok=False, output="cancelled",
                latency_ms=round((time.perf_counter() - t0) * 1000),
            ))
            self.observer.tool_step(self.tools.label(name, UNKNOWN_TOOL), time.perf_counter() - t0, False)
            log.info("%s run=%s seq=%d TOOL %s id=%s cancelled", self.me, run.id.hex[:8], seq, name, tool_use_id)
            raise
        except BaseException:
            progress_sink.discard()
            raise
        await progress_sink.close()  # the last progress before the result that ends it
        seconds = time.perf_counter() - t0
        if outcome.wait is not None:  # the call's result is what the wait brings: the run parks (or has it)
            return await self._park_wait(run, conv, use, outcome.wait)
        latency_ms = round(seconds * 1000)
        progress = await self._durably(lambda again: self.store.finish_tool(
            run.id, self.me, self.settings.lease_seconds, write_id=finished_id, epoch=run.lease_epoch, again=again,
            tool_use_id=tool_use_id, ok=outcome.ok, output=outcome.output, latency_ms=latency_ms,
        ))
        notes.tool_outcome(outcome.ok, outcome.output)
        self.observer.tool_step(self.tools.label(name, UNKNOWN_TOOL), seconds, outcome.ok)
        status = StepStatus.DONE if outcome.ok else StepStatus.ERROR
        conv.apply(
            Step(run.id, seq, StepKind.TOOL, status, tool_name=name, tool_use_id=tool_use_id, response=outcome.output)
        )
        log.info(
            "%s run=%s seq=%d TOOL %s id=%s %s %dms",
            self.me, run.id.hex[:8], seq, name, tool_use_id, "done" if outcome.ok else "error", latency_ms,
        )
        return progress
