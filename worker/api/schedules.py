"""The /api/schedules routes: runs started by the clock (cron in a time zone, or every N seconds)."""

from __future__ import annotations

import datetime
import zoneinfo
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import AfterValidator, ConfigDict, Field, ValidationError

from agentrun.worker.api.common import (
    MAX_PAGE,
    OrjsonRoute,
    Responses,
    Submissions,
    documented_errors,
    field_error,
)
from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.guards import (
    CREATE_TENANT,
    TenantQuery,
    access,
    caller_name,
    viewer_of,
    whose_tenant,
)
from agentrun.worker.api.identities import Identities, Scope
from agentrun.worker.api.schemas import Camel, ErrorBody, FieldProblem, RunRequest, RunView, Whole
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.schedules import (
    DEFAULT_STARTING_DEADLINE_SECONDS,
    MAX_CRON_CHARS,
    MAX_INTERVAL_SECONDS,
    MAX_STARTING_DEADLINE_SECONDS,
    MAX_TIMEZONE_CHARS,
    SCHEDULE_NAME,
    ConcurrencyPolicy,
    Schedule,
    cron_problem,
    name_problem,
    spec_json,
    template_problems,
    timezone_problem,
)
from agentrun.worker.core.submission import Caller
from agentrun.worker.core.tenants import TENANT_PATTERN
from agentrun.worker.llm.providers import Providers
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox


def _dns_label(value: str) -> str:
    if (why := name_problem(value)) is not None:
        raise ValueError(why)
    return value


ScheduleName = Annotated[str, AfterValidator(_dns_label), Field(json_schema_extra={"pattern": SCHEDULE_NAME})]
PathName = Annotated[str, Path(alias="name", pattern=SCHEDULE_NAME, max_length=63, description="The schedule's name.")]
Policy = Literal["Allow", "Forbid", "Replace"]
# The time zones this server knows, named in the document: a JSON Schema cannot say "an IANA name" otherwise.
ZONES = sorted(z for z in zoneinfo.available_timezones() if timezone_problem(z) is None)
# A schedule's run starts fresh at its tick: the run request's fields that say otherwise are refused.
NOT_IN_TEMPLATE: dict[str, Any] = {
    "not": {"anyOf": [{"required": [f]} for f in ("continueFrom", "forkFrom", "runAt", "delaySeconds")]}}


class _Timing(Camel):
    model_config = ConfigDict(extra="forbid", strict=True)

    cron: Annotated[str, Field(max_length=MAX_CRON_CHARS)] | None = Field(
        None, description="A standard 5-field cron expression (minute hour day-of-month month day-of-week), read in "
        "`timezone`. Exactly one of `cron` and `intervalSeconds`.", examples=["0 9 * * 1-5"])
    interval_seconds: Annotated[Whole, Field(ge=1, le=MAX_INTERVAL_SECONDS)] | None = Field(
        None, description="A tick every this many seconds (at least 1), counted from when the schedule was made "
        "(or its timing last changed).")
    timezone: Annotated[str, Field(min_length=1, max_length=MAX_TIMEZONE_CHARS,
                                   json_schema_extra={"enum": ZONES} if ZONES else None)] | None = Field(
        None, description="The IANA time zone `cron` is read in (default UTC). Daylight saving time as cron and "
        "Kubernetes CronJob: a time a spring-forward skips runs once at the jump, one a fall-back repeats once.")
    run: RunRequest | None = Field(None, description="The run each tick starts: a run request (POST /api/runs), "
                                   "with `agent` or without; not `continueFrom`, `forkFrom`, `runAt`, `delaySeconds`.",
                                   json_schema_extra=NOT_IN_TEMPLATE)
    concurrency_policy: Policy | None = Field(
        None, description="`Allow` (default): a tick starts its run whatever runs of the schedule are still active; "
        "`Forbid`: a tick is skipped while one is; `Replace`: a tick cancels the active ones and starts its own.")
    starting_deadline_seconds: Annotated[Whole, Field(ge=0, le=MAX_STARTING_DEADLINE_SECONDS)] | None = Field(
        None, description="How late a tick may start (default 60): after an outage at most one catch-up run, the "
        "latest missed tick's, if within this; the others are skipped and counted (agentrun_schedule_missed_total).")
    suspend: bool | None = Field(None, description="True: no ticks until resumed (default false).")


