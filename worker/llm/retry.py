"""Retrying: an `LlmClient` decorator that retries retryable model errors with full-jitter backoff.

Pure policy, no I/O of its own: the sleeper and the random source are injected, so tests run in no time.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Protocol

from agentrun.worker.core.types import LlmClient, LlmError, LlmRequest, LlmResponse, sane_retry_after

log = logging.getLogger(__name__)


class Sleeper(Protocol):
    async def __call__(self, seconds: float, /) -> None: ...


class Uniform(Protocol):
    def uniform(self, a: float, b: float, /) -> float: ...


def backoff(attempt: int, base: float, cap: float, rng: Uniform, retry_after: float | None = None) -> float:
    """Full jitter (uniform between 0 and min(cap, base * 2**attempt)), but never before `retry_after`.

    `retry_after` is bounded by MAX_RETRY_AFTER (and NaN ignored), so a server cannot park the caller.
    """
    wait = rng.uniform(0.0, min(cap, base * 2**attempt))
    return max(wait, sane_retry_after(retry_after) or 0.0)


class Retrying:
    """Up to `max_attempts` calls of `delegate`; waits between them per `backoff`.

    Only `LlmError`s with `retryable` set are retried (see `retryable_status`; the server's
    `x-should-retry` overrides it); anything else, and the last error, goes to the caller. The last
    error keeps its `retryable`, so the caller can tell "attempts exhausted, try again later" from
    "this request will never work". `on_retry(status)` is called before each wait (a metrics hook).
    """

    def __init__(
        self,
        delegate: LlmClient,
        max_attempts: int = 5,
        base: float = 1.0,
        cap: float = 30.0,
        sleeper: Sleeper = asyncio.sleep,
        rng: Uniform | None = None,
        on_retry: Callable[[int], None] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.delegate = delegate
        self.max_attempts = max_attempts
        self.base = base
        self.cap = cap
        self.sleeper = sleeper
        self.rng: Uniform = rng or random.Random()
        self.on_retry = on_retry

    async def send(self, request: LlmRequest) -> LlmResponse:
        attempt = 0
        while True:
            try:
                return await self.delegate.send(request)
            except LlmError as e:
                attempt += 1
                if not e.retryable or attempt >= self.max_attempts:
                    raise
                wait = backoff(attempt - 1, self.base, self.cap, self.rng, e.retry_after)
                log.warning(
                    "model call failed (%s), attempt %d of %d; retrying in %.1fs",
                    e, attempt, self.max_attempts, wait,
                )
                if self.on_retry is not None:
                    self.on_retry(e.status)
                await self.sleeper(wait)
