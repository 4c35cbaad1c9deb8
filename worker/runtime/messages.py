"""The engine's part for messages posted to a run: delivered as USER steps at a turn boundary."""

from __future__ import annotations

import uuid

from agentrun.worker.core.guard import Stop, guard
from agentrun.worker.core.records import Progress, Run, RunStatus
from agentrun.worker.core.replay import Conversation
from agentrun.worker.runtime.durable import Durable, log
from agentrun.worker.store.messages import Messages as MessageStore


class Messages:
    def __init__(self, durable: Durable, store: MessageStore) -> None:
        self.durable = durable
        self.store = store

    async def deliver(self, run: Run, progress: Progress, conv: Conversation) -> Progress | Stop:
        """Deliver the messages posted to the run as USER steps, in the order received: at a turn boundary
        (the model's turn and all its tool calls done, so never between a tool_use and its result), before
        the next model call. The write marks them delivered with the steps, once (store/messages.py)."""
        own = conv.steps - run.inherited_steps
        room = run.max_steps - own - 1  # the messages, and one step left for the model to answer them
        if room < 1:
            return Stop(RunStatus.FAILED, f"step cap reached: a message came at step {own} of at most "
                        f"{run.max_steps}, which leaves no step to answer it")
        stop = guard(run, progress, own, before_model_step=True)  # no message the model cannot answer
        if stop is not None:
            return stop
        write_id = uuid.uuid4()
        me = self.durable.me
        steps, progress = await self.durable.write(lambda again: self.store.deliver_messages(
            run.id, me, self.durable.lease_seconds, write_id=write_id, epoch=run.lease_epoch, again=again,
            limit=room,
        ))
        for step in steps:
            conv.apply(step)
            log.info("%s run=%s seq=%d USER message from %s", me, run.id.hex[:8], step.seq,
                     step.created_by or "-")
        return progress
