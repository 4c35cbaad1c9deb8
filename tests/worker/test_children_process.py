"""Sub-agents across real `agentrun worker` processes: every worker killed with SIGKILL while a planner's
two children are mid-call (so the parent's worker and the children's both die); a new worker resumes the
children, the parent gets both answers, and no call ever made a second child."""

from __future__ import annotations

import os
from pathlib import Path

from agentrun.worker.core.agents import Agent
from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic, TreeResponder
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.running import finished
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]


def _env(database_url: str, model_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": model_url, "ANTHROPIC_API_KEY": "test",
                "PYTHONPATH": str(REPO), "AGENTRUN_LLM_BACKOFF_BASE_SECONDS": "0.01"})
    return env


async def test_kill_9_of_every_worker_while_the_children_run_resumes_them_and_the_parent_succeeds(
    store: RunStore, database_url: str, db: object
) -> None:
    refs = []
    for name in ("researcher", "writer"):
        agent, _ = await store.put_agent(Agent(name=name, version=0, description=f"The {name}.", system=name))
        refs.append(agent.ref)
    async with FakeAnthropic(TreeResponder(child_latency=600)) as api:  # the children's first calls never end
        env = _env(database_url, api.base_url)
        args = ("--concurrency", "2", "--lease-seconds", "3", "--poll-interval", "0.1", "--no-migrate")
        ports = [free_port(), free_port()]
        first = [await start_worker(p, "--id", f"tree-{i}", *args, env=env) for i, p in enumerate(ports)]
        try:
            for p, proc in zip(ports, first, strict=True):
                await wait_ready(f"http://127.0.0.1:{p}", proc)
            parent, _ = await store.create(new_run("the question", system="planner", sub_agents=tuple(refs)))

            async def children_mid_call() -> bool:
                children = await store.children(parent.id)
                asked = [b for b in api.requests if "agent__" not in str(b.get("tools"))]
                return len(children) == 2 and all(c.status is RunStatus.RUNNING for c in children) and len(asked) >= 2

            await eventually(children_mid_call, 90, "both children running, in their model calls")
            waiting = await store.get(parent.id)
            assert waiting is not None and waiting.status is RunStatus.WAITING and waiting.locked_by is None
            for proc in first:
                proc.kill()  # SIGKILL: the parent's worker and its children's workers, mid-call
                await proc.wait()
        finally:
            for proc in first:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        api.responder = TreeResponder(child_latency=0.0)  # the children's calls are answered from now on
        port = free_port()
        second = await start_worker(port, "--id", "tree-2", *args, env=env)
        try:
            await wait_ready(f"http://127.0.0.1:{port}", second)
            done = await finished(store, parent.id, 120)
        finally:
            await stop(second)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.output == "combined: researcher: part 1 of: the question | writer: part 2 of: the question"
    children = await store.children(parent.id)
    assert len(children) == 2 and all(c.status is RunStatus.SUCCEEDED for c in children)
    assert all(c.locked_by == "tree-2" for c in children)  # resumed by the new worker
    cur = await db.execute(  # type: ignore[attr-defined]
        "SELECT count(*) FROM run WHERE parent_run_id = %s", (parent.id,))
    assert (await cur.fetchone())[0] == 2
