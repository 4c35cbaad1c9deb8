"""The HTTP application served by `agentrun worker --port`: the REST API, health, readiness and metrics."""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST

from agentrun.worker.api import answers
from agentrun.worker.api.agents import agents_router
from agentrun.worker.api.events import EventHub, events_router
from agentrun.worker.api.guards import BearerAuth, BodyLimit
from agentrun.worker.api.identities import Identities
from agentrun.worker.api.replays import replays_router
from agentrun.worker.api.runs import runs_router
from agentrun.worker.api.schedules import schedules_router
from agentrun.worker.api.schemas import NOT_NULL, REQUIRED_FIELDS
from agentrun.worker.api.signals import signals_router
from agentrun.worker.api.tenants import tenants_router
from agentrun.worker.api.tools import tools_router
from agentrun.worker.api.webhooks import WebhookCheck
from agentrun.worker.api.whoami import whoami_router
from agentrun.worker.api.workers import workers_router
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.llm.providers import Providers
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore, migrate
from agentrun.worker.store.pool import Readiness, schema_problem
from agentrun.worker.tools import ToolBox

DESCRIPTION = """Submit agent runs, follow them step by step, and cancel them.

Errors are JSON: `{"error": "<message>", "fields": [{"field": "tokenBudget", "problem": "..."}]}`.
A body that is not JSON is a 400, invalid fields a 422, a body over the size limit a 400 too, and so is
a `model` whose prefix names no known provider (`anthropic/`, `bedrock/`, `vertex/` or an endpoint of the
server's providers file); the message lists the known ones.

When the server sets `AGENTRUN_API_TOKENS` (a file of named identities with scopes) or
`AGENTRUN_API_TOKEN` (the identity `default`, every scope), every `/api` request needs
`Authorization: Bearer <token>`: none or a wrong one is a 401, a token whose identity lacks the
operation's scope a 403 naming it. Each operation names its scope (`x-required-scope`, and in its
security requirement): `read`, `submit`, `decide`, `cancel`; `admin` holds them all.
`/healthz`, `/readyz`, `/metrics` and this document stay open.

`GET /api/runs` pages with a cursor: it answers `{"items": [...], "next": "<uuid>" | null}`; pass `next`
as `after` to get the following page.
"""

NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's own OpenTelemetry off: the worker traces runs with a tracer of its own (obs/tracing/) and sets no
global provider, so FastAPI's found none, but looked for one on every request (an environment variable's
read each time; bench/README.md B15)."""


def create_app(
    store: RunStore, tools: ToolBox, settings: WorkerSettings, metrics: Metrics, prices: PriceTable | None = None,
    identities: Identities | None = None, providers: Providers | None = None,
    claiming: Callable[[], str | None] | None = None,
) -> FastAPI:
    """The app; `prices` (default: the table `settings.prices_file` names) refuses unenforceable cost budgets;
    `identities` defaults to those of the settings (IdentityFileError if the file is bad); `providers`: the
    model providers submitted runs may name, the built-in ones when None; `claiming` says why this
    process's worker cannot claim runs now (its presence session is down), or None when it can."""
    if identities is None:
        identities = Identities(settings.api_token, settings.api_tokens_file)
    app = FastAPI(title="agentrun", version="0.1.0", description=DESCRIPTION, telemetry=NO_TELEMETRY)
    prices = prices if prices is not None else PriceTable.load(settings.prices_file)
    app.include_router(runs_router(store, tools, settings, prices, identities, metrics, providers))
    app.include_router(whoami_router(identities.enabled))
    app.include_router(agents_router(store, tools, prices, identities, providers, WebhookCheck(settings)))
    app.include_router(tools_router(tools, identities.enabled))
    app.include_router(workers_router(store, identities.enabled))
    app.include_router(schedules_router(store, tools, settings, prices, identities, providers))
    app.include_router(tenants_router(store, identities.enabled))
    app.include_router(replays_router(store, tools, settings, prices, identities, providers))
    app.state.events = EventHub(store, prices=prices)
    app.include_router(events_router(store, app.state.events, identities.enabled))
    app.include_router(signals_router(store, identities.enabled, metrics))
    # The web UI: static files shipped in the package, talking to the API above like any client.
    ui = importlib.resources.files("agentrun.worker").joinpath("ui")
    app.mount("/ui", StaticFiles(directory=str(ui), html=True), name="ui")

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={
        200: {"description": "Ready: the database answers and is migrated"},
        503: {"description": "Not ready: the database is unreachable or not migrated; the body says which"},
    })
    async def readyz() -> JSONResponse:
        """The database answers and is migrated to the version this code expects."""
        try:
            async with store.pool.connection(timeout=2) as conn:
                problem = await schema_problem(conn)
                version = await migrate.current_version(conn)
        except Exception as e:
            return _unavailable(f"database unreachable ({type(e).__name__})")
        if problem:
            return _unavailable(f"database {problem}")
        if claiming is not None and (why := claiming()) is not None:
            return _unavailable(why)
        return JSONResponse({"status": "ok", "schemaVersion": version})

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics of this worker, and runs by status from the database."""
        return Response(await metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # Added last, so it runs first: the token before the body, the body before any parsing.
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(BearerAuth, identities=identities)
    answers.install(app)
    _document_tools(app, tools)
    return app


def _unavailable(reason: str) -> JSONResponse:
    return JSONResponse({"status": "unavailable", "reason": reason}, 503)


def create_starting_app(readiness: Readiness, metrics: Metrics) -> FastAPI:
    """What the worker serves until its database is usable: alive, not ready, and every API route a 503.

    Served from the first moment of the process, so Kubernetes sees a live pod that is waiting for its
    database (and keeps it out of the Service) instead of one that crash-loops through an outage.
    """
    app = FastAPI(title="agentrun", version="0.1.0", openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry=NO_TELEMETRY)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        return _unavailable(readiness.reason)

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        return Response(await metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
    async def starting(path: str) -> JSONResponse:
        return answers.error_response(503, "database unavailable, try again shortly", headers={"Retry-After": "5"})

    return app


def _document_tools(app: FastAPI, tools: ToolBox) -> None:
    """Name this server's tools in the OpenAPI document, so `tools` lists only names it accepts.

    The document is built when first asked for (FastAPI's way of extending it: `app.openapi` replaced),
    not with the app: building it takes longer than the rest of `create_app` (0.4 s of 0.6 s here), and
    most apps (a test's, a worker nobody asks for it) never serve it.
    """
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _amend(FastAPI.openapi(app), tools)  # FastAPI caches it in app.openapi_schema
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _amend(document: dict[str, Any], tools: ToolBox) -> None:
    schemas = document["components"]["schemas"]
    schema = schemas["RunRequest"]
    for field, extra in (("tools", []), ("requireApproval", ["*"])):
        for model in (schema, schemas["AgentRequest"]):  # an agent's tools are checked as a run's
            request = model["properties"][field]
            for branch in request.get("anyOf", [request]):
                if branch.get("type") == "array" and not tools.dynamic:  # MCP tools come and go: no enum
                    if tools.names or extra:
                        branch["items"]["enum"] = [*tools.names, *extra]
                    else:
                        branch["maxItems"] = 0
    # What may be left out but not sent as null, and which fields go together (schemas.REQUIRED_FIELDS).
    for field in NOT_NULL:
        prop = schema["properties"][field]
        branches = [b for b in prop.pop("anyOf", []) if b.get("type") != "null"]
        if branches:
            prop.update(branches[0] if len(branches) == 1 else {"anyOf": branches})
        prop.pop("default", None)
        _json_schema_bounds(prop)
    schema["anyOf"] = REQUIRED_FIELDS
    for prop in schemas["AgentRequest"]["properties"].values():  # every limit of an agent is optional (null)
        for branch in prop.get("anyOf", [prop]):
            _json_schema_bounds(branch)
    for model in ("ScheduleRequest", "SchedulePatch", "QuotasRequest"):  # schedules, quotas: their optional limits
        for prop in schemas.get(model, {}).get("properties", {}).values():
            for branch in prop.get("anyOf", [prop]):
                _json_schema_bounds(branch)


def _json_schema_bounds(prop: dict[str, Any]) -> None:
    """Bounds of an optional number come out under pydantic's own names: give them JSON Schema's."""
    for ours, theirs in (("gt", "exclusiveMinimum"), ("ge", "minimum"), ("lt", "exclusiveMaximum"),
                         ("le", "maximum")):
        if ours in prop:
            prop[theirs] = prop.pop(ours)
