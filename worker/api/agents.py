"""The /api/agents routes: agent definitions, versioned: create (or a new version), list, read, delete."""

from __future__ import annotations

import dataclasses
import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from pydantic import AfterValidator, ConfigDict, Field

from agentrun.worker.api.common import OrjsonRoute, Responses, documented_errors, refusal
from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.guards import CREATE_TENANT, TenantQuery, access, caller_name, whose_tenant
from agentrun.worker.api.identities import Identities, Scope
from agentrun.worker.api.schemas import (
    MAX_COST_BUDGET_USD,
    MAX_STEPS,
    MAX_SUB_AGENTS,
    MAX_TIMEOUT_SECONDS,
    MAX_TOKEN_BUDGET,
    MAX_TOOLS,
    MIN_COST_BUDGET_USD,
    AgentRef,
    Camel,
    ContextManagement,
    ErrorBody,
    JsonObject,
    Name,
    Text,
    WebhookRequest,
    Whole,
)
from agentrun.worker.api.webhooks import WebhookCheck
from agentrun.worker.core.agents import AGENT_NAME, MAX_VERSION, Agent, check_definition, name_problem
from agentrun.worker.core.errors import Refused
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.submission import Offer
from agentrun.worker.core.tenants import TENANT_PATTERN
from agentrun.worker.llm.providers import Providers
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox


def _dns_label(value: str) -> str:
    if (why := name_problem(value)) is not None:
        raise ValueError(why)
    return value


AgentName = Annotated[str, AfterValidator(_dns_label), Field(json_schema_extra={"pattern": AGENT_NAME})]
PathName = Annotated[str, Path(alias="name", pattern=AGENT_NAME, max_length=63, description="The agent's name.")]


