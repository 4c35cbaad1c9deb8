"""A worker stops whatever its background loops were doing: a cancel that reaches one in the middle of a
query comes out of psycopg or its pool as an exception of theirs at times (a connection closed while the
query was being cancelled), and a loop that treats every exception as an outage to ride out would swallow
it and run on, so that Worker.run, awaiting the loop, never returns. One fresh run of the suite hung so."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from agentrun.worker.runtime.webhooks import WebhookSecrets, WebhookSender
from agentrun.worker.store import RunStore
from agentrun.worker.store.waits import SWEEP_BATCH
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import worker


class Swallowing(RunStore):
    """A store whose background queries turn a cancel into an ordinary exception, as psycopg may."""

    def __init__(self, pool: Any, method: str) -> None:
        super().__init__(pool)
        self.method = method
        self.entered = asyncio.Event()

    async def _blocked(self) -> Any:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("the connection is closed") from None

    async def wake_due(self, batch: int = SWEEP_BATCH) -> tuple[list[uuid.UUID], float | None]:
        if self.method == "wake_due":
            return await self._blocked()  # type: ignore[no-any-return]
        return await super().wake_due(batch)

    async def expire_waiting(self) -> list[uuid.UUID]:
        if self.method == "expire_waiting":
            return await self._blocked()  # type: ignore[no-any-return]
        return await super().expire_waiting()

    async def next_due_in(self) -> float | None:
        if self.method == "next_due_in":
            return await self._blocked()  # type: ignore[no-any-return]
        return await super().next_due_in()

    async def claim_webhooks(self, *args: Any, **kw: Any) -> Any:
        if self.method == "claim_webhooks":
            return await self._blocked()
        return await super().claim_webhooks(*args, **kw)


@pytest.mark.parametrize("method", ["wake_due", "expire_waiting", "next_due_in", "claim_webhooks"])
async def test_a_cancel_turned_into_an_exception_mid_query_still_stops_the_worker(
    store: RunStore, method: str
) -> None:
    swallowing = Swallowing(store.pool, method)
    w = worker(swallowing, ScriptedLlm())
    if method == "claim_webhooks":
        w.webhooks = WebhookSender(swallowing, w.id, WebhookSecrets(None), lambda run: b"{}")
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(swallowing.entered.wait(), 60)
    w.stop()
    await asyncio.wait_for(task, 60)
