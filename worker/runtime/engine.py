"""The driver: takes a claimed run from its last checkpoint to the end, one checkpointed step at a time.

guard ▶ next step (a tool the model asked for, else the model) ▶ checkpoint, until the run finishes or
the worker must let go of it. Resuming after a crash is the same code path as continuing.

The driver is the loop and its two steps, the model's and a tool's. What else a step may be goes to a part
of its own, each with a narrow interface the loop calls: messages (messages.py), people in the loop
(people.py), durable waits (waiting.py), sub-agents (subagents.py), the context window (compaction.py) and
the calls of a replay run, answered from its recording (recorded.py);
the fenced writes they share are durable.py's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from agentrun.worker.core import children as sub
from agentrun.worker.core import context
from agentrun.worker.core.answer import FINAL_ANSWER, MAX_CORRECTIONS, answer_of, problem, system_sent, tools_sent
from agentrun.worker.core.children import MAX_CHILDREN_PER_TURN, MAX_DEPTH
from agentrun.worker.core.decisions import Execute, Fail, Next, Park, Settle
from agentrun.worker.core.guard import Stop, deadline_passed, final, guard, remaining
from agentrun.worker.core.observer import NO_NOTES, UNKNOWN_TOOL, NoObserver, Observer, StepNotes
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import (
    ModelTurn,
    Progress,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from agentrun.worker.core.replay import CORRECTION, Conversation, dump_content
from agentrun.worker.core.text import clean, clean_json
from agentrun.worker.core.types import LlmClient, LlmError, LlmRequest, Message, Usage
from agentrun.worker.obs import logs
from agentrun.worker.runtime import compaction
from agentrun.worker.runtime.compaction import Compaction
from agentrun.worker.runtime.deltas import DeltaPublisher
from agentrun.worker.runtime.door import Door
from agentrun.worker.runtime.durable import Durable, dumps
from agentrun.worker.runtime.lease import CancelRequested, LeaseKeeper
from agentrun.worker.runtime.messages import Messages
from agentrun.worker.runtime.people import AGAIN, People
from agentrun.worker.runtime.quotas import Budgets
from agentrun.worker.runtime.recorded import Recorded
from agentrun.worker.runtime.subagents import SubAgents
from agentrun.worker.runtime.waiting import Waits
from agentrun.worker.store import LeaseLost, RunStore
from agentrun.worker.tools import ToolBox, ToolContext

log = logging.getLogger("agentrun.worker.runtime.engine")

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
        self.store = store
        self.llm = llm
        self.tools = tools
        self.prices = prices
        self.keeper = keeper
        self.stopping = stopping or asyncio.Event()
        self.observer: Observer = observer or NoObserver()
        self._rng = random.Random()
        self.parked_wait: Callable[[], None] = lambda: None
        """Called when a run parks for a timer or an event: the worker's sweep looks at its wake time."""
        self.leaving: Callable[[uuid.UUID, bool], None] = lambda run_id, leaving: None
        """Called with True when a run's last write is sent (it ends once that commits), and with False if that
        write did not end it after all: the worker claims the run's successor meanwhile."""
        self.settings = settings  # and the parts, made with them
        self.deltas = DeltaPublisher(store.pool)  # the text of a call in flight, for live watchers only
        self._prestarted: dict[uuid.UUID, dict[str, int]] = {}
        """Of each run, the calls its last model turn's checkpoint STARTED (People.unasked): tool_use id → seq."""

    @property
    def settings(self) -> DriverSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: DriverSettings) -> None:
        """New settings (between drives) make new parts: each takes the settings it needs when made."""
        self._settings = settings
        store, keeper, tools = self.store, self.keeper, self.tools
        self.durable = Durable(settings.worker_id, settings.lease_seconds, store, store, self._rng)
        self.messages = Messages(self.durable, store)
        self.people = People(self.durable, store, keeper, tools, self.observer)
        self.waits = Waits(self.durable, store, keeper, settings.event_retention, parked=lambda: self.parked_wait())
        self.sub_agents = SubAgents(self.durable, store, store, Door(store), keeper, tools, self.observer,
                                    max_children_per_turn=settings.max_children_per_turn,
                                    max_agent_depth=settings.max_agent_depth)
        self.compaction = Compaction(self.durable, store, keeper, self.llm, self.prices, self.observer)
        self.budgets = Budgets(self.durable, store)
        self.recorded = Recorded(self.durable, store, tools)

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
            self.people.forget(run.id)
            self.sub_agents.forget(run.id)
            self.waits.forget(run.id)
            self.recorded.forget(run.id)
            self._prestarted.pop(run.id, None)

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
        self.people.forget(run.id)
        correction_id = uuid.uuid4()
        while True:
            if self.stopping.is_set():
                self.keeper.drop(run.id)
                await self.durable.release(run)
                log.info("%s run=%s released at seq=%d", self.me, run.id.hex[:8], conv.steps)
                return None
            if self.keeper.cancel_requested(run.id):
                return Stop(RunStatus.CANCELLED, "cancel requested")
            stop = self._decide(run, progress, conv)
            if stop is not None:
                return stop
            if progress.messages and conv.at_boundary:  # a turn boundary, with messages waiting
                delivered = await self.messages.deliver(run, progress, conv)
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
                progress = await self.durable.write(lambda again: self.store.add_user_step(
                    run.id, self.me, self.settings.lease_seconds, write_id=correction_id, epoch=run.lease_epoch,
                    again=again, text=ANSWER_REMINDER, request=CORRECTION,
                ))
                conv.apply(Step(run.id, conv.steps + 1, StepKind.USER, StepStatus.DONE, request=CORRECTION,
                                response=ANSWER_REMINDER))
            else:
                # Its tenant's daily tokens or cost spent: handed back until the window allows, not failed.
                throttle = await self.budgets.over(run)
                if throttle is not None:
                    self.keeper.drop(run.id)
                    await self.budgets.hand_back(run, throttle)
                    return None
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

    async def _owed(self, run: Run, progress: Progress, conv: Conversation) -> Progress | Stop | None:
        """Take the next step about the tool calls the run owes: a structured answer, a call that runs, a
        result recorded without running it, the run's end; or park the run for people (None), or for its
        sub-agents once every other call of the turn has its result. A replay run's calls are answered from
        its recording instead (recorded.py): served, blocked, or run live, never parked."""
        answer = next((u for u in conv.pending.values() if u.get("name") == FINAL_ANSWER), None)
        if answer is not None and run.output_schema is not None:
            return await self._final_answer(run, conv, answer)
        agents = sub.refs_by_tool(run.sub_agents)
        decided = self.people.known(run.id)
        # A sub-agent call that needs a person's approval ("*", or its tool named) is owed like a tool call
        # until one approved it: asked for, or denied (an error result); no child is made before.
        others = [u for u in conv.pending.values()
                  if u.get("name") not in agents or not self.people.approved(run, u, decided)]
        step: Next | Literal["again"]
        try:
            if run.replay_id is not None:  # a replay run: its recording answers, never a person, a child, a timer
                served = await self.recorded.next(run, conv, list(conv.pending.values()))
                if not isinstance(served, Execute):
                    return served
                step = served
            elif not others:
                return await self.sub_agents.calls(run, progress, conv, list(conv.pending.values()))
            elif (waited := await self.waits.ended(run, conv, others)) is not False:
                return waited
            elif (step := await self.people.next(run, conv, others)) == AGAIN:
                return await self._owed(run, progress, conv)
            with logs.step_context(step_seq=None):
                if isinstance(step, Execute):
                    use = step.use
                    with self.observer.tool_call(run, use["name"], use["id"], use.get("input")) as notes:
                        return await self._tool_step(run, conv, use, notes)
                if isinstance(step, Settle):
                    return await self.durable.settle(run, conv, step.use, step.ok, step.output)
        except CancelRequested:
            return Stop(RunStatus.CANCELLED, "cancel requested")
        if isinstance(step, Fail):
            return Stop(RunStatus.FAILED, step.reason)
        assert isinstance(step, Park)
        return await self.people.park(run, step)

    async def _final_answer(self, run: Run, conv: Conversation, use: dict[str, Any]) -> Progress | Stop:
        """The model called final_answer: the run succeeds with that answer if it matches the schema;
        otherwise the model is told why, once, and the run fails the second time."""
        assert run.output_schema is not None
        value = answer_of(run.output_schema, use.get("input"))
        why = problem(run.output_schema, value)
        if why is None:
            await self.durable.settle(run, conv, use, True, "accepted")
            return Stop(RunStatus.SUCCEEDED, "", output=value)
        if conv.rejected_answers >= MAX_CORRECTIONS:
            return Stop(RunStatus.FAILED, f"the answer does not match outputSchema after a corrective turn: {why}")
        return await self.durable.settle(run, conv, use, False, f"this answer does not match the schema: {why}. "
                                  "Call final_answer again with an answer that does.")

    async def _hand_back_in_outage(self, run: Run, error: LlmError) -> None:
        """Every attempt of the model step failed, retryably: the API is down or overloaded for longer
        than the client retries. Failing the run would lose it for an outage; the run is handed back to
        be tried again later, with backoff, until its deadline (which still ends it TIMED_OUT)."""
        delay = outage_backoff(
            run.model_retries, self.settings.outage_backoff_base, self.settings.outage_backoff_cap, self._rng
        )
        self.keeper.drop(run.id)
        await self.durable.release(run, delay)
        log.warning(
            "%s run=%s model step failed after its retries (%s); handed back, to be retried in %.0fs",
            self.me, run.id.hex[:8], error, delay,
        )

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
        self.leaving(run.id, True)
        try:
            tokens = await self.durable.write(
                lambda again: self.store.finish(
                    run.id, self.me, stop.status, stop.reason or None, again=again, output=stop.output,
                    epoch=run.lease_epoch, lease_seconds=self.settings.lease_seconds,
                )
            )
        except BaseException:
            self.leaving(run.id, False)
            raise
        if isinstance(tokens, Progress):
            self.leaving(run.id, False)
            log.info("%s run=%s has messages to deliver before it ends", self.me, run.id.hex[:8])
            return tokens
        self.observer.run_ended(run, stop.status, stop.reason or None)
        why = f" reason={stop.reason!r}" if stop.reason else ""
        log.info("%s run=%s %s tokens=%d%s", self.me, run.id.hex[:8], stop.status.value, tokens, why)
        return stop.status

    async def _model_step(self, run: Run, conv: Conversation, notes: StepNotes = NO_NOTES) -> Progress:
        system = system_sent(run.system, run.output_schema)
        tools = tools_sent(self.tools.definitions(run.tools), await self.sub_agents.definitions(run), run.output_schema)
        limits = self.prices.limits(run.model)
        max_tokens = min(self.settings.max_tokens, limits.max_output_tokens) if limits else self.settings.max_tokens
        window = await self.compaction.window(run, conv, system, tools, limits, max_tokens)
        request = LlmRequest(
            model=run.model,
            max_tokens=max_tokens,
            messages=list(conv.messages),
            system=system,
            tools=tools,
            on_text=(deltas := self.deltas.sink(run.id, conv.steps + 1)),
            server_context=window.server,
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
            "context": compaction.notes(window, limits, response, conv.compacted_at),
        }
        # Model output is untrusted text: ids and names in it become column values, where a NUL would
        # make the checkpoint fail on every worker. Cleaned once, here, so the live conversation and
        # the replayed one are the same.
        # Written even when it will be refused (an integer beyond 64 bits, say): its tokens are billed
        # and the turn is evidence; replay refuses it again.
        content = dump_content(clean_json(response.content))
        stop_reason = clean(response.stop_reason) if response.stop_reason is not None else None
        write_id = uuid.uuid4()
        turn = ModelTurn(dumps(summary), content, stop_reason, usage, cost, latency_ms)
        calls = [] if self.stopping.is_set() else self.people.unasked(run, conv.acted_on(content, stop_reason), conv)
        starts = [(use["id"], use["name"], dumps(use.get("input"))) for use in calls]
        seq, progress, started = await self.durable.write(lambda again: self.store.checkpoint_turn(
            run.id,
            self.me,
            self.settings.lease_seconds,
            turn,
            write_id=write_id,
            epoch=run.lease_epoch,
            again=again,
            tool_starts=starts,
        ))
        # All of them or none: none when the run was asked to stop or ran out of time meanwhile (the loop
        # ends it before any call runs). A call not STARTED here is started by its own write, as ever.
        self._prestarted[run.id] = {use["id"]: seq + i for i, use in enumerate(calls, 1)} if started else {}
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

    async def _tool_step(
        self, run: Run, conv: Conversation, use: dict[str, Any], notes: StepNotes = NO_NOTES,
    ) -> Progress | None:
        tool_use_id, name = use["id"], use["name"]
        started_id, finished_id = uuid.uuid4(), uuid.uuid4()
        prestarted = self._prestarted.get(run.id, {}).pop(tool_use_id, None)
        if prestarted is not None:  # its STARTED row came with the model turn's checkpoint
            seq, attempts = prestarted, 1
        else:
            seq, attempts, _ = await self.durable.write(lambda again: self.store.start_tool(
                run.id, self.me, self.settings.lease_seconds, write_id=started_id, epoch=run.lease_epoch,
                again=again, tool_use_id=tool_use_id, tool_name=name, request=dumps(use.get("input")),
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
            await self.durable.write(lambda again: self.store.finish_tool(
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
            return await self.waits.park(run, conv, use, outcome.wait)
        latency_ms = round(seconds * 1000)
        progress = await self.durable.write(lambda again: self.store.finish_tool(
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
