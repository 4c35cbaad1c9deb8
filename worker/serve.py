"""The composition root: a worker built from its settings (tools, model, store, runner, API), then run.

`agentrun worker`, `agentrun dev` and the demo's workers all start here, through `serve_worker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# What reads the settings, imported first; the rest once they are good: a worker that refuses its config
# exits without importing the web server, the database driver, or (factory, mcp) a provider's SDK.
from agentrun.worker.api.identities import Identities, IdentityFileError
from agentrun.worker.core.observer import Observer, Observers
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.llm.factory import llm_from_env, load_providers
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.obs.tracing import tracer_from_env
from agentrun.worker.tools import ToolBox, ToolThreads, load_tool_modules
from agentrun.worker.tools.mcp import McpConfigError, McpServers

if TYPE_CHECKING:
    from fastapi import FastAPI
    from psycopg_pool import AsyncConnectionPool

    from agentrun.worker.api.server import AppSlot, HttpServer
    from agentrun.worker.core.records import Run
    from agentrun.worker.core.types import LlmClient
    from agentrun.worker.llm.limits import Limiter
    from agentrun.worker.llm.providers import Providers
    from agentrun.worker.obs.tracing.spans import RunTracer
    from agentrun.worker.runtime.runner import Worker
    from agentrun.worker.runtime.webhooks import WebhookSender
    from agentrun.worker.settings import WorkerSettings
    from agentrun.worker.store import RunStore
    from agentrun.worker.store.pool import Readiness

log = logging.getLogger("agentrun.worker.serve")

MCP_FIRST_CONNECT_WAIT = 10.0
"""Seconds a worker waits, before it claims runs, for each MCP server's first connection attempt to end
(a refused connection ends it at once; an unanswering host takes this long at most)."""


async def serve_worker(settings: WorkerSettings, migrate_first: bool = True) -> int:
    """Serve /healthz at once, wait (retrying) for a usable database, then claim and drive runs.

    The HTTP server comes first and nothing ever blocks it: through a database outage at start the
    process is alive and not ready, and picks up work as soon as the database answers, without a restart.
    """
    parts = build(settings)
    await Serving(parts).run(migrate_first)
    log.info("%s stopped", settings.worker_id)
    return 0


# -- the parts, from the settings alone --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Parts:
    """What a worker is made of before it opens any connection."""

    settings: WorkerSettings
    tools: ToolBox
    mcp: McpServers
    metrics: Metrics
    providers: Providers
    tracer: RunTracer | None
    observer: Observer
    limiter: Limiter | None
    llm: LlmClient | None
    """None in a process that serves the API only (--concurrency 0): it needs no model."""
    prices: PriceTable
    identities: Identities


def build(settings: WorkerSettings) -> Parts:
    """Every part that reads a setting, before any connection is opened, so a missing or bad setting exits
    with its message alone (SystemExit); in this order, which is the order of those messages."""
    tools, mcp = tool_box(settings)
    metrics = Metrics(cache_seconds=settings.metrics_cache_seconds)
    metrics.watch_tool_threads(tools.threads)
    providers = model_providers(settings)
    tracer = tracer_of(settings)
    observer: Observer = Observers(metrics, tracer) if tracer is not None else metrics
    limiter = model_limiter(settings, metrics)
    llm = (llm_from_env(settings, on_retry=observer.model_retry, providers=providers, limiter=limiter)
           if settings.concurrency else None)
    return Parts(settings=settings, tools=tools, mcp=mcp, metrics=metrics, providers=providers, tracer=tracer,
                 observer=observer, limiter=limiter, llm=llm, prices=price_table(settings),
                 identities=identities_of(settings))


def tool_box(settings: WorkerSettings) -> tuple[ToolBox, McpServers]:
    """The Python tools of AGENTRUN_TOOLS and the MCP servers of AGENTRUN_MCP_SERVERS (not connected yet)."""
    try:
        python_tools = load_tool_modules(settings.tool_modules)
    except (ImportError, ValueError) as e:
        raise SystemExit(f"agentrun: cannot load tools from AGENTRUN_TOOLS: {e}") from None
    try:
        mcp = McpServers.load(settings.mcp_servers_file, os.environ, (t.name for t in python_tools))
    except McpConfigError as e:
        raise SystemExit(f"agentrun: AGENTRUN_MCP_SERVERS: {e}") from None
    try:
        tools = ToolBox(python_tools, threads=ToolThreads(settings.tool_threads), sources=mcp.servers)
    except ValueError as e:
        raise SystemExit(f"agentrun: cannot load tools from AGENTRUN_TOOLS: {e}") from None
    return tools, mcp


def model_providers(settings: WorkerSettings) -> Providers:
    """The providers of AGENTRUN_PROVIDERS, checked to serve the default model."""
    providers = load_providers(settings.providers_file)
    if problem := providers.problem(settings.default_model):
        raise SystemExit(f"agentrun: AGENTRUN_DEFAULT_MODEL: {problem}")
    return providers


def tracer_of(settings: WorkerSettings) -> RunTracer | None:
    """The tracer the OTEL_* variables describe, None when tracing is off."""
    try:
        return tracer_from_env(os.environ, settings.worker_id)
    except (ValueError, ImportError) as e:
        raise SystemExit(f"agentrun: {e}") from None


def model_limiter(settings: WorkerSettings, metrics: Metrics) -> Limiter | None:
    """The fleet-wide model limits of AGENTRUN_MODEL_LIMITS, for a worker that calls models."""
    if settings.model_limits_file is None or settings.concurrency <= 0:
        return None
    from agentrun.worker.llm.limits import Limiter, ModelLimits

    try:
        limits = ModelLimits.load(settings.model_limits_file)
    except (OSError, ValueError) as e:
        raise SystemExit(f"agentrun: cannot read the model limits (AGENTRUN_MODEL_LIMITS): {e}") from None
    return Limiter(limits, on_wait=metrics.limit_waited, on_use=metrics.limit_seen)


def price_table(settings: WorkerSettings) -> PriceTable:
    try:
        return PriceTable.load(settings.prices_file)
    except (OSError, ValueError) as e:
        raise SystemExit(f"agentrun: cannot read the price table (AGENTRUN_PRICES_FILE): {e}") from None


def webhook_sender(settings: WorkerSettings, store: RunStore, metrics: Metrics,
                   prices: PriceTable | None = None) -> WebhookSender:
    """The completion webhooks' sender of this worker: its secrets file, URL policy, backoff, and the run
    JSON of `GET /api/runs/{id}` as the body (an unknown cost null there too, given `prices`)."""
    import orjson

    from agentrun.worker.api.schemas import RunView
    from agentrun.worker.core.webhooks import Allow, Backoff
    from agentrun.worker.runtime.webhooks import SenderSettings, WebhookSecrets, WebhookSender

    def render(run: Run) -> bytes:
        return orjson.dumps(RunView.of(run, prices).model_dump(mode="json", by_alias=True))

    sender_settings = SenderSettings(
        timeout=settings.webhook_timeout,
        backoff=Backoff(settings.webhook_backoff, settings.webhook_backoff_max, settings.webhook_give_up),
        allow=Allow.parse(settings.webhook_allow), poll_interval=settings.webhook_poll_interval,
    )
    return WebhookSender(store, settings.worker_id, WebhookSecrets(settings.webhook_secrets_file), render,
                         sender_settings, on_outcome=metrics.webhook_attempted)


def identities_of(settings: WorkerSettings) -> Identities:
    """Who may call the API: AGENTRUN_API_TOKEN and the AGENTRUN_API_TOKENS file."""
    try:
        return Identities(settings.api_token, settings.api_tokens_file)
    except IdentityFileError as e:
        raise SystemExit(f"agentrun: {e}") from None


# -- the running worker ----------------------------------------------------------------------------------


class Serving:
    """A built worker's life: HTTP at once; each time the database is usable, a store, a runner and the full
    API, until SIGTERM or SIGINT; then everything closed, in order."""

    def __init__(self, parts: Parts) -> None:
        from agentrun.worker.api.app import create_starting_app
        from agentrun.worker.api.server import AppSlot, HttpServer
        from agentrun.worker.store.pool import Readiness

        self.parts, self.settings = parts, parts.settings
        self.stopping = asyncio.Event()
        self.worker: Worker | None = None
        self.pool: AsyncConnectionPool[Any] | None = None
        self.retention: asyncio.Task[None] | None = None
        self.readiness: Readiness = Readiness()
        self.starting: FastAPI = create_starting_app(self.readiness, parts.metrics)
        self.slot: AppSlot = AppSlot(self.starting)
        self.server: HttpServer = HttpServer(self.slot, self.settings.host, self.settings.port)

    async def run(self, migrate_first: bool) -> None:
        from agentrun.worker.store.pool import Backoff, wait_until_usable

        self.stop_on_signals()
        http = await self.serve_http()
        self.parts.mcp.start()  # in the background: a server that does not answer costs its own tools, not readiness
        try:
            while await wait_until_usable(self.settings.database_url, self.readiness, self.stopping,
                                          migrate_first=migrate_first,
                                          backoff=Backoff(cap=self.settings.database_retry_max)):
                if await self.serve_with_database():
                    break
        finally:
            await self.close(http)

    def stop_on_signals(self) -> None:
        def stop() -> None:
            self.stopping.set()
            if self.worker:
                self.worker.stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)

    async def serve_http(self) -> asyncio.Task[None]:
        """The HTTP server, answering (with the starting app) before this returns."""
        http = asyncio.create_task(self.server.serve(), name="http")
        while not self.server.started:
            if http.done():  # uvicorn logged why (the port is taken, say) and gave up
                raise SystemExit(f"agentrun: cannot serve HTTP on {self.settings.host}:{self.settings.port}")
            await asyncio.sleep(0.01)
        return http

    async def serve_with_database(self) -> bool:
        """Open the pool, build the store, the runner and the full API, and drive runs until stopped: True.
        False when the database went away before the runner began (back to waiting for it, as at start)."""
        import psycopg
        import psycopg_pool

        from agentrun.worker.api.server import settle_heap

        pool = await self.open_pool()
        if pool is None:
            return False
        store = self.store(pool)
        if self.settings.tenant_quotas:  # the chart's, for tenants never set through the API or the CLI
            try:
                applied = await store.seed_quotas(self.settings.tenant_quotas)
                log.info("%s applied the initial quotas of tenants: %s", self.settings.worker_id,
                         ", ".join(applied) or "none (each was set through the API or the CLI)")
            except psycopg.Error as e:  # not worth failing the start for: the next start applies them
                log.warning("%s could not apply the initial tenant quotas: %s", self.settings.worker_id, e)
        self.worker = await self.runner(store)
        self.slot.app = self.api(store)
        settle_heap()  # start-up's objects kept out of the full collections' walk (api/server.py)
        log.info(
            "%s serving on :%d with %d slots, lease %gs, tools: %s",
            self.settings.worker_id, self.settings.port, self.settings.concurrency, self.settings.lease_seconds,
            ", ".join(self.parts.tools.names) or "none",
        )
        if self.worker is None:
            await self.stopping.wait()
            return True
        if self.stopping.is_set():
            self.worker.stop()
        try:
            await self.worker.run()
            return True
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as e:
            # Lost before the worker could begin (its presence session could not connect): no run is
            # held yet, so back to waiting for the database, as at start.
            log.warning("%s lost the database while starting (%s); waiting for it again", self.settings.worker_id, e)
        self.worker = None
        self.slot.app = self.starting
        self.readiness.reason = "database lost while starting"
        await pool.close()
        self.pool = None
        return False

    async def open_pool(self) -> AsyncConnectionPool[Any] | None:
        import psycopg_pool

        from agentrun.worker.store.pool import open_pool

        try:
            self.pool = await open_pool(self.settings.database_url, max_size=self.settings.pool_max)
        except psycopg_pool.PoolTimeout as e:  # gone again between the check and the pool
            log.warning("%s cannot open its connection pool (%s); waiting for the database again",
                        self.settings.worker_id, e)
            return None
        return self.pool

    def store(self, pool: AsyncConnectionPool[Any]) -> RunStore:
        """The store on `pool`, and what else uses the pool: the model limits, retention, the run metrics."""
        from agentrun.worker.store import RunStore

        store = RunStore(pool)
        if self.parts.limiter is not None:
            self.parts.limiter.attach(pool)
        self.start_retention(pool)
        self.parts.metrics.count_runs_with(store.count_by_status, store.count_by_tenant)
        self.parts.metrics.watch_writes(store.writes.stats)
        return store

    def start_retention(self, pool: AsyncConnectionPool[Any]) -> None:
        """Pruning of old runs (AGENTRUN_RETENTION_DAYS) and of events past AGENTRUN_EVENT_RETENTION, once per
        process whatever the reconnections."""
        if self.retention is not None:
            return
        from agentrun.worker.store.retention import prune_periodically

        self.retention = asyncio.create_task(prune_periodically(
            pool, self.settings.retention_days, self.settings.retention_interval, self.stopping,
            on_batch=self.parts.metrics.pruned, event_retention=self.settings.event_retention,
        ), name="retention")

    async def runner(self, store: RunStore) -> Worker | None:
        """The runner that claims and drives runs; None in a process that serves the API only."""
        if self.parts.llm is None:
            return None
        from agentrun.worker.runtime.runner import Worker

        await self.parts.mcp.settled(MCP_FIRST_CONNECT_WAIT)
        return Worker(self.settings, store, self.parts.llm, self.parts.tools, self.parts.prices,
                      observer=self.parts.observer, webhooks=webhook_sender(self.settings, store, self.parts.metrics,
                                                             self.parts.prices),
                      mcp_servers=[s.config.name for s in self.parts.mcp.servers])

    def api(self, store: RunStore) -> FastAPI:
        from agentrun.worker.api.app import create_app

        p = self.parts
        return create_app(store, p.tools, self.settings, p.metrics, p.prices, p.identities, p.providers,
                          claiming=claiming(self.worker) if self.worker is not None else None)

    async def close(self, http: asyncio.Task[None]) -> None:
        """Stop the background tasks, then the HTTP server, then close the pool and the clients."""
        self.stopping.set()
        if self.retention is not None:
            with contextlib.suppress(Exception):
                await self.retention
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await http
        if self.pool is not None:
            await self.pool.close()
        if self.parts.llm is not None:
            from agentrun.worker.llm.router import close_client

            with contextlib.suppress(Exception):
                await close_client(self.parts.llm)
        await self.parts.mcp.close()
        if self.parts.tracer is not None:
            await asyncio.to_thread(self.parts.tracer.shutdown)  # exports the spans still buffered


def claiming(worker: Worker) -> Callable[[], str | None]:
    """Why `worker` cannot claim now, for /readyz: without its presence session (the liveness lock and
    the wake-ups) it does not claim, and a pod that cannot take work should not count as ready."""
    def why() -> str | None:
        if worker.settings.liveness_lock and not worker.presence.ready.is_set():
            return "worker presence session down (reconnecting)"
        return None
    return why