class ScheduleRequest(_Timing):
    """A schedule. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "anyOf": [{"required": ["cron"], "properties": {"cron": {"type": "string"}}},
                  {"required": ["intervalSeconds"], "properties": {"intervalSeconds": {"type": "integer"}}}],
        "not": {"required": ["cron", "intervalSeconds"],
                "properties": {"cron": {"type": "string"}, "intervalSeconds": {"type": "integer"}}},
    })
    run: RunRequest = Field(description="The run each tick starts: a run request (POST /api/runs), with `agent` or "
                            "without; not `continueFrom`, `forkFrom`, `runAt`, `delaySeconds`.",
                            json_schema_extra=NOT_IN_TEMPLATE)

    name: ScheduleName = Field(description="A DNS label: 1 to 63 lowercase letters, digits and '-', starting and "
                               "ending with a letter or digit.")
    tenant: str | None = Field(None, min_length=1, max_length=63, pattern=TENANT_PATTERN, description=CREATE_TENANT)


class SchedulePatch(_Timing):
    """The fields to change; those left out (or null) stay. Setting `cron` clears `intervalSeconds` and the
    reverse."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "not": {"required": ["cron", "intervalSeconds"],
                "properties": {"cron": {"type": "string"}, "intervalSeconds": {"type": "integer"}}},
    })


class ScheduleView(Camel):
    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    run: dict[str, Any] = Field(description="The run template as given.")
    concurrency_policy: Policy
    starting_deadline_seconds: int
    suspend: bool
    last_schedule_time: datetime.datetime | None = Field(description="The last tick that created a run.")
    next_schedule_time: datetime.datetime | None = Field(description="The next tick (null while suspended, or "
                                                         "stopped: see lastError).")
    active: int = Field(description="Runs of the schedule not finished yet.")
    missed: int = Field(description="Ticks missed so far (past the starting deadline, or older ticks of a catch-up).")
    last_error: str | None = Field(description="Why the last tick created no run, if it did not (an agent "
                                   "deleted since, say), or why the schedule stopped: its ticks cannot be worked out "
                                   "(its time zone no longer known, say); a PATCH or resume starts it again.")
    created_at: datetime.datetime | None
    created_by: str | None
    tenant: str = Field("default", description="The tenant whose schedule it is: its runs are that tenant's.")

    @classmethod
    def of(cls, s: Schedule) -> ScheduleView:
        return cls(
            name=s.name, cron=s.cron, interval_seconds=s.interval_seconds, timezone=s.timezone, run=s.run,
            concurrency_policy=s.concurrency_policy.value, starting_deadline_seconds=s.starting_deadline_seconds,
            suspend=s.suspend, last_schedule_time=s.last_schedule_time, next_schedule_time=s.next_due_at,
            active=s.active, missed=s.missed, last_error=s.last_error, created_at=s.created_at,
            created_by=s.created_by, tenant=s.tenant,
        )


class ScheduleList(Camel):
    items: list[ScheduleView]


def _no_schedule(name: str) -> ApiError:
    return ApiError(404, f"no schedule {name!r}")


def _not_ours(s: Schedule) -> None:
    """A 409 for a change of a schedule an AgentSchedule owns: its spec is the truth, the operator would undo it."""
    if s.k8s_namespace is not None:
        raise ApiError(409, f"schedule {s.name!r} is the AgentSchedule {s.k8s_namespace}/{s.k8s_name or s.name}'s: "
                       "change or delete that resource (kubectl) instead")


