"""What every request passes before a route sees it: the bearer token and its scope, then the body size limit.

The token and the body limit are plain ASGI middleware, and the scope is checked by the route class
before FastAPI reads the body: a client without the right token or scope learns nothing about
validation, and an oversized body is never buffered whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Query, Request, Response, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrun.worker.api.answers import error_response
from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.identities import Identities, Identity
from agentrun.worker.api.identities import Scope as AccessScope
from agentrun.worker.api.schemas import FieldProblem
from agentrun.worker.core.tenants import DEFAULT_TENANT, TENANT_PATTERN
from agentrun.worker.core.viewer import Viewer

API_PREFIX = "/api"
SCOPE_KEY = "x-required-scope"
"""The OpenAPI extension naming the scope an operation requires (`none`: any valid token)."""
IDENTITY_KEY = "agentrun.identity"
"""Where BearerAuth leaves the caller's Identity in the ASGI scope, for the routes to record."""

BEARER = HTTPBearer(
    auto_error=False,
    description="A token of an identity of AGENTRUN_API_TOKENS, or AGENTRUN_API_TOKEN (the identity "
    "`default`, every scope). Each operation names the scope it requires.",
)


def access(scope: AccessScope | None, enabled: bool) -> dict[str, Any]:
    """Route decorator arguments declaring the scope an operation requires (None: any valid token).

    ScopedRoute enforces it from `openapi_extra`; the Security dependency only documents it in OpenAPI,
    and only when the server requires tokens: an open server that advertised a scheme would be lying.
    """
    name = scope.value if scope else "none"
    extra: dict[str, Any] = {"openapi_extra": {SCOPE_KEY: name}}
    if enabled:
        extra["dependencies"] = [Security(BEARER, scopes=[scope.value] if scope else [])]
    return extra


def identity_of(scope: Scope) -> Identity | None:
    """The caller, as BearerAuth found it; None when the API is open."""
    found = scope.get(IDENTITY_KEY)
    return found if isinstance(found, Identity) else None


def caller_name(request: Request) -> str | None:
    """What a route records as who did it (`createdBy`, `cancelledBy`, `decidedBy`); None on an open API."""
    identity = identity_of(request.scope)
    return identity.name if identity else None


def viewer_of(request: Request) -> Viewer:
    """Who the caller reads as: its identity and the tenant whose runs it sees (every tenant's for an
    identity of tenant `*` and on an open API). Another tenant's run reads as none: a 404, never a 403."""
    identity = identity_of(request.scope)
    if identity is None or identity.all_tenants:
        return Viewer(identity.name if identity else None)
    return Viewer(identity.name, identity.tenant)


def tenant_for(request: Request, named: str | None, field: str = "tenant") -> str | None:
    """The tenant of what the caller makes (a run, an event, an agent, a schedule): its identity's tenant; a
    platform operator's identity (tenant `*`) or an open API may name one (None: not named, so the source's
    or `default`). An identity of one tenant naming another is a 403 naming `field`."""
    identity = identity_of(request.scope)
    if identity is None or identity.all_tenants:
        return named
    if named is not None and named != identity.tenant:
        problem = f"not the identity's tenant, {identity.tenant!r}"
        raise ApiError(403, f"{field}: identity {identity.name!r} acts for tenant {identity.tenant!r} only, not "
                       f"{named!r}", [FieldProblem(field=field, problem=problem)])
    return identity.tenant


TenantQuery = Annotated[str | None, Query(
    max_length=63, pattern=TENANT_PATTERN,
    description="The tenant whose agents or schedules (each tenant has its own names). When absent the caller's: "
    "its identity's tenant; `default` for a platform operator's identity (tenant `*`) and on an open API. Only a "
    "platform operator's identity may name another (else 403).")]


CREATE_TENANT = ("The tenant it is made for (each tenant has its own names). When absent the caller's: its "
                 "identity's tenant; `default` for a platform operator's identity (tenant `\"*\"`) and on an open API. "
                 "Only a platform operator's identity may name another (else 403).")
"""What the `tenant` field of a body that makes an agent or a schedule says."""


def whose_tenant(request: Request, named: str | None) -> str:
    """The tenant whose agent or schedule a request is about: `tenant_for`, `default` when none is named."""
    return tenant_for(request, named) or DEFAULT_TENANT


class BearerAuth:
    """When identities are configured, /api requests need `Authorization: Bearer <token>` of one of them:
    no or a wrong token is a 401. The caller's Identity is left in the ASGI scope for ScopedRoute.

    Health, readiness, metrics and the OpenAPI document stay open: probes and Prometheus hold no secret.
    """

    def __init__(self, app: ASGIApp, identities: Identities) -> None:
        self.app = app
        self.identities = identities

    def _identity(self, scope: Scope) -> Identity | None:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return None
                return self.identities.authenticate(given.strip())
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if (scope["type"] != "http" or not self.identities.enabled
                or not (path == API_PREFIX or path.startswith(API_PREFIX + "/"))):
            await self.app(scope, receive, send)
            return
        identity = self._identity(scope)
        if identity is None:
            response = error_response(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        scope[IDENTITY_KEY] = identity
        await self.app(scope, receive, send)


def _required(route: APIRoute) -> AccessScope | None:
    declared = (route.openapi_extra or {}).get(SCOPE_KEY)
    return None if declared == "none" else AccessScope(declared or AccessScope.ADMIN.value)


class ScopedRoute(APIRoute):
    """A route that answers 403 naming the missing scope before FastAPI reads or validates the body.

    The scope is the one `access` declared; a route declaring none requires `admin`, so an operation
    added without thought fails closed. Every /api router uses this route class (or a subclass).
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        required = _required(self)

        async def route(request: Request) -> Response:
            identity = identity_of(request.scope)  # None only when the server requires no token
            if identity is not None and required is not None and not identity.allows(required):
                message = f"identity {identity.name!r} lacks the scope {required.value!r} this operation requires"
                return error_response(
                    403, message, [FieldProblem(field="scope", problem=f"{required.value} is required")],
                    headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{required.value}"'},
                )
            return await handler(request)

        return route


class BodyLimit:
    """Refuses a body over `limit` bytes with a 400 naming the limit, reading at most `limit` + one chunk.

    400 rather than 413 because the API's contract answers every bad body with 400/422 and a JSON
    message; the message says what 413 would."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"request body is too large: the limit is {self.limit} bytes"
        problem = FieldProblem(field="body", problem=f"larger than {self.limit} bytes")
        await error_response(400, message, [problem])(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._too_large(scope, receive, send)
                return
        # Chunked or lying about its length: count what actually arrives.
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(buffered, receive), send)


def _replay(messages: list[Message], receive: Receive) -> Callable[[], Awaitable[Message]]:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
