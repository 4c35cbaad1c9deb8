"""The engine's observation seam: what a worker reports as it claims runs and takes steps.

Pure, no I/O. The default does nothing, so the engine and its tests need no metrics; `Metrics`
(worker/obs/metrics.py) and `RunTracer` (worker/obs/tracing/) are the implementations a serving worker plugs in,
together through `Observers`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from decimal import Decimal
from typing import Any, Protocol

from agentrun.worker.core.records import DecisionKind, PendingCall, Run, RunStatus
from agentrun.worker.core.types import LlmRequest, LlmResponse, Usage


class StepNotes(Protocol):
    """What the engine tells an observer about the step in flight (see `Observer.model_call`)."""

    def sent(self, request: LlmRequest) -> None:
        """A model step: the request about to be sent."""

    def answered(self, response: LlmResponse) -> None:
        """A model step: the response (before it is checkpointed)."""

    def checkpointed(self, seq: int, attempt: int = 1) -> None:
        """The step's row was written with this seq; `attempt` > 1 for a tool run again after a crash."""

    def tool_outcome(self, ok: bool, output: str) -> None:
        """A tool step: what the tool returned (`ok` False for an error the model will see)."""

UNKNOWN_TOOL = "(unknown)"
"""What a tool call is reported as when the model named no tool this worker has: names in model output
are untrusted, and each distinct one would otherwise become a metric series of its own."""


class Observer(Protocol):
    def model_step(self, model: str, usage: Usage, cost_usd: Decimal | None, seconds: float, ok: bool) -> None:
        """A model call ended: with a response (ok) or an error (no usage)."""

    def tool_step(self, tool: str, seconds: float, ok: bool) -> None:
        """A tool call ended; `ok` is False for an error outcome the model will see. `tool` is the
        name of one of the worker's tools, or UNKNOWN_TOOL."""

    def claimed(self, takeover: bool, run_id: uuid.UUID | None = None, taken_from: str | None = None) -> None:
        """The worker claimed a run; `takeover` if another worker (`taken_from`) held it (its lease had lapsed)."""

    def lease_lost(self) -> None:
        """The worker found out that a run it was driving is no longer its own."""

    def in_flight(self, runs: int) -> None:
        """How many runs the worker drives now."""

    def schedule_ticked(self, created: int, missed: int) -> None:
        """A ticker pass created `created` runs of schedules and skipped `missed` ticks past their deadline."""

    def model_retry(self, status: int) -> None:
        """A model call failed with `status` and is being retried (called inside the step's `model_call`)."""

    def driving(self, run: Run) -> AbstractContextManager[None]:
        """Around this worker's drive of a claimed run, from claim to finish or hand-back."""

    def model_call(self, run: Run) -> AbstractContextManager[StepNotes]:
        """Around one model step: the call, its retries and its checkpoint."""

    def tool_call(self, run: Run, name: str, tool_use_id: str, input: Any) -> AbstractContextManager[StepNotes]:
        """Around one tool step: its start row, the execution and its outcome row."""

    def run_ended(self, run: Run, status: RunStatus, reason: str | None) -> None:
        """The worker wrote the run's final status."""

    def decisions_read(self, run: Run, calls: Sequence[PendingCall]) -> None:
        """The run's calls that needed a person, as the worker read them before going on: decided or not."""

    def traceparent(self, run: Run) -> str | None:
        """The W3C traceparent of the span the run's drive is in now (a sub-agent's child run goes under
        it), or None when nothing is traced."""
        ...

    def parked(self, run: Run, calls: Sequence[tuple[str, DecisionKind, str]]) -> None:
        """The run now waits for people to decide on these calls (tool_use id, kind, tool name)."""


class _NoNotes:
    def sent(self, request: LlmRequest) -> None:
        pass

    def answered(self, response: LlmResponse) -> None:
        pass

    def checkpointed(self, seq: int, attempt: int = 1) -> None:
        pass

    def tool_outcome(self, ok: bool, output: str) -> None:
        pass


NO_NOTES = _NoNotes()


