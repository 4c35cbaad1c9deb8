"""Waiting on a condition with a deadline, the tests' only way to wait (never a bare sleep)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition") -> None:
    """Wait on a condition with a deadline (never a bare sleep)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
