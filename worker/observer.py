"""The engine's observation seam: what a worker reports as it claims runs and takes steps.

Pure, no I/O. The default does nothing, so the engine and its tests need no metrics; `Metrics`
(worker/metrics.py) is the implementation a serving worker plugs in.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Protocol

from agentrun.worker.llm.types import Usage

UNKNOWN_TOOL = "(unknown)"
"""What a tool call is reported as when the model named no tool this worker has: names in model output
are untrusted, and each distinct one would otherwise become a metric series of its own."""


class Observer(Protocol):
    def model_step(self, model: str, usage: Usage, cost_usd: Decimal | None, seconds: float, ok: bool) -> None:
        """A model call ended: with a response (ok) or an error (no usage)."""

    def tool_step(self, tool: str, seconds: float, ok: bool) -> None:
        """A tool call ended; `ok` is False for an error outcome the model will see. `tool` is the
        name of one of the worker's tools, or UNKNOWN_TOOL."""

    def claimed(self, takeover: bool) -> None:
        """The worker claimed a run; `takeover` if another worker held it (its lease had lapsed)."""

    def lease_lost(self) -> None:
        """The worker found out that a run it was driving is no longer its own."""

    def in_flight(self, runs: int) -> None:
        """How many runs the worker drives right now."""

    def model_retry(self, status: int) -> None:
        """A model call failed with `status` and is being retried."""


class NoObserver:
    """Observes nothing: the default."""

    def model_step(self, model: str, usage: Usage, cost_usd: Decimal | None, seconds: float, ok: bool) -> None:
        pass

    def tool_step(self, tool: str, seconds: float, ok: bool) -> None:
        pass

    def claimed(self, takeover: bool) -> None:
        pass

    def lease_lost(self) -> None:
        pass

    def in_flight(self, runs: int) -> None:
        pass

    def model_retry(self, status: int) -> None:
        pass
