"""Runs with sub-agents for the API, CLI, UI and operator tests: agents defined in the store, a planner
run that calls them, and a held tree (its children at work) to look at while it waits."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agentrun.worker.core.agents import Agent
from agentrun.worker.core.records import Run, RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import TreeLlm
from tests.support.builders import new_run, worker
from tests.support.running import finished, running
from tests.support.waiting import eventually


async def define(store: RunStore, name: str, **kw: Any) -> str:
    """An agent `name` (its system prompt is its name, as TreeLlm answers); its pinned ref."""
    agent, _ = await store.put_agent(Agent(name=name, version=0, description=f"The {name}.", system=name, **kw))
    return agent.ref


async def planner(store: RunStore, *subs: str, **kw: Any) -> Run:
    """A queued run with `subs` as its sub-agents (TreeLlm calls each once, in parallel)."""
    refs = tuple([await define(store, s) for s in subs])
    run, _ = await store.create(new_run(kw.pop("input", "the question"), system="planner", sub_agents=refs, **kw))
    return run


async def finished_tree(store: RunStore, *subs: str, **kw: Any) -> Run:
    """A planner over `subs`, driven to its end; the parent as it ended."""
    parent = await planner(store, *subs, **kw)
    async with running(worker(store, TreeLlm(), concurrency=4)):
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED, done.error
    return done


@contextlib.asynccontextmanager
async def tree_at_work(store: RunStore, *subs: str, **kw: Any) -> AsyncIterator[tuple[Run, asyncio.Event]]:
    """A planner over `subs` WAITING for its children, which are RUNNING and held until the event is set;
    the workers stop when the block ends (set the event first to let the tree finish)."""
    hold = asyncio.Event()
    parent = await planner(store, *subs, **kw)
    async with running(worker(store, TreeLlm(hold=hold), concurrency=len(subs) + 1)):
        async def at_work() -> bool:
            children = await store.children(parent.id)
            run = await store.get(parent.id)
            return (len(children) == len(subs) and all(c.status is RunStatus.RUNNING for c in children)
                    and run is not None and run.status is RunStatus.WAITING)

        await eventually(at_work, 60, "the children running, the parent waiting for them")
        try:
            yield parent, hold
        finally:
            hold.set()


async def child_ids(store: RunStore, run_id: uuid.UUID) -> list[str]:
    return [str(c.id) for c in await store.children(run_id)]