class AgentRequest(Camel):
    """An agent definition. Every field but `name` may be left out: a run of the agent then gives it (or
    gets the server's default). Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: AgentName = Field(description="A DNS label: 1 to 63 lowercase letters, digits and '-', starting and "
                            "ending with a letter or digit.")
    description: Text | None = Field(None, description="What the agent does: a parent's model reads it as the "
                                     "description of the `agent__<name>` tool.")
    system: Text | None = Field(None, description="System prompt.")
    model: Name | None = Field(None, description="Model name.")
    tools: list[Name] | None = Field(None, max_length=MAX_TOOLS, description="Tools the agent's runs may call "
                                     "(absent: every tool of the worker).")
    require_approval: list[Name] | None = Field(None, max_length=MAX_TOOLS, description="Tools whose calls wait "
                                                "for a person's approval; \"*\" for every tool.")
    output_schema: JsonObject | None = Field(None, description="A JSON Schema the answer must satisfy.")
    max_steps: Annotated[Whole, Field(gt=0, le=MAX_STEPS)] | None = Field(
        None, description="Most steps of a run; a run may ask for fewer, not more.")
    token_budget: Annotated[Whole, Field(gt=0, le=MAX_TOKEN_BUDGET)] | None = Field(
        None, description="Tokens a run may spend; a run may ask for fewer, not more.")
    cost_budget_usd: float | None = Field(None, ge=float(MIN_COST_BUDGET_USD), le=MAX_COST_BUDGET_USD,
                                          description="Spending limit in USD of a run; a run may ask for less.")
    timeout_seconds: Annotated[Whole, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] | None = Field(
        None, description="Wall-clock limit of a run; a run may ask for less.")
    sub_agents: list[AgentRef] | None = Field(
        None, max_length=MAX_SUB_AGENTS, description="Agents its runs may hand work to: `name` (the latest "
        "version when a run is submitted, then pinned) or `name@N`. Each must exist; not the agent itself.")
    webhook: WebhookRequest | None = Field(None, description="Its runs' webhook (docs/guides/webhooks.md) "
                                           "unless their request names one.")
    context_management: ContextManagement | None = Field(
        None, description="Its runs' `contextManagement` (`{strategy, triggerTokens?, keepRecentTurns?}`) unless "
        "their request names one.")
    tenant: str | None = Field(None, min_length=1, max_length=63, pattern=TENANT_PATTERN, description=CREATE_TENANT)

    def agent(self) -> Agent:
        cost = (Decimal(str(self.cost_budget_usd)).quantize(MIN_COST_BUDGET_USD, rounding=ROUND_HALF_UP)
                if self.cost_budget_usd is not None else None)
        return Agent(
            name=self.name, version=0, description=self.description, system=self.system, model=self.model,
            tools=_names(self.tools), require_approval=_names(self.require_approval),
            output_schema=self.output_schema, max_steps=self.max_steps, token_budget=self.token_budget,
            cost_budget_usd=cost, timeout_seconds=self.timeout_seconds,
            sub_agents=tuple(dict.fromkeys(self.sub_agents)) if self.sub_agents is not None else None,
            webhook=self.webhook.as_stored() if self.webhook is not None else None,
            context_management=self.context_management,
        )


def _names(values: list[str] | None) -> tuple[str, ...] | None:
    return tuple(dict.fromkeys(values)) if values is not None else None  # each once, in the order given


class AgentCreated(Camel):
    name: str
    version: int


class AgentView(Camel):
    """One version of an agent's definition; null fields are left to the run."""

    name: str
    version: int
    description: str | None
    system: str | None
    model: str | None
    tools: list[str] | None
    require_approval: list[str] | None
    output_schema: dict[str, Any] | None
    max_steps: int | None
    token_budget: int | None
    cost_budget_usd: float | None
    timeout_seconds: int | None
    sub_agents: list[str] | None = Field(description="As defined: `name` or `name@N`.")
    webhook: dict[str, Any] | None = Field(None, description="Its runs' webhook: `{url, events, secretRef}`.")
    context_management: dict[str, Any] | None = Field(None, description="Its runs' `contextManagement` (null: "
                                                      "theirs, else the default `auto`).")
    created_at: datetime.datetime | None = Field(description="When this version was made.")
    created_by: str | None = Field(description="Who made this version, named as a run's `createdBy`.")
    tenant: str = Field("default", description="The tenant whose agent it is: its runs are that tenant's.")

    @classmethod
    def of(cls, a: Agent) -> AgentView:
        return cls(
            name=a.name, version=a.version, description=a.description, system=a.system, model=a.model,
            tools=_list(a.tools), require_approval=_list(a.require_approval), output_schema=a.output_schema,
            max_steps=a.max_steps, token_budget=a.token_budget,
            cost_budget_usd=float(a.cost_budget_usd) if a.cost_budget_usd is not None else None,
            timeout_seconds=a.timeout_seconds, sub_agents=_list(a.sub_agents), webhook=a.webhook,
            context_management=a.context_management, created_at=a.created_at,
            created_by=a.created_by, tenant=a.tenant,
        )


def _list(values: tuple[str, ...] | None) -> list[str] | None:
    return list(values) if values is not None else None


class AgentList(Camel):
    items: list[AgentView] = Field(description="The latest version of each agent, by name.")


def _no_agent(name: str, version: int | None = None) -> ApiError:
    return ApiError(404, f"no agent {name!r}" if version is None else f"agent {name!r} has no version {version}")


class AgentRoutes:
    """The /api/agents handlers over the store; `agents_router` mounts them."""

    def __init__(self, store: RunStore, tools: ToolBox, prices: PriceTable, providers: Providers,
                 check_webhook: WebhookCheck | None = None) -> None:
        self.store = store
        self.check_webhook = check_webhook
        self.offer = Offer(has_tool=lambda name: tools.get(name) is not None, tool_names=tools.names,
                           prices=prices, model_problem=providers.problem)

    async def create(self, body: AgentRequest, request: Request, response: Response) -> AgentCreated:
        """Create the agent, or a new version of it (201). A body identical to the latest version makes
        none: 200 with that version. Versions count from 1; runs in flight keep the version they were
        pinned to. Putting a deleted agent's name undeletes it. Scope: `submit`; the version records who
        as `createdBy`."""
        whose = whose_tenant(request, body.tenant)
        agent = dataclasses.replace(body.agent(), tenant=whose)
        if self.check_webhook is not None:
            self.check_webhook(agent.webhook, tenant=whose)
        try:
            check_definition(agent, self.offer)
            await self.store.resolve_sub_agents(agent.sub_agents or (), whose)  # each must exist (404 naming it)
        except Refused as e:
            raise refusal(e) from None
        try:
            stored, created = await self.store.put_agent(agent, created_by=caller_name(request))
        except ValueError as e:  # a text PostgreSQL cannot hold; the schema refuses these first
            raise ApiError(422, str(e)) from None
        response.status_code = 201 if created else 200
        response.headers["Location"] = f"/api/agents/{stored.name}/versions/{stored.version}"
        return AgentCreated(name=stored.name, version=stored.version)

    async def list_agents(self, request: Request, tenant: TenantQuery = None) -> AgentList:
        """Every agent not deleted, at its latest version, by name. Scope: `read`."""
        return AgentList(items=[AgentView.of(a) for a in await self.store.agents(whose_tenant(request, tenant))])

    async def get(self, name: PathName, request: Request, tenant: TenantQuery = None) -> AgentView:
        """The agent's latest version; 404 for an unknown or deleted agent. Scope: `read`."""
        found = await self.store.agent(name, tenant=whose_tenant(request, tenant))
        if found is None:
            raise _no_agent(name)
        return AgentView.of(found)

    async def versions(self, name: PathName, request: Request, tenant: TenantQuery = None) -> AgentList:
        """Every version of the agent, oldest first; a deleted agent's too (runs stay pinned to them).
        Scope: `read`."""
        found = await self.store.agent_versions(name, whose_tenant(request, tenant))
        if not found:
            raise _no_agent(name)
        return AgentList(items=[AgentView.of(a) for a in found])

    async def version(
        self, name: PathName,
        n: Annotated[int, Path(ge=1, le=MAX_VERSION, description="The version, from 1.")],
        request: Request, tenant: TenantQuery = None,
    ) -> AgentView:
        """One version of the agent, as runs pinned to it got it; a deleted agent's too. Scope: `read`."""
        found = await self.store.agent(name, n, deleted=True, tenant=whose_tenant(request, tenant))
        if found is None:
            raise _no_agent(name, n)
        return AgentView.of(found)

    async def delete(self, name: PathName, request: Request, tenant: TenantQuery = None) -> Response:
        """Delete the agent: new runs naming it are refused (404); runs in flight, and the continuations
        of finished ones, go on with the version they are pinned to. Its versions stay readable. Putting
        the name again undeletes it. Scope: `submit`."""
        if not await self.store.delete_agent(name, whose_tenant(request, tenant)):
            raise _no_agent(name)
        return Response(status_code=204)


CREATE_ERRORS: Responses = {
    200: {"model": AgentCreated, "description": "The body is identical to the latest version: no new version"},
    400: {"model": ErrorBody, "description": "The body is not JSON at all, or over the size limit"},
    404: {"model": ErrorBody, "description": "A sub-agent names no agent (or no such version): `fields` names it"},
}
READ_ERRORS: Responses = {404: {"model": ErrorBody, "description": "No such agent (or version of it)"}}


def agents_router(
    store: RunStore, tools: ToolBox, prices: PriceTable, identities: Identities, providers: Providers | None = None,
    check_webhook: WebhookCheck | None = None,
) -> APIRouter:
    routes = AgentRoutes(store, tools, prices, providers or Providers(), check_webhook)
    secured = identities.enabled
    errors = documented_errors(secured, runs=False)
    router = APIRouter(prefix="/api/agents", tags=["agents"], route_class=OrjsonRoute, responses=errors)
    read, write = access(Scope.READ, secured), access(Scope.SUBMIT, secured)
    router.post("", status_code=201, response_model=AgentCreated, responses=CREATE_ERRORS, **write)(routes.create)
    router.get("", response_model=AgentList, **read)(routes.list_agents)
    router.get("/{name}", response_model=AgentView, responses=READ_ERRORS, **read)(routes.get)
    router.get("/{name}/versions", response_model=AgentList, responses=READ_ERRORS, **read)(routes.versions)
    router.get("/{name}/versions/{n}", response_model=AgentView, responses=READ_ERRORS, **read)(routes.version)
    router.delete("/{name}", status_code=204, response_class=Response, responses=READ_ERRORS,
                  **write)(routes.delete)
    return router

