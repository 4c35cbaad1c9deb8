"""The engine's part for sub-agents: the tools a run's pinned sub-agents are to its model, and the child runs
a turn's calls of them start, the parent parked until they end (store/children.py)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from agentrun.worker.core import children as sub
from agentrun.worker.core.agents import Agent, with_agent
from agentrun.worker.core.errors import Refused
from agentrun.worker.core.observer import Observer
from agentrun.worker.core.records import NewRun, Origin, Progress, Run
from agentrun.worker.core.replay import Conversation
from agentrun.worker.core.submission import Caller, Offer, RunSpec
from agentrun.worker.runtime.door import Door
from agentrun.worker.runtime.durable import Durable, log
from agentrun.worker.runtime.lease import CancelRequested, LeaseKeeper
from agentrun.worker.store.agents import Agents
from agentrun.worker.store.children import Children
from agentrun.worker.tools import ToolBox


class SubAgents:
    def __init__(
        self, durable: Durable, children: Children, agents: Agents, door: Door, keeper: LeaseKeeper,
        tools: ToolBox, observer: Observer, *, max_children_per_turn: int, max_agent_depth: int,
    ) -> None:
        self.durable = durable
        self.store = children
        self.agents = agents
        self.door = door  # how the children's runs are made
        self.keeper = keeper
        self.tools = tools
        self.observer = observer
        self.max_children_per_turn = max_children_per_turn
        self.max_agent_depth = max_agent_depth
        # The pinned sub-agents of each run driven, by tool name, read once per drive.
        self._agents: dict[uuid.UUID, dict[str, Agent]] = {}

    def forget(self, run_id: uuid.UUID) -> None:
        """The run's drive has ended: what was read for it goes."""
        self._agents.pop(run_id, None)

    async def definitions(self, run: Run) -> list[dict[str, Any]]:
        """The run's sub-agents as tools: one per pinned sub-agent still defined."""
        found = []
        for tool in sub.refs_by_tool(run.sub_agents):
            try:
                agent = await self.agent(run, tool)
            except ValueError:
                continue  # not offered; a call of it anyway gets an error result
            found.append(sub.definition(agent.name, agent.version, agent.description))
        return found

    async def calls(
        self, run: Run, progress: Progress, conv: Conversation, calls: list[dict[str, Any]]
    ) -> Progress | None:
        """The turn's sub-agent calls, once every other call has its result: the result of each child that
        has ended is recorded; otherwise the children not made yet are made and the run waits for them
        (None), holding no lease and no slot. A call that cannot start a child gets an error result.
        Raises CancelRequested if the run was asked to stop before its children were made."""
        me, settle = self.durable.me, self.durable.settle
        ids = {u["id"] for u in calls}
        known = {c.parent_tool_use_id: c for c in await self.store.children(run.id) if c.parent_tool_use_id in ids}
        ended = [(u, known[u["id"]]) for u in calls if u["id"] in known and known[u["id"]].status.terminal]
        if ended:
            for use, child in ended:
                ok, output = sub.result_of(child, use["name"].removeprefix(sub.TOOL_PREFIX))
                progress = await settle(run, conv, use, ok, output)
            return progress
        made: list[NewRun] = []
        refused: list[tuple[dict[str, Any], str]] = []
        new = [u for u in calls if u["id"] not in known]
        room = max(self.max_children_per_turn - len(known), 0)
        for use in new[room:]:
            refused.append((use, f"error: at most {self.max_children_per_turn} sub-agent calls start in "
                                 "one turn; call it again in a later turn"))
        new = new[:room]
        if new and run.depth + 1 > self.max_agent_depth:
            refused += [(u, f"error: sub-agents nest at most {self.max_agent_depth} deep; this run is "
                            f"at depth {run.depth}") for u in new]
            new = []
        tasks: list[tuple[dict[str, Any], str, Agent]] = []
        for use in new:
            try:
                tasks.append((use, sub.task_of(use.get("input")), await self.agent(run, use["name"])))
            except (ValueError, Refused) as e:
                refused.append((use, f"error: {e}"))
        if tasks:
            try:
                share = sub.shares(run, progress.tokens_used, progress.cost_usd, progress.db_now, len(tasks))
            except ValueError as e:
                refused += [(use, f"error: {e}") for use, _, _ in tasks]
                tasks = []
        for use, task, agent in tasks:
            try:
                made.append(await self.child(run, use, task, agent, share))
            except (ValueError, Refused) as e:
                refused.append((use, f"error: sub-agent {agent.ref} cannot start: {e}"))
        for use, why in refused:
            progress = await settle(run, conv, use, False, why)
        if not made and len(known) == 0:
            return progress  # nothing to wait for: the model hears of the errors
        held = self.keeper.set_aside(run.id)
        try:
            parked = await self.durable.write(lambda again: self.door.spawn(
                run.id, me, made, epoch=run.lease_epoch, again=again
            ))
        except CancelRequested:  # asked to stop before the spawn: no child made, the run still held
            self.keeper.take_back(run.id, held)
            raise
        if not parked:  # every child had ended by then: their results are next
            self.keeper.take_back(run.id, held)
            if not made and not any(c.status.terminal for c in await self.store.children(run.id)):
                # The parent's count says none is at work, its children's rows say otherwise: never loop.
                raise RuntimeError(f"run {run.id} counts no sub-agent at work but none of its children has ended")
            return await self.calls(run, progress, conv, list(conv.pending.values()))
        log.info("%s run=%s waiting for %d sub-agents: %s", me, run.id.hex[:8], len(made) + len(known),
                 ", ".join(f"{n.agent}@{n.agent_version} {n.spawned_by[1] if n.spawned_by else ''}" for n in made))
        return None

    async def agent(self, run: Run, tool: str) -> Agent:
        """The pinned agent version the sub-agent tool `tool` of the run starts (read once per drive)."""
        agents = self._agents.setdefault(run.id, {})
        if tool not in agents:
            name, version = sub.refs_by_tool(run.sub_agents)[tool]
            found = await self.agents.agent(name, version, deleted=True, tenant=run.tenant)
            if found is None:
                raise ValueError(f"sub-agent {name}@{version} is no longer defined")
            agents[tool] = found
        return agents[tool]

    async def child(self, run: Run, use: dict[str, Any], task: str, agent: Agent, share: sub.Share) -> NewRun:
        """The child run a call asks for, planned by the door: the agent's definition, with budgets cut to its
        share of the parent's remainder and the parent's model, approvals policy, priority, author and trace
        where the agent names none of its own. Raises Refused or ValueError when it cannot run."""
        spec = with_agent(RunSpec(
            input=task, token_budget=sub.lowered(agent.token_budget, share.token_budget),
            cost_budget_usd=sub.lowered_cost(agent.cost_budget_usd, share.cost_budget_usd),
            timeout_seconds=sub.lowered(agent.timeout_seconds, share.timeout_seconds), priority=run.priority,
        ), agent)
        # Its agent's context policy (a child that fills its window compacts as its agent says); no webhook of
        # its own (its parent's tells of the tree: a child's end reaches the caller as its parent's result);
        # sub-agents pinned only when its agent names some.
        spec = dataclasses.replace(spec, webhook=None, sub_agents=spec.sub_agents or None)
        if spec.model is None:
            spec = dataclasses.replace(spec, model=run.model)
        if spec.require_approval is None and run.require_approval is not None:
            # The parent's names of its own sub-agents' tools mean nothing to the child unless it has them too.
            own = {sub.tool_name(ref) for ref in spec.sub_agents or ()}
            spec = dataclasses.replace(spec, require_approval=tuple(
                name for name in run.require_approval if not name.startswith(sub.TOOL_PREFIX) or name in own))
        caller = Caller(id=uuid.uuid4(), created_by=run.created_by, tenant=run.tenant,
                        traceparent=self.observer.traceparent(run) or sub.traceparent(run, use["id"]),
                        spawned_by=(run.id, use["id"]), root_run_id=run.root_run_id or run.id, depth=run.depth + 1)
        return await self.door.plan(spec, Origin.CHILD, caller, agent=agent, offer=Offer(
            has_tool=lambda name: self.tools.get(name) is not None, tool_names=self.tools.names))
