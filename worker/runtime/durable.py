"""The fenced writes of a held run, sent until their outcome is known, and the two that every part of the
engine makes: a call's result recorded without running it, and the run handed back."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import psycopg

from agentrun.worker.core.records import Progress, Run, Step, StepKind, StepStatus
from agentrun.worker.core.replay import Conversation
from agentrun.worker.store import LeaseLost
from agentrun.worker.store.claims import Claims
from agentrun.worker.store.groupcommit import transient
from agentrun.worker.store.steps import StepWrites

# The engine's parts log as the engine: one logger to follow a run by.
log = logging.getLogger("agentrun.worker.runtime.engine")

T = TypeVar("T")


def dumps(value: Any) -> str:
    """A call's input (or any value) as the JSON text a step row keeps."""
    return orjson.dumps(value).decode()


class Durable:
    """Writes to the runs one worker holds (`steps`: the step writes; `claims`: the hand-back)."""

    def __init__(self, me: str, lease_seconds: float, steps: StepWrites, claims: Claims, rng: random.Random) -> None:
        self.me = me
        self.lease_seconds = lease_seconds
        self.steps = steps
        self.claims = claims
        self._rng = rng

    async def write(self, write: Callable[[bool], Awaitable[T]]) -> T:
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

    async def settle(
        self, run: Run, conv: Conversation, use: dict[str, Any], ok: bool, output: str, recorded_seq: int | None = None,
    ) -> Progress:
        """Record a call's result without executing it (denied, recorded by a person, an answer checked, or
        served from a replay's recording: the recorded step's `recorded_seq`)."""
        tool_use_id, name = use["id"], use["name"]
        write_id = uuid.uuid4()
        progress = await self.write(lambda again: self.steps.settle_tool(
            run.id, self.me, self.lease_seconds, write_id=write_id, epoch=run.lease_epoch, again=again,
            tool_use_id=tool_use_id, tool_name=name, request=dumps(use.get("input")), ok=ok, output=output,
            recorded_seq=recorded_seq,
        ))
        status = StepStatus.DONE if ok else StepStatus.ERROR
        conv.apply(Step(run.id, conv.steps + 1, StepKind.TOOL, status, tool_name=name, tool_use_id=tool_use_id,
                        response=output, recorded_seq=recorded_seq))
        served = f" (served from recorded step {recorded_seq})" if recorded_seq is not None else ""
        log.info("%s run=%s TOOL %s id=%s recorded without running%s: %s", self.me, run.id.hex[:8], name,
                 tool_use_id, served, "ok" if ok else "error")
        return progress

    async def release(self, run: Run, delay: float | None = None) -> None:
        """Hand the run back (QUEUED, no holder; claimable after `delay` seconds); LeaseLost if it was not
        held under this claim any more, so the loss is logged like any other."""
        if not await self.write(lambda again: self.claims.release(
            run.id, self.me, delay=delay, epoch=run.lease_epoch, again=again
        )):
            raise LeaseLost(run.id, self.me)
