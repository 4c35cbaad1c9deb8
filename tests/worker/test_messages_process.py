"""kill -9 of a worker process right after it delivered a message: the run resumes elsewhere from its step
log, and the model sees the message exactly once (worker processes, the fake Messages API, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from agentrun.worker.core.records import RunStatus, StepKind
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic, Json, Reply
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.running import finished
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
MARK = "MSG-7f3a: use the EU region"


def _texts(body: Json) -> list[str]:
    out = []
    for m in body.get("messages", []):
        content = m["content"]
        if isinstance(content, str):
            out.append(content)
        else:
            out.extend(b.get("text", "") for b in content if b.get("type") == "text")
    return out


class HoldsTheFirstAnswer:
    """Holds the first request that carries the message (the worker is killed meanwhile); answers the rest."""

    def __init__(self) -> None:
        self.held = 0

    def __call__(self, body: Json) -> Reply:
        if any(MARK in t for t in _texts(body)) and not self.held:
            self.held += 1
            return Reply.text("never sent").after(120)
        return Reply.text("noted: EU region")


async def _worker(database_url: str, model_url: str, name: str) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    env = {**os.environ, "AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": model_url,
           "ANTHROPIC_API_KEY": "test-key", "PYTHONPATH": str(ROOT), "AGENTRUN_LOG_LEVEL": "WARNING"}
    proc = await start_worker(port, "--id", name, "--concurrency", "1", "--poll-interval", "0.1", "--no-migrate",
                              "--lease-seconds", "3", env=env, stdout=asyncio.subprocess.DEVNULL,
                              stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    await wait_ready(url, proc, timeout=60, what=f"{name} to be ready")
    return proc, url


async def test_kill_9_after_the_delivery_write_delivers_the_message_exactly_once(
    store: RunStore, database_url: str
) -> None:
    run, _ = await store.create(new_run("hello"))
    message, _ = await store.post_message(run.id, MARK, by="alice")
    assert message is not None
    async with FakeAnthropic(HoldsTheFirstAnswer()) as model:
        a, _ = await _worker(database_url, model.base_url, "worker-A")
        try:
            async def asked() -> bool:
                return any(MARK in t for body in model.requests for t in _texts(body))

            await eventually(asked, 60, "the model to be asked with the message")
            # The model is asked only after the delivery write committed: the USER step is there.
            assert [s.kind for s in await store.steps(run.id)] == [StepKind.USER]
            a.kill()  # SIGKILL, in the middle of the model call that follows the delivery
            await a.wait()
        finally:
            if a.returncode is None:
                a.kill()
                await a.wait()
        b, _ = await _worker(database_url, model.base_url, "worker-B")
        try:
            after = await finished(store, run.id, timeout=60)
        finally:
            await stop(b)
        bodies: list[Any] = list(model.requests)
    assert after.status is RunStatus.SUCCEEDED, after.error
    assert after.output == "noted: EU region" and (after.messages_sent, after.messages_delivered) == (1, 1)
    steps = await store.steps(run.id)
    assert [(s.kind, s.created_by) for s in steps] == [(StepKind.USER, "alice"), (StepKind.MODEL, None)]
    assert steps[1].worker == "worker-B"
    # Every request that had the message had it once, the same way: in the opening user turn after the input.
    with_it = [b for b in bodies if any(MARK in t for t in _texts(b))]
    assert len(with_it) == 2
    assert all(_texts(b) == ["hello", MARK] and len(b["messages"]) == 1 for b in with_it)
