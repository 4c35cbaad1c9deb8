"""A replay across real `agentrun worker` processes: runs recorded by a worker that calls a non-idempotent
tool, replayed on another model; the worker is killed (SIGKILL) in the middle of the replay, after it served
a call from the recording; a new worker resumes the replay run, which succeeds with the recorded results, and
the execution log proves the tool never ran during the replay."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg

from agentrun.worker.core.recording import Change, NewReplay
from agentrun.worker.core.records import RunStatus, StepKind
from agentrun.worker.core.submission import Caller
from agentrun.worker.runtime.door import Door
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic
from tests.replays.model import RECORDED_MODEL, REPLAY_MODEL, PlanResponder, plan
from tests.replays.tools import executed, worker_env
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.running import finished
from tests.support.waiting import eventually

ARGS = ("--concurrency", "2", "--lease-seconds", "3", "--poll-interval", "0.1", "--no-migrate")


async def test_a_worker_killed_mid_replay_is_resumed_and_the_tool_never_runs(
    store: RunStore, database_url: str, db: psycopg.AsyncConnection[Any], tmp_path: Path,
) -> None:
    log = tmp_path / "executed.log"
    responder = PlanResponder()
    async with FakeAnthropic(responder) as api:
        env = worker_env(database_url, api.base_url, log)
        port = free_port()
        first = await start_worker(port, "--id", "replay-1", *ARGS, env=env)
        try:
            await wait_ready(f"http://127.0.0.1:{port}", first)
            calls = plan(("charge", {"amount": 5, "to": "bob"}), ("lookup", {"q": "x"}))
            recorded, _ = await store.create(new_run(calls, model=RECORDED_MODEL, tools=("charge", "lookup")))
            recorded = await finished(store, recorded.id, 60)
            assert recorded.status is RunStatus.SUCCEEDED, recorded.error
            assert recorded.output == f"{RECORDED_MODEL}: charged 5 to bob | found x"
            ran = executed(str(log))
            assert ran == ['charge {"amount": 5, "to": "bob"}', 'lookup {"q": "x"}']

            responder.hang = (REPLAY_MODEL, 1)  # the replay's second model call: after its first call was served
            replay = NewReplay(id=uuid.uuid4(), request={"runs": [str(recorded.id)]}, change=Change(model=REPLAY_MODEL))
            await Door(store).replay(replay, [recorded], Caller(created_by="ci"))
            (run,) = [r for r in await store.list_runs() if r.replay_id == replay.id]

            async def served_and_asking_again() -> bool:
                step = await store.step(run.id, 2)
                asked = [b for b in api.requests if b.get("model") == REPLAY_MODEL
                         and sum(1 for m in b.get("messages", []) if m.get("role") == "assistant") == 1]
                return step is not None and step.recorded_seq == 2 and bool(asked)

            await eventually(served_and_asking_again, 60, "the first call served, the model asked again")
            first.kill()  # SIGKILL, in the middle of the replay run's second model call
            await first.wait()
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()
        responder.hang = None
        port = free_port()
        second = await start_worker(port, "--id", "replay-2", *ARGS, env=env)
        try:
            await wait_ready(f"http://127.0.0.1:{port}", second)
            done = await finished(store, run.id, 60)
        finally:
            await stop(second)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.locked_by == "replay-2" and done.crashes >= 1
    assert done.output == f"{REPLAY_MODEL}: charged 5 to bob | found x"
    tools = [s for s in await store.steps(run.id) if s.kind is StepKind.TOOL]
    assert [(s.tool_name, s.recorded_seq, s.attempts, s.response) for s in tools] == [
        ("charge", 2, 0, "charged 5 to bob"), ("lookup", 4, 0, "found x")]
    assert executed(str(log)) == ran  # nothing ran during the replay
