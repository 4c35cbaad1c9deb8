"""The /api/runs routes: submit, read, follow and cancel runs, over the store."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Path, Query, Request, Response

from agentrun.worker.api.errors import ApiError, summary
from agentrun.worker.api.guards import ScopedRoute, access, caller_name
from agentrun.worker.api.identities import Identities, Scope
from agentrun.worker.api.schemas import (
    MAX_SEQ,
    ErrorBody,
    FieldProblem,
    RunCreated,
    RunPage,
    RunRequest,
    RunSummary,
    RunView,
    StepDetail,
    TimelineStep,
)
from agentrun.worker.pricing import PriceTable, cost_budget_problem
from agentrun.worker.records import NewRun, Run, RunStatus
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from agentrun.worker.tracing.context import TRACEPARENT_PATTERN, checked_traceparent

MAX_PAGE = 200
MAX_IDEMPOTENCY_KEY = 255
# Printable ASCII: what every HTTP stack carries unchanged (other bytes arrive as Latin-1 guesses).
IDEMPOTENCY_KEY = re.compile(rf"[\x20-\x7e]{{1,{MAX_IDEMPOTENCY_KEY}}}")

RunId = Annotated[uuid.UUID, Path(alias="id", description="The run's id (a UUID).")]

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        401: "Missing or wrong bearer token (only when the server requires tokens)",
        403: "The token's identity lacks the scope the operation requires: `error` names it",
        404: "No such run",
        422: "Invalid input: `fields` names each field and its problem",
        503: "Database unavailable",
    }.items()
}


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        # orjson refuses what PostgreSQL or a reader later would choke on (lone surrogates, NaN) and
        # stops nesting at a fixed depth, raising json.JSONDecodeError subclasses FastAPI turns into 400s.
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class OrjsonRoute(ScopedRoute):
    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return route


def _not_found(run_id: uuid.UUID) -> ApiError:
    return ApiError(404, f"no run with id {run_id}")


def _same_request(run: Run, new: NewRun) -> bool:
    # The identity too: another identity reusing a key is not retrying, and must not be handed the run.
    return (run.input, run.model, run.token_budget, run.timeout_seconds, run.max_steps, run.tools, run.system,
            run.cost_budget_usd, run.created_by) == (new.input, new.model, new.token_budget, new.timeout_seconds,
                                                     new.max_steps, new.tools, new.system, new.cost_budget_usd,
                                                     new.created_by)


def _traceparent_schema(schema: dict[str, Any]) -> None:
    """Any string (a malformed one is ignored, as W3C asks); an absent header is no value, not a JSON null."""
    schema.pop("anyOf", None)
    schema.update(type="string", examples=["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"])


def _idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(value):
        problem = f"must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
        raise ApiError(422, f"Idempotency-Key: {problem}", [FieldProblem(field="Idempotency-Key", problem=problem)])
    return value


def runs_router(
    store: RunStore, tools: ToolBox, settings: WorkerSettings, prices: PriceTable, identities: Identities | None = None
) -> APIRouter:
    # ScopedRoute (OrjsonRoute's base) enforces each route's scope before any parsing; `access` declares it.
    secured = identities.enabled if identities is not None else bool(settings.api_token or settings.api_tokens_file)
    router = APIRouter(
        prefix="/api/runs", tags=["runs"], route_class=OrjsonRoute,
        responses=ERRORS if secured else {k: v for k, v in ERRORS.items() if k not in (401, 403)},
    )

    async def get_run(run_id: uuid.UUID) -> Run:
        run = await store.get(run_id)
        if run is None:
            raise _not_found(run_id)
        return run

    @router.post("", status_code=201, response_model=RunCreated, **access(Scope.SUBMIT, secured),
                 responses={400: {"model": ErrorBody, "description": "The body is not JSON, or over the size "
                                  "limit, or `costBudgetUsd` is set for a model without a price"}})
    async def submit(
        body: RunRequest,
        request: Request,
        response: Response,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key",
            description="Retrying with the same key returns the run the first request made (201 again, "
            "with `Idempotent-Replayed: true`); reusing it for a different request is a 422.",
            json_schema_extra={"minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY, "pattern": "^[\\x20-\\x7e]*$"},
        )] = None,
        traceparent: Annotated[str | None, Header(
            description="W3C Trace Context (version 00, `" + TRACEPARENT_PATTERN + "`): the run's trace (when "
            "workers export traces) becomes a child of this span, whichever workers drive it. A malformed value "
            "is ignored, as the W3C specification requires of a receiver (the run gets a trace of its own); the "
            "answer then carries `Traceparent-Ignored` saying why.",
            json_schema_extra=_traceparent_schema,
        )] = None,
    ) -> RunCreated:
        """Queue a run. The next free worker claims it. Scope: `submit`; the run records who as `createdBy`."""
        key = _idempotency_key(idempotency_key)
        try:
            parent = checked_traceparent(traceparent)
        except ValueError as e:
            # A tracing header a proxy mangled must not cost the caller its run: W3C receivers ignore it.
            parent = None
            response.headers["Traceparent-Ignored"] = f"traceparent {e}"
        problems = [
            FieldProblem(field=f"tools[{i}]", problem=f"unknown tool {name!r}; this server offers: "
                         f"{', '.join(tools.names) or 'no tools'}")
            for i, name in enumerate(body.tools or ()) if tools.get(name) is None
        ]
        if problems:
            raise ApiError(422, summary(problems), problems)
        model = body.model or settings.default_model
        # A step of an unpriced model costs null, so its budget would never stop the run.
        if (problem := cost_budget_problem(prices, model, body.cost_budget())) is not None:
            raise ApiError(400, problem, [FieldProblem(field="costBudgetUsd", problem=problem)])
        new = NewRun(
            input=body.input,
            model=model,
            token_budget=body.token_budget,
            timeout_seconds=body.timeout_seconds,
            max_steps=body.max_steps,
            tools=tuple(dict.fromkeys(body.tools)) if body.tools is not None else None,
            system=body.system,
            cost_budget_usd=body.cost_budget(),
            idempotency_key=key,
            created_by=caller_name(request),
            traceparent=parent,
        )
        run, created = await store.create(new)
        if not created:
            if key is None or run.idempotency_key != key:  # a random id never collides in practice
                raise ApiError(409, "a run with this id already exists")
            if not _same_request(run, new):
                problem = "was already used for a different request"
                raise ApiError(422, f"Idempotency-Key {problem}",
                               [FieldProblem(field="Idempotency-Key", problem=problem)])
            response.headers["Idempotent-Replayed"] = "true"
        response.headers["Location"] = f"/api/runs/{run.id}"
        # A new run is QUEUED when inserted, though a worker may have claimed it by the time it is read back.
        return RunCreated(id=run.id, status=RunStatus.QUEUED if created else run.status)

    @router.get("", response_model=RunPage, **access(Scope.READ, secured))
    async def list_runs(
        status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Runs per page.")] = 50,
        after: Annotated[uuid.UUID | None, Query(
            description="The `next` cursor of the previous page: runs created before this one.")] = None,
    ) -> RunPage:
        """Runs, newest first, a page at a time (keyset pagination: stable while runs are added).

        The answer is `{"items": [...], "next": "<uuid>" | null}`; to get the following page pass
        `next` as `after`, with the same `status`. `next` is null on the last page. Scope: `read`.
        """
        runs = await store.list_runs(status, limit + 1, after)
        # A cursor naming no run yields an empty page; only then is it worth a query to tell the two apart.
        if after is not None and not runs and await store.get(after) is None:
            problem = "names no run; pass the `next` of a previous page"
            raise ApiError(422, f"after: {problem}", [FieldProblem(field="after", problem=problem)])
        page = runs[:limit]
        return RunPage(items=[RunSummary.of(r) for r in page], next=page[-1].id if len(runs) > limit else None)

    @router.get("/{id}", response_model=RunView, **access(Scope.READ, secured))
    async def get(run_id: RunId) -> RunView:
        """A run: status, input, model, budgets, tokens and cost so far, error, times, the holding worker,
        who created it and who cancelled it. Scope: `read`."""
        return RunView.of(await get_run(run_id))

    @router.get("/{id}/timeline", response_model=list[TimelineStep], **access(Scope.READ, secured))
    async def timeline(run_id: RunId) -> list[TimelineStep]:
        """The run's steps in seq order, without their request and response bodies. Scope: `read`."""
        steps = await store.timeline(run_id)
        if not steps:  # a run without steps yet, or no run at all
            await get_run(run_id)
        return [TimelineStep.of(s) for s in steps]

    @router.get("/{id}/steps/{seq}", response_model=StepDetail, **access(Scope.READ, secured))
    async def step(
        run_id: RunId, seq: Annotated[int, Path(ge=1, le=MAX_SEQ, description="The step's seq (from 1).")]
    ) -> StepDetail:
        """One step with its request and response bodies, for debugging. Scope: `read`."""
        found = await store.step(run_id, seq)
        if found is None:
            await get_run(run_id)
            raise ApiError(404, f"run {run_id} has no step {seq}")
        return StepDetail.of(found)

    @router.post("/{id}/cancel", status_code=202, response_model=RunView, **access(Scope.CANCEL, secured),
                 responses={409: {"model": ErrorBody, "description": "The run has already finished"}})
    async def cancel(run_id: RunId, request: Request) -> RunView:
        """Ask a run to stop: a queued run is CANCELLED at once, a running one at its next step boundary.

        Scope: `cancel`. The first caller to ask is recorded as `cancelledBy`."""
        before = await get_run(run_id)
        if before.status.terminal:
            raise ApiError(409, f"run {run_id} has already finished: {before.status.value}")
        after = await store.cancel(run_id, by=caller_name(request))
        if after is None:
            raise _not_found(run_id)
        if after.status.terminal and not after.cancel_requested:  # it finished in between
            raise ApiError(409, f"run {run_id} has already finished: {after.status.value}")
        return RunView.of(after)

    return router
