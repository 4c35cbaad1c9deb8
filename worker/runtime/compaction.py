"""The engine's part for the context window: the strategy a run's policy comes to for its model, the
conversation brought under its trigger before a model call (a COMPACT step: a summary, or tool results
cleared), and what a MODEL step's request summary says of the window."""

from __future__ import annotations

import dataclasses
import time
import uuid
from decimal import Decimal
from typing import Any

from agentrun.worker.core import context
from agentrun.worker.core.observer import Observer
from agentrun.worker.core.pricing import Limits, PriceTable
from agentrun.worker.core.records import ModelTurn, Run, Step, StepKind, StepStatus
from agentrun.worker.core.replay import Conversation
from agentrun.worker.core.text import clean
from agentrun.worker.core.types import LlmClient, LlmError, LlmRequest, LlmResponse, Message, ServerContext, Usage
from agentrun.worker.llm.providers import BUILTIN, split
from agentrun.worker.runtime.durable import Durable, dumps, log
from agentrun.worker.runtime.lease import LeaseKeeper
from agentrun.worker.store.steps import StepWrites

SERVER_TRIGGER = 150_000
"""The compaction trigger of `server` for a model whose window the price table does not name (the API's own)."""


def strategy_of(asked: str, model: str, limits: Limits | None) -> str:
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


@dataclasses.dataclass(frozen=True)
class Window:
    """What the next model request is sent with: the strategy, the engine's estimate of its input tokens,
    and the server's own compaction settings (strategy `server`)."""

    strategy: str
    estimate: int
    server: ServerContext | None = None


def notes(window: Window, limits: Limits | None, response: LlmResponse, compacted_at: int | None) -> dict[str, Any]:
    """What a MODEL step's request summary says about the window: the strategy, the engine's estimate, the
    COMPACT step whose summary or placeholders the request was sent with, the provider's count of what the
    model saw (replay's base for the next estimate) and its own compaction."""
    found: dict[str, Any] = {"strategy": window.strategy, "estimatedTokens": window.estimate}
    if compacted_at is not None:
        found["compactedAt"] = compacted_at
    if limits is not None:
        found["window"] = limits.context_window
    if response.context_tokens:
        found["contextTokens"] = response.context_tokens
    if any(isinstance(b, dict) and b.get("type") == "compaction" for b in response.content):
        found["compacted"] = True
    cleared = sum(e.get("cleared_tool_uses", 0) for e in response.applied_edits
                  if isinstance(e.get("cleared_tool_uses"), int))
    if cleared:
        found["clearedToolUses"] = cleared
    return found


class Compaction:
    def __init__(self, durable: Durable, steps: StepWrites, keeper: LeaseKeeper, llm: LlmClient, prices: PriceTable,
                 observer: Observer) -> None:
        self.durable = durable
        self.steps = steps
        self.keeper = keeper
        self.llm = llm
        self.prices = prices
        self.observer = observer

    async def window(
        self, run: Run, conv: Conversation, system: str | None, tools: list[dict[str, Any]], limits: Limits | None,
        max_tokens: int,
    ) -> Window:
        """The window the next model request is sent with, the conversation compacted first if the run's
        policy says so and it passed its trigger. Raises context.DoesNotFit if the request would not fit
        (it is then not sent)."""
        policy = context.ContextPolicy.of(run.context_management)
        strategy = strategy_of(policy.strategy, run.model, limits)
        estimate = conv.estimate(system, tools)
        if limits is not None and strategy in ("summarize", "clear_tool_results"):
            trigger = min(policy.trigger(limits.context_window), limits.context_window - max_tokens)
            if estimate > trigger and await self.compact(run, conv, strategy, policy, limits, estimate, trigger,
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
        return Window(strategy, estimate, server)

    async def compact(
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
            response = dumps(found)
        else:
            response, usage, cost, latency_ms, stop_reason = await self._summarise(run, conv.messages[:at], limits)
        # What it leaves, in the provider's tokens: its characters at the rate the provider counted the
        # conversation before it (the estimate of the added part included, which only overestimates).
        before = context.estimate_tokens([system, tools, conv.messages])
        left = conv.compacted(Step(run.id, conv.steps + 1, StepKind.COMPACT, StepStatus.DONE,
                                   request=dumps(described), response=response))
        after = context.estimate_tokens([system, tools, left])
        described["estimatedAfter"] = -(-after * estimate // max(before, 1))
        write_id = uuid.uuid4()
        request = dumps(described)
        me = self.durable.me
        seq, _ = await self.durable.write(lambda again: self.steps.checkpoint_model(
            run.id, me, self.durable.lease_seconds,
            ModelTurn(request, response, stop_reason, usage, cost, latency_ms),
            write_id=write_id, epoch=run.lease_epoch, again=again, kind=StepKind.COMPACT,
        ))
        conv.apply(Step(run.id, seq, StepKind.COMPACT, StepStatus.DONE, request=request, response=response))
        log.info("%s run=%s seq=%d COMPACT %s of steps %d-%d (about %d tokens, trigger %d)", me,
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
