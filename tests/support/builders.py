"""Small builders shared by the tests: a new run, an in-process worker, the health-only HTTP app."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from agentrun.worker.core.observer import Observer
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import NewRun
from agentrun.worker.core.types import LlmClient
from agentrun.worker.runtime.runner import Worker
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import Tool, ToolBox

MODEL = "claude-sonnet-4-5"


class SimulatedCrash(BaseException):
    """A crash the engine does not catch: the worker dies holding its lease."""


def new_run(input: str = "find x", **kw: object) -> NewRun:
    fields: dict[str, object] = {"input": input, "model": MODEL, "token_budget": 10_000, "timeout_seconds": 300}
    fields.update(kw)
    return NewRun(**fields)  # type: ignore[arg-type]


def worker(
    store: RunStore,
    llm: LlmClient,
    tools: list[Tool] | ToolBox = (),  # type: ignore[assignment]
    name: str = "worker-A",
    lease: float = 30.0,
    concurrency: int = 4,
    poll: float = 0.05,
    prices: PriceTable | None = None,
    observer: Observer | None = None,
    liveness_lock: bool = True,
) -> Worker:
    settings = WorkerSettings(
        database_url="unused", worker_id=name, lease_seconds=lease, concurrency=concurrency, poll_interval=poll,
        shutdown_grace=5.0, liveness_lock=liveness_lock,
    )
    box = tools if isinstance(tools, ToolBox) else ToolBox(tools)
    return Worker(settings, store, llm, box, prices or PriceTable.load(), observer=observer)


def dec(x: str) -> Decimal:
    return Decimal(x)


def http_app(store: RunStore) -> Any:
    """The worker's HTTP app over `store`, for tests that only need its health endpoints."""
    from agentrun.worker.api.app import create_app
    from agentrun.worker.obs.metrics import Metrics

    return create_app(store, ToolBox(), WorkerSettings(database_url="unused"), Metrics())