class ScheduleRoutes:
    def __init__(self, store: RunStore, submissions: Submissions) -> None:
        self.store, self.submissions = store, submissions

    async def _checked(self, name: str, fields: dict[str, Any], tenant: str) -> Schedule:
        """The schedule `fields` (API names, merged) make, checked as POST /api/runs checks a run: a 4xx
        naming the field otherwise."""
        cron, interval = fields.get("cron"), fields.get("intervalSeconds")
        if (cron is None) == (interval is None):
            raise field_error("cron", "exactly one of cron and intervalSeconds is required")
        tz = fields.get("timezone") or "UTC"
        if cron is not None and (why := cron_problem(cron)) is not None:
            raise field_error("cron", why)
        if (why := timezone_problem(tz)) is not None:
            raise field_error("timezone", why)
        if fields.get("run") is None:
            raise field_error("run", "is required: the run each tick starts")
        try:
            request = RunRequest.model_validate(fields["run"])
        except ValidationError as e:
            problems = [FieldProblem(field="run." + ".".join(str(p) for p in err["loc"]), problem=err["msg"])
                        for err in e.errors()]
            raise ApiError(422, f"{problems[0].field}: {problems[0].problem}", problems) from None
        if request.tenant not in (None, tenant):
            raise field_error("run.tenant", f"a schedule's runs are its own tenant's, {tenant!r}")
        spec = request.spec()
        if unfit := template_problems(spec):
            raise ApiError(422, f"{unfit[0][0]}: {unfit[0][1]}", [FieldProblem(field=f, problem=p) for f, p in unfit])
        try:
            self.submissions.check_webhook(spec.webhook, tenant=tenant)
            # The checks of a submission: tools, agent (the tenant's), model, budgets.
            await self.submissions.planned(spec, None, Caller(tenant=tenant))
        except ApiError as e:
            raise ApiError(e.status, f"run.{e.message}" if e.fields else e.message,
                           [FieldProblem(field=f"run.{p.field}", problem=p.problem) for p in e.fields]) from None
        policy = fields.get("concurrencyPolicy") or "Allow"
        deadline = fields.get("startingDeadlineSeconds")
        return Schedule(
            name=name, cron=cron, interval_seconds=interval, timezone=tz,
            run=request.model_dump(mode="json", by_alias=True, exclude_unset=True), spec=spec_json(spec),
            concurrency_policy=ConcurrencyPolicy(policy),
            starting_deadline_seconds=DEFAULT_STARTING_DEADLINE_SECONDS if deadline is None else deadline,
            suspend=bool(fields.get("suspend")), tenant=tenant,
        )

    async def create(self, body: ScheduleRequest, request: Request, response: Response) -> ScheduleView:
        """Create a schedule (201); its first tick is the first after now. A name taken is a 409. The run
        template is checked as POST /api/runs checks a run (an unknown tool, agent or model is refused,
        naming `run.<field>`). Scope: `submit`; recorded as `createdBy`, which its runs carry too."""
        fields = body.model_dump(by_alias=True, exclude_unset=True, exclude={"name", "tenant"})
        s = await self._checked(body.name, fields | {"run": _raw(body.run)}, whose_tenant(request, body.tenant))
        try:
            stored, created = await self.store.create_schedule(s, caller_name(request))
        except ValueError as e:
            raise ApiError(422, str(e)) from None
        if not created:
            raise ApiError(409, f"a schedule named {body.name!r} exists: PATCH it, or DELETE it first")
        response.headers["Location"] = f"/api/schedules/{stored.name}"
        return ScheduleView.of(stored)

    async def list_schedules(self, request: Request, tenant: TenantQuery = None) -> ScheduleList:
        """Every schedule of the tenant, by name. Scope: `read`."""
        found = await self.store.schedules(whose_tenant(request, tenant))
        return ScheduleList(items=[ScheduleView.of(s) for s in found])

    async def get(self, name: PathName, request: Request, tenant: TenantQuery = None) -> ScheduleView:
        """A schedule with `lastScheduleTime`, `nextScheduleTime` and its `active` runs. Scope: `read`."""
        found = await self.store.schedule(name, whose_tenant(request, tenant))
        if found is None:
            raise _no_schedule(name)
        return ScheduleView.of(found)

    async def patch(
        self, name: PathName, body: SchedulePatch, request: Request, tenant: TenantQuery = None,
    ) -> ScheduleView:
        """Change some fields of a schedule (checked as at creation). A change of timing, or a resume
        (`suspend: false`), makes the next tick the first after now. A schedule an AgentSchedule owns is a
        409 (change the resource). Scope: `submit`."""
        whose = whose_tenant(request, tenant)
        found = await self.store.schedule(name, whose)
        if found is None:
            raise _no_schedule(name)
        _not_ours(found)
        fields: dict[str, Any] = {
            "cron": found.cron, "intervalSeconds": found.interval_seconds, "timezone": found.timezone,
            "run": found.run, "concurrencyPolicy": found.concurrency_policy.value,
            "startingDeadlineSeconds": found.starting_deadline_seconds, "suspend": found.suspend,
        }
        change = body.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)
        if "cron" in change and "intervalSeconds" in change:
            raise field_error("cron", "exactly one of cron and intervalSeconds")
        if "run" in change:
            change["run"] = _raw(body.run)
        if change.get("cron") is not None:
            fields["intervalSeconds"] = None
        if change.get("intervalSeconds") is not None:
            fields["cron"] = None
        fields.update(change)
        s = await self._checked(name, fields, whose)
        try:
            stored = await self.store.update_schedule(s)
        except ValueError as e:
            raise ApiError(422, str(e)) from None
        if stored is None:
            raise _no_schedule(name)
        return ScheduleView.of(stored)

    async def delete(self, name: PathName, request: Request, tenant: TenantQuery = None) -> Response:
        """Delete a schedule: no more ticks. The runs it created stay, and those in flight go on. A schedule an
        AgentSchedule owns is a 409 (delete the resource). Scope: `submit`."""
        whose = whose_tenant(request, tenant)
        found = await self.store.schedule(name, whose)
        if found is not None:
            _not_ours(found)
        if found is None or not await self.store.delete_schedule(name, whose):
            raise _no_schedule(name)
        return Response(status_code=204)

    async def runs(
        self, name: PathName, request: Request,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Most runs returned.")] = 50,
        tenant: TenantQuery = None,
    ) -> list[RunView]:
        """The runs the schedule created, newest first; each has `scheduleName` and `scheduledTime`. Scope: `read`."""
        whose = whose_tenant(request, tenant)
        found = await self.store.scoped(viewer_of(request)).schedule_runs(name, limit, whose)
        if not found and await self.store.schedule(name, whose) is None:
            raise _no_schedule(name)
        return [RunView.of(r, self.submissions.prices) for r in found]


