"""The /api/tenants routes: each tenant's quotas and what it uses of them, for platform operators only (an
`admin` identity of the tenant `*`)."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import ConfigDict, Field

from agentrun.worker.api.common import OrjsonRoute, Responses, documented_errors
from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.guards import access, identity_of
from agentrun.worker.api.identities import Scope
from agentrun.worker.api.schemas import Camel, ErrorBody, FieldProblem, Whole
from agentrun.worker.core.tenants import (
    MAX_COST_PER_DAY_USD,
    MAX_RUN_LIMIT,
    MAX_TOKENS_PER_DAY,
    MAX_WEIGHT,
    MIN_WEIGHT,
    TENANT_NAME,
    Quotas,
    Tenant,
)
from agentrun.worker.store import RunStore

PathName = Annotated[str, Path(alias="name", pattern=f"^{TENANT_NAME.pattern}$", max_length=63,
                               description="The tenant's name, a DNS label.")]
Limit = Annotated[Whole, Field(ge=0, le=MAX_RUN_LIMIT)] | None


class QuotasRequest(Camel):
    """A tenant's quotas, all of them: a field left out or null is no limit (`weight`: 1). Unknown fields
    are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_running: Limit = Field(None, description="Runs of the tenant RUNNING at once, across every worker.")
    max_queued: Limit = Field(None, description="Runs of the tenant QUEUED (scheduled, delayed and handed-back "
                              "ones too): a submit past it is a 429.")
    tokens_per_day: Annotated[Whole, Field(ge=0, le=MAX_TOKENS_PER_DAY)] | None = Field(
        None, description="Tokens its model steps may use over the last 1,440 minutes: at it, a submit is a 429 and "
        "a run is handed back before its next model step until the window allows again.")
    cost_per_day_usd: Annotated[float, Field(ge=0, le=MAX_COST_PER_DAY_USD)] | None = Field(
        None, description="US dollars its model steps may cost over the last 1,440 minutes, as `tokensPerDay`.")
    weight: Annotated[float, Field(ge=MIN_WEIGHT, le=MAX_WEIGHT)] = Field(
        1.0, description="Its share of the workers against other tenants with work waiting (at least 0.001, at "
        "most 1000).")


class TenantView(Camel):
    name: str
    max_running: int | None
    max_queued: int | None
    tokens_per_day: int | None
    cost_per_day_usd: float | None
    weight: float
    queued: int = Field(description="Its runs QUEUED now (scheduled, delayed and handed-back ones included).")
    running: int = Field(description="Its runs RUNNING now.")
    tokens_today: int = Field(description="Tokens its model steps used over the last 1,440 minutes.")
    cost_today_usd: float = Field(description="What its model steps cost over the last 1,440 minutes (USD).")
    throttled_runs: int = Field(description="Its queued runs held back by a daily budget (each shows why in its "
                                "`throttled`).")
    throttled: dict[str, str | None] | None = Field(
        description="The quota it is at now, if any: `{quota, until, reason}` (`until` null for `maxQueued`).")
    configured_at: datetime.datetime | None = Field(description="When its quotas were last set through this API "
                                                    "or the CLI; null: never (the chart's `tenants.quotas` apply).")
    updated_at: datetime.datetime | None

    @classmethod
    def of(cls, t: Tenant) -> TenantView:
        q = t.quotas
        return cls(
            name=t.name, max_running=q.max_running, max_queued=q.max_queued, tokens_per_day=q.tokens_per_day,
            cost_per_day_usd=float(q.cost_per_day_usd) if q.cost_per_day_usd is not None else None,
            weight=q.weight, queued=t.queued, running=t.running, tokens_today=t.tokens_today,
            cost_today_usd=float(t.cost_today_usd), throttled_runs=t.throttled,
            throttled=t.over.json() if t.over else None, configured_at=t.configured_at, updated_at=t.updated_at,
        )


class TenantList(Camel):
    items: list[TenantView]


def _platform_only(request: Request) -> None:
    """Tenants' quotas are the platform's: an identity of one tenant, even an admin, is a 403."""
    identity = identity_of(request.scope)
    if identity is not None and not identity.all_tenants:
        raise ApiError(403, f"identity {identity.name!r} is of tenant {identity.tenant!r}: tenants' quotas are "
                       "for an admin identity of tenant '*'",
                       [FieldProblem(field="tenant", problem="'*' is required")])


class TenantRoutes:
    def __init__(self, store: RunStore) -> None:
        self.store = store

    async def list_tenants(self, request: Request) -> TenantList:
        """Every tenant, by name: its quotas, its runs queued and running, its usage over the last 1,440
        minutes. Scope: `admin`, of tenant `*`."""
        _platform_only(request)
        return TenantList(items=[TenantView.of(t) for t in await self.store.tenants()])

    async def get(self, name: PathName, request: Request) -> TenantView:
        """A tenant's quotas and what it uses of them now. A tenant with no run yet and never set is a 404.
        Scope: `admin`, of tenant `*`."""
        _platform_only(request)
        found = await self.store.tenant(name)
        if found is None:
            raise ApiError(404, f"no tenant {name!r}: it has no run and its quotas were never set")
        return TenantView.of(found)

    async def put(self, name: PathName, body: QuotasRequest, request: Request) -> TenantView:
        """Set a tenant's quotas, all of them (null or left out: no limit), making it if need be. Every worker
        applies them within a second; the chart's `tenants.quotas` no longer apply to it. Scope: `admin`, of
        tenant `*`."""
        _platform_only(request)
        quotas = Quotas(body.max_running, body.max_queued, body.tokens_per_day,
                        Decimal(str(body.cost_per_day_usd)) if body.cost_per_day_usd is not None else None,
                        body.weight)
        return TenantView.of(await self.store.set_quotas(name, quotas))


READ_ERRORS: Responses = {404: {"model": ErrorBody, "description": "No such tenant (no run of it, never set)"}}
PUT_ERRORS: Responses = {400: {"model": ErrorBody, "description": "The body is not JSON at all"}}


def tenants_router(store: RunStore, secured: bool) -> APIRouter:
    routes = TenantRoutes(store)
    # 403 is documented whatever the tokens: an open API allows it, but an identity of one tenant never does.
    errors = {**documented_errors(secured, runs=False), 403: {"model": ErrorBody, "description":
              "The identity lacks `admin`, or is not of tenant `*`: `error` says which"}}
    router = APIRouter(prefix="/api/tenants", tags=["tenants"], route_class=OrjsonRoute, responses=errors)
    admin = access(Scope.ADMIN, secured)
    router.get("", response_model=TenantList, **admin)(routes.list_tenants)
    router.get("/{name}", response_model=TenantView, responses=READ_ERRORS, **admin)(routes.get)
    router.put("/{name}", response_model=TenantView, responses=PUT_ERRORS, **admin)(routes.put)
    return router
