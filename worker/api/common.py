"""What the routers share: their route class, the errors they document, the Idempotency-Key header, and the
API's way to the door (the policy for a run it makes, or checks as a schedule's template)."""

from __future__ import annotations

import re
from typing import Any

import orjson
from fastapi import Request, Response

from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.guards import ScopedRoute
from agentrun.worker.api.schemas import ErrorBody, FieldProblem
from agentrun.worker.api.webhooks import WebhookCheck
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import NewRun, Origin, Run
from agentrun.worker.core.submission import Caller, Defaults, Offer, Refusal, Refused, RunSpec
from agentrun.worker.llm.providers import Providers
from agentrun.worker.runtime.door import Door, Submitted
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox

MAX_PAGE = 200
MAX_IDEMPOTENCY_KEY = 255
# Printable ASCII: what every HTTP stack carries unchanged (other bytes arrive as Latin-1 guesses).
IDEMPOTENCY_KEY = re.compile(rf"[\x20-\x7e]{{1,{MAX_IDEMPOTENCY_KEY}}}")
IDEMPOTENCY_KEY_SCHEMA: dict[str, Any] = {
    "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY, "pattern": "^[\\x20-\\x7e]*$"}
"""The header's rule, as the OpenAPI document states it."""
REFUSAL_STATUS = {Refusal.INVALID: 422, Refusal.CONFLICT: 409, Refusal.UNFIT: 422, Refusal.NOT_FOUND: 404}

Responses = dict[int | str, dict[str, Any]]
ERRORS: Responses = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        401: "Missing or wrong bearer token (only when the server requires tokens)",
        403: "The token's identity lacks the scope the operation requires: `error` names it",
        404: "No such run",
        422: "Invalid input (a field of the body or a query parameter: its shape, or what the server makes "
        "of it, such as an `outputSchema` that is no JSON Schema, a model no provider serves, a cost budget "
        "on an unpriced model): `fields` names each field and its problem",
        503: "Database unavailable",
    }.items()
}
"""The errors every route of a run documents; `documented_errors` gives a router its part of them."""


def documented_errors(secured: bool, runs: bool = True) -> Responses:
    """ERRORS as a router documents them: 401 and 403 only when tokens are required, "No such run" only for
    the routes of a run."""
    return {code: spec for code, spec in ERRORS.items()
            if (secured or code not in (401, 403)) and (runs or code != 404)}


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        # orjson refuses what PostgreSQL or a reader later would choke on (lone surrogates, NaN) and
        # stops nesting at a fixed depth, raising json.JSONDecodeError subclasses FastAPI turns into 400s.
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class OrjsonRoute(ScopedRoute):
    """The routers' route class: the scope checked before any parsing (ScopedRoute), the body read by orjson."""

    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return route


def checked_idempotency_key(value: str | None) -> str | None:
    """The Idempotency-Key header checked: 1 to MAX_IDEMPOTENCY_KEY printable ASCII characters, else a 422."""
    if value is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(value):
        problem = f"must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
        raise ApiError(422, f"Idempotency-Key: {problem}", [FieldProblem(field="Idempotency-Key", problem=problem)])
    return value


def field_error(field: str, problem: str, status: int = 422) -> ApiError:
    """An answer naming one field and what is wrong with it, the message saying both."""
    return ApiError(status, f"{field}: {problem}", [FieldProblem(field=field, problem=problem)])


def refusal(e: Refused) -> ApiError:
    """A refusal of the submission policy as the API answers it: its status, the fields named."""
    fields = [FieldProblem(field=p.field, problem=p.problem) for p in e.problems]
    return ApiError(REFUSAL_STATUS[e.kind], e.message, fields)


class Submissions:
    """The API's way to the door, for the routes that make runs (/api/runs) and those that check a template
    of one (/api/schedules): the API's defaults, what this server offers, the request's webhook checked."""

    def __init__(self, store: RunStore, tools: ToolBox, settings: WorkerSettings, prices: PriceTable,
                 providers: Providers) -> None:
        self.door = Door(store)
        # The API's policy: a new run names its budgets (no default spends tokens it was not given).
        self.defaults = Defaults(model=settings.default_model, token_budget=None, timeout_seconds=None)
        self.tools, self.prices, self.providers = tools, prices, providers
        # The request's own webhook: http(s), a host the URL policy allows, a configured secret; else 422
        # naming the field. An inherited one (an agent's, a source's) was checked when it was given.
        self.check_webhook = WebhookCheck(settings)

    def offer(self) -> Offer:
        """What this server's workers can run, as far as the API knows it."""
        return Offer(has_tool=lambda name: self.tools.get(name) is not None, tool_names=self.tools.names,
                     prices=self.prices, model_problem=self.providers.problem)

    async def planned(self, spec: RunSpec, source: Run | None, caller: Caller = Caller()) -> NewRun:
        """The run the door makes of `spec` (its agent applied and pinned, its sub-agents pinned), not
        written, or its refusal as the API answers it."""
        try:
            return await self.door.plan(spec, Origin.API, caller, source=source, defaults=self.defaults,
                                        offer=self.offer())
        except Refused as e:
            raise refusal(e) from None

    async def submit(self, spec: RunSpec, source: Run | None, caller: Caller) -> Submitted:
        """The run the door makes of `spec` and writes (or finds, for a retry), or its refusal as the API
        answers it."""
        try:
            return await self.door.submit(spec, Origin.API, caller, source=source, defaults=self.defaults,
                                          offer=self.offer())
        except Refused as e:
            raise refusal(e) from None