class NoObserver:
    """Observes nothing: the default, and the base of observers that care for a few hooks only."""

    def model_step(self, model: str, usage: Usage, cost_usd: Decimal | None, seconds: float, ok: bool) -> None:
        pass

    def tool_step(self, tool: str, seconds: float, ok: bool) -> None:
        pass

    def claimed(self, takeover: bool, run_id: uuid.UUID | None = None, taken_from: str | None = None) -> None:
        pass

    def lease_lost(self) -> None:
        pass

    def in_flight(self, runs: int) -> None:
        pass

    def schedule_ticked(self, created: int, missed: int) -> None:
        pass

    def model_retry(self, status: int) -> None:
        pass

    def driving(self, run: Run) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def model_call(self, run: Run) -> AbstractContextManager[StepNotes]:
        return contextlib.nullcontext(NO_NOTES)

    def tool_call(self, run: Run, name: str, tool_use_id: str, input: Any) -> AbstractContextManager[StepNotes]:
        return contextlib.nullcontext(NO_NOTES)

    def run_ended(self, run: Run, status: RunStatus, reason: str | None) -> None:
        pass

    def decisions_read(self, run: Run, calls: Sequence[PendingCall]) -> None:
        pass

    def traceparent(self, run: Run) -> str | None:
        return None

    def parked(self, run: Run, calls: Sequence[tuple[str, DecisionKind, str]]) -> None:
        pass


class _AllNotes:
    def __init__(self, notes: Sequence[StepNotes]) -> None:
        self.notes = notes

    def sent(self, request: LlmRequest) -> None:
        for n in self.notes:
            n.sent(request)

    def answered(self, response: LlmResponse) -> None:
        for n in self.notes:
            n.answered(response)

    def checkpointed(self, seq: int, attempt: int = 1) -> None:
        for n in self.notes:
            n.checkpointed(seq, attempt)

    def tool_outcome(self, ok: bool, output: str) -> None:
        for n in self.notes:
            n.tool_outcome(ok, output)


class Observers:
    """Several observers as one (metrics and traces), called in order; blocks nest in that order."""

    def __init__(self, *observers: Observer) -> None:
        self.observers = observers

    def model_step(self, model: str, usage: Usage, cost_usd: Decimal | None, seconds: float, ok: bool) -> None:
        for o in self.observers:
            o.model_step(model, usage, cost_usd, seconds, ok)

    def tool_step(self, tool: str, seconds: float, ok: bool) -> None:
        for o in self.observers:
            o.tool_step(tool, seconds, ok)

    def claimed(self, takeover: bool, run_id: uuid.UUID | None = None, taken_from: str | None = None) -> None:
        for o in self.observers:
            o.claimed(takeover, run_id, taken_from)

    def lease_lost(self) -> None:
        for o in self.observers:
            o.lease_lost()

    def in_flight(self, runs: int) -> None:
        for o in self.observers:
            o.in_flight(runs)

    def schedule_ticked(self, created: int, missed: int) -> None:
        for o in self.observers:
            o.schedule_ticked(created, missed)

    def model_retry(self, status: int) -> None:
        for o in self.observers:
            o.model_retry(status)

    @contextlib.contextmanager
    def driving(self, run: Run) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for o in self.observers:
                stack.enter_context(o.driving(run))
            yield

    @contextlib.contextmanager
    def model_call(self, run: Run) -> Iterator[StepNotes]:
        with contextlib.ExitStack() as stack:
            yield _AllNotes([stack.enter_context(o.model_call(run)) for o in self.observers])

    @contextlib.contextmanager
    def tool_call(self, run: Run, name: str, tool_use_id: str, input: Any) -> Iterator[StepNotes]:
        with contextlib.ExitStack() as stack:
            yield _AllNotes([stack.enter_context(o.tool_call(run, name, tool_use_id, input)) for o in self.observers])

    def run_ended(self, run: Run, status: RunStatus, reason: str | None) -> None:
        for o in self.observers:
            o.run_ended(run, status, reason)

    def decisions_read(self, run: Run, calls: Sequence[PendingCall]) -> None:
        for o in self.observers:
            o.decisions_read(run, calls)

    def traceparent(self, run: Run) -> str | None:
        return next((t for o in self.observers if (t := o.traceparent(run)) is not None), None)

    def parked(self, run: Run, calls: Sequence[tuple[str, DecisionKind, str]]) -> None:
        for o in self.observers:
            o.parked(run, calls)
