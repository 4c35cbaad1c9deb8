"""GET /api/whoami: the caller's identity, scopes and tenant, so a client (the UI) can hide what it may not do
and say whose runs it shows."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from agentrun.worker.api.guards import ScopedRoute, access, identity_of
from agentrun.worker.api.identities import Scope
from agentrun.worker.api.schemas import ErrorBody, WhoAmI
from agentrun.worker.core.tenants import ALL_TENANTS


def whoami_router(secured: bool) -> APIRouter:
    responses: dict[int | str, dict[str, Any]] = (
        {401: {"model": ErrorBody, "description": "Missing or wrong bearer token"}} if secured else {}
    )
    router = APIRouter(prefix="/api", tags=["identity"], responses=responses, route_class=ScopedRoute)

    @router.get("/whoami", response_model=WhoAmI, **access(None, secured))
    async def whoami(request: Request) -> WhoAmI:
        """The identity the bearer token stands for and its scopes (`admin` expanded). Any valid token.

        On a server that requires no token the name is null, every scope is listed and the tenant is `*`."""
        identity = identity_of(request.scope)
        if identity is None:
            return WhoAmI(name=None, scopes=list(Scope), tenant=ALL_TENANTS)
        return WhoAmI(name=identity.name, scopes=identity.effective_scopes, tenant=identity.tenant)

    return router
