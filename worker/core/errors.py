"""The errors several layers must catch: a failed model call, a lost lease, a cancel request.

Raised below (the store, the lease keeper, the model adapters) and caught above (the engine, the runner,
the tracing spans), so they sit in the core, which every layer may import. Each room's own errors live in
its `errors.py`, re-exported from the modules callers import them from.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import uuid
from collections.abc import Sequence

__all__ = [
    "MAX_RETRY_AFTER",
    "RETRYABLE_4XX",
    "CancelRequested",
    "DoesNotFit",
    "LeaseLost",
    "LlmError",
    "OverQuota",
    "Problem",
    "Refusal",
    "Refused",
    "WebhookProblem",
    "retryable_status",
    "sane_retry_after",
]

RETRYABLE_4XX = frozenset({408, 409, 429})
"""The client errors worth another attempt, as the Anthropic SDK has them: a request timeout (408), a lock
timeout (409) and a rate limit (429). Every other 4xx (400, 401, 403, 404, 413, 422, ...) says the request
itself is wrong, so the same request would fail the same way: it is not retried."""

MAX_RETRY_AFTER = 60.0
"""Longest wait a `retry-after` can ask for, in seconds. The header is foreign input: a proxy may send an
absurd value ("inf", a year), and a wait that long would park a run and its lease. Past a minute the retry
policy's own backoff, and handing the run back when attempts are exhausted, serve better than obeying."""


def retryable_status(status: int) -> bool:
    """Whether a call that failed with `status` (-1: no HTTP answer at all) is worth another attempt.

    Connection errors and timeouts (-1), 408, 409, 429 and every 5xx (529 overloaded included) are; every
    other status is not.
    """
    return status == -1 or status in RETRYABLE_4XX or 500 <= status <= 599


def sane_retry_after(seconds: float | None) -> float | None:
    """`seconds` bounded to [0, MAX_RETRY_AFTER]; None for None or NaN (no usable hint)."""
    if seconds is None or math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


class LlmError(Exception):
    """A failed model call. `status` is the HTTP status, or -1 for connection errors and timeouts.

    `retryable` says whether the same request may succeed later: by default `retryable_status(status)`;
    an adapter passes the server's own verdict (Anthropic's `x-should-retry` header) when it has one. A
    caller that runs out of attempts on a retryable error can hand the work back for later instead of
    failing it. `retry_after` (seconds) is always within [0, MAX_RETRY_AFTER], or None.
    """

    def __init__(
        self, status: int, retry_after: float | None = None, message: str = "", *, retryable: bool | None = None
    ) -> None:
        super().__init__(f"model error {status}: {message}" if message else f"model error {status}")
        self.status = status
        self.retry_after = sane_retry_after(retry_after)
        self.message = message
        self.retryable = retryable_status(status) if retryable is None else retryable


class LeaseLost(Exception):
    """The worker no longer holds the run: another worker took it over, or it finished or was stopped, or
    the same worker claimed it again since (a later lease epoch) and the write came from the earlier claim."""

    def __init__(self, run_id: uuid.UUID, worker: str) -> None:
        super().__init__(f"worker {worker} no longer holds run {run_id}")
        self.run_id = run_id
        self.worker = worker


class DoesNotFit(Exception):
    """A model request that cannot fit the model's context window even after the run's context management
    (core/context.py): the run fails before it is sent, never with the provider's 400 after paying for it."""


class CancelRequested(Exception):
    """The call or tool in flight was interrupted because someone asked the run to stop."""


# -- a request that makes no run (core/submission.py) -----------------------------------------------


class Refusal(enum.Enum):
    """Why a request makes no run; the API answers each with its own status code."""

    INVALID = "invalid"  # incomplete or contradictory (422)
    CONFLICT = "conflict"  # the source is in no state for it: a continuation of a run that did not succeed (409)
    UNFIT = "unfit"  # well formed, but not runnable: a fork past its source's steps, a bad schema... (400)
    NOT_FOUND = "not_found"  # it names something there is none of: an agent, or a version of one (404)


@dataclasses.dataclass(frozen=True)
class Problem:
    field: str  # as the REST body and the AgentRun spec both name it: `tokenBudget`, `tools[1]`
    problem: str
    unknown_tool: str | None = None  # the name, when the problem is a tool the workers do not offer


class Refused(ValueError):
    """The request makes no run: `message` says why in one line, `problems` name the fields at fault."""

    def __init__(self, kind: Refusal, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.kind, self.message, self.problems = kind, message, list(problems)

    @classmethod
    def of(cls, kind: Refusal, problems: Sequence[Problem]) -> Refused:
        return cls(kind, "; ".join(f"{p.field}: {p.problem}" for p in problems), problems)


class OverQuota(Exception):
    """A new run its tenant's quota refuses: `quota` names it as the API does (`maxQueued`, `tokensPerDay`,
    `costPerDayUsd`), `retry_after` is the seconds after which asking again may succeed (when the rolling
    day's window allows again, for a budget; a guess for a full queue), `message` says why in one line.
    Nothing was written. The API answers 429 with `Retry-After`; a schedule's tick records it and tries the
    next tick; the operator retries the AgentRun later."""

    def __init__(self, quota: str, retry_after: float, message: str) -> None:
        super().__init__(message)
        self.quota, self.retry_after, self.message = quota, retry_after, message


class WebhookProblem(ValueError):
    """A `webhook` that cannot be accepted; `field` names the part (`webhook.url`, ...)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem
