"""The engine's part for replay runs (issue 47): each tool call answered from the recorded run's step log, run
live only where the replay's tool policy allows it, never parked for a person, a child or a timer."""

from __future__ import annotations

import uuid
from typing import Any

from agentrun.worker.core.answer import FINAL_ANSWER
from agentrun.worker.core.decisions import Execute
from agentrun.worker.core.recording import Abilities, Recording, ToolPolicy, blocked_because
from agentrun.worker.core.records import Progress, Run, StepStatus
from agentrun.worker.core.replay import Conversation
from agentrun.worker.runtime.durable import Durable
from agentrun.worker.store.reads import Reads
from agentrun.worker.tools import BUILTINS, ToolBox


class Recorded:
    """Serves the calls of replay runs (`run.replay_id` set). The engine hands it every call such a run owes,
    instead of to people, waits and sub-agents: a call in doubt after a crash is served again from the
    recording (or blocked, or run live if the policy allows it), and never reconciled, asked or parked."""

    def __init__(self, durable: Durable, store: Reads, tools: ToolBox) -> None:
        self.durable = durable
        self.store = store
        self.tools = tools
        # Per drive: what each replay run may be served and what it took, read at its first call.
        self._recordings: dict[uuid.UUID, Recording] = {}

    def forget(self, run_id: uuid.UUID) -> None:
        self._recordings.pop(run_id, None)

    async def next(self, run: Run, conv: Conversation, owed: list[dict[str, Any]]) -> Progress | Execute:
        """Answer the first call owed: served from the recording or blocked (an error result), both recorded
        as the call's TOOL step without running anything (its progress); or Execute: it runs live."""
        use = owed[0]
        name, tool_input = use["name"], use.get("input")
        recording = await self._recording(run)
        found = recording.take(name, tool_input)
        if found is not None:
            return await self.durable.settle(run, conv, use, found.status is StepStatus.DONE, found.response or "",
                                             recorded_seq=found.seq)
        why = blocked_because(ToolPolicy(run.tool_policy), name, self._abilities(run, name))
        if why is None:
            return Execute(use)
        return await self.durable.settle(run, conv, use, False, why)

    async def _recording(self, run: Run) -> Recording:
        recording = self._recordings.get(run.id)
        if recording is None:
            assert run.replay_of is not None, f"run {run.id} is a replay of no run"
            after = run.forked_at_seq or 0
            steps = await self.store.tool_calls([run.replay_of, run.id], after)
            # A structured answer is the engine's to check, never served: its calls are not a tool's.
            skip = (lambda name: name == FINAL_ANSWER) if run.output_schema is not None else (lambda name: False)
            recording = Recording(steps[run.replay_of], steps[run.id], skip)
            self._recordings[run.id] = recording
        return recording

    def _abilities(self, run: Run, name: str) -> Abilities:
        tool = self.tools.get(name)
        known = tool is not None and BUILTINS.get(name) is not tool
        needs_approval = (tool is not None and tool.requires_approval) or run.needs_approval(name)
        if tool is None or not known:
            return Abilities(False, False, False, False, needs_approval)
        return Abilities(True, tool.read_only, tool.idempotent, tool.destructive, needs_approval)
