"""The /api/runs routes: submit, read, follow and cancel runs, over the store."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Path, Query, Request, Response, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer

from agentrun.worker.api.errors import ApiError, summary
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
from agentrun.worker.records import NewRun, Run, RunStatus
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox

MAX_PAGE = 200
MAX_IDEMPOTENCY_KEY = 255
# Printable ASCII: what every HTTP stack carries unchanged (other bytes arrive as Latin-1 guesses).
IDEMPOTENCY_KEY = re.compile(rf"[\x20-\x7e]{{1,{MAX_IDEMPOTENCY_KEY}}}")

RunId = Annotated[uuid.UUID, Path(alias="id", description="The run's id (a UUID).")]

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        401: "Missing or wrong bearer token (only when the server has one)",
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


class OrjsonRoute(APIRoute):
    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return route


def _not_found(run_id: uuid.UUID) -> ApiError:
    return ApiError(404, f"no run with id {run_id}")


def _same_request(run: Run, new: NewRun) -> bool:
    return (run.input, run.model, run.token_budget, run.timeout_seconds, run.max_steps, run.tools, run.system,
            run.cost_budget_usd, run.priority) == (new.input, new.model, new.token_budget, new.timeout_seconds,
                                                   new.max_steps, new.tools, new.system, new.cost_budget_usd,
                                                   new.priority)


def _idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(value):
        problem = f"must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
        raise ApiError(422, f"Idempotency-Key: {problem}", [FieldProblem(field="Idempotency-Key", problem=problem)])
    return value


def runs_router(store: RunStore, tools: ToolBox, settings: WorkerSettings) -> APIRouter:
    # The scheme only documents the token in OpenAPI; guards.BearerAuth enforces it before any parsing.
    # Documented only when the server has a token: an open server that advertised one would be lying.
    bearer = HTTPBearer(auto_error=False, description="The server's AGENTRUN_API_TOKEN.")
    router = APIRouter(
        prefix="/api/runs", tags=["runs"], route_class=OrjsonRoute,
        responses=ERRORS if settings.api_token else {k: v for k, v in ERRORS.items() if k != 401},
        dependencies=[Security(bearer)] if settings.api_token else [],
    )

    async def get_run(run_id: uuid.UUID) -> Run:
        run = await store.get(run_id)
        if run is None:
            raise _not_found(run_id)
        return run

    @router.post("", status_code=201, response_model=RunCreated,
                 responses={400: {"model": ErrorBody, "description": "The body is not JSON, or over the size limit"}})
    async def submit(
        body: RunRequest,
        response: Response,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key",
            description="Retrying with the same key returns the run the first request made (201 again, "
            "with `Idempotent-Replayed: true`); reusing it for a different request is a 422.",
            json_schema_extra={"minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY, "pattern": "^[\\x20-\\x7e]*$"},
        )] = None,
    ) -> RunCreated:
        """Queue a run. The next free worker claims it: higher `priority` first, not before `runAt` (or
        `delaySeconds` from now)."""
        key = _idempotency_key(idempotency_key)
        problems = [
            FieldProblem(field=f"tools[{i}]", problem=f"unknown tool {name!r}; this server offers: "
                         f"{', '.join(tools.names) or 'no tools'}")
            for i, name in enumerate(body.tools or ()) if tools.get(name) is None
        ]
        if problems:
            raise ApiError(422, summary(problems), problems)
        new = NewRun(
            input=body.input,
            model=body.model or settings.default_model,
            token_budget=body.token_budget,
            timeout_seconds=body.timeout_seconds,
            max_steps=body.max_steps,
            tools=tuple(dict.fromkeys(body.tools)) if body.tools is not None else None,
            system=body.system,
            cost_budget_usd=body.cost_budget(),
            idempotency_key=key,
            priority=body.priority,
            run_at=body.run_at,
            delay_seconds=body.delay_seconds,
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

    @router.get("", response_model=RunPage)
    async def list_runs(
        status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Runs per page.")] = 50,
        after: Annotated[uuid.UUID | None, Query(
            description="The `next` cursor of the previous page: runs created before this one.")] = None,
    ) -> RunPage:
        """Runs, newest first, a page at a time (keyset pagination: stable while runs are added).

        The answer is `{"items": [...], "next": "<uuid>" | null}`; to get the following page pass
        `next` as `after`, with the same `status`. `next` is null on the last page.
        """
        runs = await store.list_runs(status, limit + 1, after)
        # A cursor naming no run yields an empty page; only then is it worth a query to tell the two apart.
        if after is not None and not runs and await store.get(after) is None:
            problem = "names no run; pass the `next` of a previous page"
            raise ApiError(422, f"after: {problem}", [FieldProblem(field="after", problem=problem)])
        page = runs[:limit]
        return RunPage(items=[RunSummary.of(r) for r in page], next=page[-1].id if len(runs) > limit else None)

    @router.get("/{id}", response_model=RunView)
    async def get(run_id: RunId) -> RunView:
        """A run: status, input, model, budgets, tokens and cost so far, error, times, the holding worker."""
        return RunView.of(await get_run(run_id))

    @router.get("/{id}/timeline", response_model=list[TimelineStep])
    async def timeline(run_id: RunId) -> list[TimelineStep]:
        """The run's steps in seq order, without their request and response bodies."""
        steps = await store.timeline(run_id)
        if not steps:  # a run without steps yet, or no run at all
            await get_run(run_id)
        return [TimelineStep.of(s) for s in steps]

    @router.get("/{id}/steps/{seq}", response_model=StepDetail)
    async def step(
        run_id: RunId, seq: Annotated[int, Path(ge=1, le=MAX_SEQ, description="The step's seq (from 1).")]
    ) -> StepDetail:
        """One step with its request and response bodies, for debugging."""
        found = await store.step(run_id, seq)
        if found is None:
            await get_run(run_id)
            raise ApiError(404, f"run {run_id} has no step {seq}")
        return StepDetail.of(found)

    @router.post("/{id}/cancel", status_code=202, response_model=RunView,
                 responses={409: {"model": ErrorBody, "description": "The run has already finished"}})
    async def cancel(run_id: RunId) -> RunView:
        """Ask a run to stop: a queued run is CANCELLED at once, a running one at its next step boundary."""
        before = await get_run(run_id)
        if before.status.terminal:
            raise ApiError(409, f"run {run_id} has already finished: {before.status.value}")
        after = await store.cancel(run_id)
        if after is None:
            raise _not_found(run_id)
        if after.status.terminal and not after.cancel_requested:  # it finished in between
            raise ApiError(409, f"run {run_id} has already finished: {after.status.value}")
        return RunView.of(after)

    return router