def _raw(run: RunRequest | None) -> dict[str, Any] | None:
    return run.model_dump(mode="json", by_alias=True, exclude_unset=True) if run is not None else None


CREATE_ERRORS: Responses = {
    409: {"model": ErrorBody, "description": "A schedule of the name exists"},
    400: {"model": ErrorBody, "description": "The body is not JSON at all, or over the size limit"},
    404: {"model": ErrorBody, "description": "The run names no agent (or sub-agent): `fields` names which"},
}
READ_ERRORS: Responses = {404: {"model": ErrorBody, "description": "No such schedule"}}
OWNED_ERRORS: Responses = {409: {"model": ErrorBody, "description": "An AgentSchedule owns the schedule: change "
                                 "or delete that resource instead"}}


def schedules_router(
    store: RunStore, tools: ToolBox, settings: WorkerSettings, prices: PriceTable, identities: Identities,
    providers: Providers | None = None,
) -> APIRouter:
    routes = ScheduleRoutes(store, Submissions(store, tools, settings, prices, providers or Providers()))
    secured = identities.enabled
    errors = documented_errors(secured, runs=False)
    router = APIRouter(prefix="/api/schedules", tags=["schedules"], route_class=OrjsonRoute, responses=errors)
    read, write = access(Scope.READ, secured), access(Scope.SUBMIT, secured)
    router.post("", status_code=201, response_model=ScheduleView, responses=CREATE_ERRORS, **write)(routes.create)
    router.get("", response_model=ScheduleList, **read)(routes.list_schedules)
    router.get("/{name}", response_model=ScheduleView, responses=READ_ERRORS, **read)(routes.get)
    router.patch("/{name}", response_model=ScheduleView, responses={**CREATE_ERRORS, **READ_ERRORS, **OWNED_ERRORS},
                 **write)(routes.patch)
    router.delete("/{name}", status_code=204, response_class=Response, responses={**READ_ERRORS, **OWNED_ERRORS},
                  **write)(routes.delete)
    router.get("/{name}/runs", response_model=list[RunView], responses=READ_ERRORS, **read)(routes.runs)
    return router

