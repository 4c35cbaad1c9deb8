"""Waits across real `agentrun worker` processes: a run sleeping 3 s resumes once after a kill -9 of the worker
that parked it; a run parked on an event whose worker is killed gets the event posted while no worker is up;
an event posted before its waiter is delivered."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentrun.worker.core.records import RunStatus, StepKind, StepStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import AgentResponder, FakeAnthropic, Reply
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.running import finished
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
ARGS = ("--concurrency", "2", "--lease-seconds", "3", "--poll-interval", "0.2", "--no-migrate")
SLEEP = AgentResponder(tool="wait", input={"seconds": 3})
EVENT = AgentResponder(tool="wait_for_event", input={"key": "reply:42", "timeoutSeconds": 600})


def responder(body: dict[str, Any]) -> Reply:
    """Sleeps 3 s, or waits for the event reply:42, whichever the run is offered; then answers."""
    offered = {t.get("name") for t in body.get("tools", [])}
    return (EVENT if "wait_for_event" in offered else SLEEP)(body)


def _env(database_url: str, model_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": model_url, "ANTHROPIC_API_KEY": "test",
                "PYTHONPATH": str(REPO), "AGENTRUN_LLM_BACKOFF_BASE_SECONDS": "0.01"})
    return env


async def _tool_steps(store: RunStore, run: Any) -> list[Any]:
    return [s for s in await store.steps(run.id) if s.kind is StepKind.TOOL]


async def test_a_run_sleeping_3s_resumes_once_after_a_kill_9_of_the_worker_that_parked_it(
    store: RunStore, database_url: str
) -> None:
    async with FakeAnthropic(responder) as api:
        env = _env(database_url, api.base_url)
        port = free_port()
        first = await start_worker(port, "--id", "sleep-1", *ARGS, env=env)
        try:
            await wait_ready(f"http://127.0.0.1:{port}", first)
            # The one that waits without end first: then both are parked for the sleeper's whole 3 s.
            eventer, _ = await store.create(new_run("wait for the reply", tools=("wait_for_event",)))
            sleeper, _ = await store.create(new_run("sleep a while", tools=("wait",)))

            async def both_parked() -> bool:
                runs = [await store.get(sleeper.id), await store.get(eventer.id)]
                return all(r is not None and r.status is RunStatus.WAITING and r.locked_by is None for r in runs)

            await eventually(both_parked, 60, "both runs parked")
            first.kill()  # SIGKILL: right after parking, nothing else done
            await first.wait()
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()
        # No worker is up: the event is kept and the waiting run is marked woken with its payload.
        posted = await store.post_event("reply:42", {"answer": "yes"})
        assert posted.woke == [eventer.id]
        port = free_port()
        second = await start_worker(port, "--id", "sleep-2", *ARGS, env=env)
        try:
            await wait_ready(f"http://127.0.0.1:{port}", second)
            slept = await finished(store, sleeper.id, 60)
            replied = await finished(store, eventer.id, 60)
        finally:
            await stop(second)
        asked = len(api.requests)
    assert slept.status is RunStatus.SUCCEEDED, slept.error
    [step] = await _tool_steps(store, slept)
    assert step.status is StepStatus.DONE and step.response is not None and step.response.startswith("waited ")
    assert float(step.response.split()[1]) >= 3.0
    assert step.worker == "sleep-2"  # resumed by the second worker, once
    assert slept.output is not None and "waited" in str(slept.output)
    assert replied.status is RunStatus.SUCCEEDED, replied.error
    [step] = await _tool_steps(store, replied)
    assert (step.status, step.response) == (StepStatus.DONE, '{"answer":"yes"}')
    assert asked == 4  # each run: one turn that waits, one after it; nothing asked twice


async def test_an_event_posted_before_its_waiter_is_delivered(store: RunStore, database_url: str) -> None:
    posted = await store.post_event("reply:42", "early")
    assert posted.woke == []
    async with FakeAnthropic(responder) as api:
        port = free_port()
        proc = await start_worker(port, "--id", "early-1", *ARGS, env=_env(database_url, api.base_url))
        try:
            await wait_ready(f"http://127.0.0.1:{port}", proc)
            run, _ = await store.create(new_run("wait for the reply", tools=("wait_for_event",)))
            done = await finished(store, run.id, 60)
        finally:
            await stop(proc)
    assert done.status is RunStatus.SUCCEEDED, done.error
    [step] = await _tool_steps(store, done)
    assert (step.status, step.response) == (StepStatus.DONE, '"early"')
