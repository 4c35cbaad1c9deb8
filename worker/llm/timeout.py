"""TimeLimited: an `LlmClient` decorator that bounds one model call, inside the retry loop."""

from __future__ import annotations

import asyncio

from agentrun.worker.core.types import LlmClient, LlmError, LlmRequest, LlmResponse

STEP_TIMEOUT = "step timeout"


class TimeLimited:
    """Cancels a call to `delegate` after `seconds` and raises the retryable `LlmError(-1, None, "step timeout")`.

    Only this attempt's own deadline becomes an LlmError: a cancellation from outside (the run's
    deadline, a shutdown) passes through untouched.
    """

    def __init__(self, delegate: LlmClient, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"the attempt time limit must be positive, got {seconds}")
        self.delegate = delegate
        self.seconds = seconds

    async def send(self, request: LlmRequest) -> LlmResponse:
        try:
            async with asyncio.timeout(self.seconds):
                return await self.delegate.send(request)
        except TimeoutError:
            raise LlmError(-1, None, STEP_TIMEOUT) from None
