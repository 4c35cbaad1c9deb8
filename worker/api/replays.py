"""The /api/replays routes: replay recorded runs against a change, and read the report (docs/api.md "Replays").

A replay is made through the door (runtime/door.py `Door.replay`) with one run per recorded run; its report
scores each pair once, when its replay run has finished, the first time someone reads the replay."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import importlib
import inspect
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Request, Response
from pydantic import ConfigDict, Field, model_validator

from agentrun.worker.api.common import (
    IDEMPOTENCY_KEY_SCHEMA,
    MAX_PAGE,
    OrjsonRoute,
    Responses,
    Submissions,
    checked_idempotency_key,
    documented_errors,
    field_error,
    refusal,
)
from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.guards import access, caller_name, tenant_for, viewer_of
from agentrun.worker.api.identities import Identities, Scope
from agentrun.worker.api.schemas import (
    MAX_SEQ,
    MAX_TOOLS,
    AgentRef,
    Camel,
    ErrorBody,
    Name,
    QuotaErrorBody,
    RunAt,
    Text,
    Whole,
)
from agentrun.worker.core import replays as report
from agentrun.worker.core.agents import parse_ref
from agentrun.worker.core.errors import Refused
from agentrun.worker.core.labels import KEY_PATTERN, MAX_NAME, MAX_PREFIX, VALUE_PATTERN, Selector, parse_selector
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.recording import Change, NewReplay, ToolPolicy
from agentrun.worker.core.records import Run, RunStatus, Step
from agentrun.worker.core.submission import Caller
from agentrun.worker.core.tenants import DEFAULT_TENANT
from agentrun.worker.llm.providers import Providers
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunFilter, RunStore
from agentrun.worker.store.replays import Pair, Replay
from agentrun.worker.tools import ToolBox

MAX_REPLAY_RUNS = 1000
DEFAULT_SELECTOR_LIMIT = 100
MAX_SELECTOR_CHARS = 4096
SCORING_BUDGET = 10.0
"""Seconds a read of replays spends judging pairs before it answers (a client waits 30 s by default)."""
FINISHED = tuple(s for s in RunStatus if s.terminal)
FinishedStatus = Literal["SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"]

ReplayId = Annotated[uuid.UUID, Path(alias="id", description="The replay's id (a UUID).")]


# -- the JSON shapes -------------------------------------------------------------------------------------------

class ReplaySelector(Camel):
    """Which recorded runs to replay: the caller's tenant's finished runs (never a replay's own runs), newest
    first, every filter given holding."""

    model_config = ConfigDict(extra="forbid", strict=True)

    labels: Annotated[str, Field(max_length=MAX_SELECTOR_CHARS)] | dict[
        Annotated[str, Field(pattern=KEY_PATTERN, max_length=MAX_PREFIX + 1 + MAX_NAME)],
        Annotated[str, Field(pattern=VALUE_PATTERN, max_length=MAX_NAME)]] | None = Field(
        None, description="A Kubernetes label selector (`team=billing,env!=prod,tier in (a,b)`), as "
        "`GET /api/runs?labelSelector=`, or an object of labels every run must carry (`{\"team\": \"billing\"}`).")
    agent: AgentRef | None = Field(None, description="Runs made from this agent: `name` (any version) or "
                                   "`name@version`.")
    status: list[FinishedStatus] | None = Field(
        None, min_length=1, max_length=4, description="Runs that ended so; when absent every finished run "
        "(SUCCEEDED, FAILED, CANCELLED, TIMED_OUT). Only a finished run can be replayed.")
    since: RunAt | None = Field(None, description="Runs created after this RFC 3339 time.")
    limit: Whole = Field(DEFAULT_SELECTOR_LIMIT, ge=1, le=MAX_REPLAY_RUNS,
                         description=f"The newest this many matching runs (at most {MAX_REPLAY_RUNS}).")

    def filter(self, tenant: str) -> RunFilter:
        selector = self.label_selector()
        name, version = parse_ref(self.agent) if self.agent is not None else (None, None)
        return RunFilter(statuses=tuple(RunStatus(s) for s in self.status) if self.status else FINISHED,
                         selector=selector, agent=name, agent_version=version, created_after=self.since,
                         tenant=tenant, replays=False)

    def label_selector(self) -> Selector | None:
        if self.labels is None:
            return None
        text = self.labels if isinstance(self.labels, str) else ",".join(f"{k}={v}" for k, v in self.labels.items())
        try:
            return parse_selector(text)
        except ValueError as e:
            raise field_error("selector.labels", str(e)) from None


class ReplayChange(Camel):
    """What the replay changes of every recorded run; what it leaves out stays as the recorded run had it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: Name | None = Field(None, description="The model the replay runs ask.")
    system: Text | None = Field(None, description="The system prompt.")
    agent: AgentRef | None = Field(None, description="An agent (`name@version`, or `name`: its latest) whose "
                                   "fields replace the recorded run's.")
    tools: list[Name] | None = Field(None, max_length=MAX_TOOLS, description="The tools the model is offered.")

    def as_change(self) -> Change:
        return Change(model=self.model, system=self.system, agent=self.agent,
                      tools=tuple(self.tools) if self.tools is not None else None)


class ReplayRequest(Camel):
    """A replay: recorded runs (`runs`, or a `selector`: one of them) run again with a change."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"oneOf": [
        {"required": ["runs"], "properties": {"runs": {"type": "array"}}},
        {"required": ["selector"], "properties": {"selector": {"type": "object"}}}]})

    runs: list[Annotated[uuid.UUID, Field(strict=False)]] | None = Field(
        None, min_length=1, max_length=MAX_REPLAY_RUNS, description="The recorded runs to replay, by id: finished "
        "runs of the caller's tenant. Not with `selector`.")
    selector: ReplaySelector | None = Field(None, description="Which recorded runs to replay. Not with `runs`.")
    change: ReplayChange | None = Field(None, description="What changes; none: the replay checks that the same "
                                        "model and prompt still do what they did.")
    from_seq: Whole | None = Field(None, ge=2, le=MAX_SEQ, description="Keep each recorded run's steps before "
                                   "this seq and diverge from there; when absent the replay starts from the input.")
    tool_policy: ToolPolicy = Field(
        ToolPolicy.RECORDED, strict=False, description="`recorded`: every tool call is answered from the recording "
        "(a call it has no match for gets an error result); `recorded_then_live_readonly`: such a call runs if its "
        "tool only reads.")
    scorer: Name = Field(report.DEFAULT_SCORER, description="What passes: `exact` (same status and output), "
                         "`schema_valid` (the replay succeeded with a valid output), `same_tool_calls` (same "
                         "success or failure, the same tool calls in the same order), or a `module:function` listed "
                         "in the server's AGENTRUN_REPLAY_SCORERS.")

    @model_validator(mode="after")
    def _runs_or_selector(self) -> ReplayRequest:
        if (self.runs is None) == (self.selector is None):
            raise ValueError("give `runs` or `selector`, one of them")
        return self


class ReplayCreated(Camel):
    id: uuid.UUID
    runs: int = Field(description="Replay runs made: one per recorded run.")


class Totals(Camel):
    recorded: int
    replayed: int


class CostTotals(Camel):
    recorded: float
    replayed: float


class ReplayResult(Camel):
    """One recorded run and its replay: the replay run's status and, once it has finished, its verdict."""

    recorded_run_id: uuid.UUID
    replay_run_id: uuid.UUID
    status: RunStatus = Field(description="The replay run's status.")
    passed: bool | None = Field(alias="pass", description="The scorer's verdict; null until the replay run has "
                                "finished, or when it cannot be judged (the recorded run was pruned since).")
    diff: dict[str, Any] | None = Field(description="How the pair compares (docs/api.md \"Replays\"): `status`, "
                                        "`output`, `toolCalls` (with `distance`), `steps`, `tokens`, `costUsd`, "
                                        "`latencyMs`, `error`; null until scored.")


class ReplaySummary(Camel):
    """A replay in a list (GET /api/replays/{id} has its results)."""

    id: uuid.UUID
    status: Literal["RUNNING", "COMPLETED"] = Field(description="RUNNING until every replay run has finished and "
                                                    "been scored, then COMPLETED.")
    pass_rate: float | None = Field(description="Passed over judged pairs; null until one is judged.")
    runs: int
    finished: int = Field(description="Replay runs that have finished.")
    scored: int = Field(description="Pairs scored: a verdict stored (pass, fail, or none for a recording gone).")
    scorer: str
    tool_policy: ToolPolicy
    change: dict[str, Any]
    from_seq: int | None
    created_at: datetime.datetime
    created_by: str | None
    tenant: str

    @classmethod
    def fields_of(cls, replay: Replay) -> dict[str, Any]:
        done = replay.scored >= replay.runs
        return dict(
            id=replay.id, status="COMPLETED" if done else "RUNNING",
            pass_rate=replay.passed / replay.judged if replay.judged else None, runs=replay.runs,
            finished=replay.finished, scored=replay.scored, scorer=replay.scorer,
            tool_policy=ToolPolicy(replay.tool_policy),
            change=replay.request.get("change") or {}, from_seq=replay.from_seq, created_at=replay.created_at,
            created_by=replay.created_by, tenant=replay.tenant)

    @classmethod
    def of(cls, replay: Replay) -> ReplaySummary:
        return cls(**cls.fields_of(replay))


class ReplayView(ReplaySummary):
    """A replay and its report: a result per recorded run, the pass rate, and the totals against the recording."""

    results: list[ReplayResult]
    tokens: Totals = Field(description="Tokens the recorded runs spent, and the replay runs so far.")
    cost_usd: CostTotals = Field(description="USD, as `tokens`.")
    selector: dict[str, Any] | None = Field(None, description="The selector the runs were found by, if any.")


class ReplayPage(Camel):
    """One page of replays, newest first; pass `next` as `after` for the following one (null on the last)."""

    items: list[ReplaySummary]
    next: uuid.UUID | None


# -- the routes ------------------------------------------------------------------------------------------------

def _not_found(replay_id: uuid.UUID) -> ApiError:
    return ApiError(404, f"no replay with id {replay_id}")


class Scorers:
    """The custom scorers configuration lists (AGENTRUN_REPLAY_SCORERS), imported when first used."""

    def __init__(self, listed: Sequence[str]) -> None:
        self.listed = tuple(listed)
        self._loaded: dict[str, report.Scorer] = {}

    def problem(self, name: str) -> str | None:
        """Why a request may not name `name`: unknown, unlisted, or listed but not importable."""
        if (problem := report.scorer_problem(name, self.listed)) is not None:
            return problem
        if name in report.BUILT_IN:
            return None
        loaded = self.load(name)
        return loaded if isinstance(loaded, str) else None

    def load(self, name: str) -> report.Scorer | str:
        """The callable `module:function` names, or why it cannot be had."""
        if name in self._loaded:
            return self._loaded[name]
        if name not in self.listed:
            return f"{name!r} is not listed in AGENTRUN_REPLAY_SCORERS"
        module, _, function = name.partition(":")
        try:
            found: Any = getattr(importlib.import_module(module), function)
        except Exception as e:  # an operator's module: whatever it raises on import is its problem, said so
            return f"cannot load {name!r}: {type(e).__name__}: {e}"
        if not callable(found):
            return f"{name!r} is not callable"
        scorer: report.Scorer = found
        self._loaded[name] = scorer
        return scorer


class ReplayRoutes:
    def __init__(self, store: RunStore, submissions: Submissions, scorers: Scorers, prices: PriceTable) -> None:
        self.store, self.submissions, self.scorers, self.prices = store, submissions, scorers, prices

    async def create(
        self, body: ReplayRequest, request: Request, response: Response,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key",
            description="Retrying with the same key returns the replay the first request made (201 again, with "
            "`Idempotent-Replayed: true`); reusing it for a different request is a 422.",
            json_schema_extra=IDEMPOTENCY_KEY_SCHEMA,
        )] = None,
    ) -> ReplayCreated:
        """Replay recorded runs against a change: one replay run per recorded run, made as any run (origin
        `replay`, `replayOf` the recorded run), its tool calls answered from the recording. Scope: `submit`;
        the replay records who as `createdBy`."""
        key = checked_idempotency_key(idempotency_key)
        if (problem := self.scorers.problem(body.scorer)) is not None:
            raise field_error("scorer", problem)
        tenant = tenant_for(request, None)
        recorded = await self.recorded(request, body, tenant)
        normalised = _normalised(body, recorded)
        change = body.change.as_change() if body.change is not None else Change()
        replay = NewReplay(id=uuid.uuid4(), request=normalised, change=change,
                           tool_policy=body.tool_policy, scorer=body.scorer, from_seq=body.from_seq,
                           idempotency_key=key)
        caller = Caller(created_by=caller_name(request), tenant=tenant)
        try:
            replay_id, created = await self.submissions.door.replay(
                replay, recorded, caller, defaults=self.submissions.defaults, offer=self.submissions.offer())
        except Refused as e:
            raise refusal(e) from None
        except ValueError as e:  # a text PostgreSQL cannot hold, named by the store
            raise field_error("change", str(e)) from None
        made = await self.store.replay(replay_id, viewer_of(request))
        if made is None:  # a platform operator's retry of a key of another tenant's
            raise ApiError(409, "a replay with this id already exists")
        if not created:
            if not _same_request(made, normalised, caller.created_by):
                raise field_error("Idempotency-Key", "was already used for a different request")
            response.headers["Idempotent-Replayed"] = "true"
        response.headers["Location"] = f"/api/replays/{replay_id}"
        return ReplayCreated(id=replay_id, runs=made.runs)

    async def recorded(self, request: Request, body: ReplayRequest, tenant: str | None) -> list[Run]:
        """The runs to replay, as the caller sees them: those listed (404 naming one it does not see), or those
        the selector finds among its tenant's finished runs (422 when none)."""
        reads = self.store.scoped(viewer_of(request))
        if body.runs is not None:
            found = []
            for i, run_id in enumerate(body.runs):
                run = await reads.get(run_id)
                if run is None:
                    raise field_error(f"runs[{i}]", f"no run {run_id}", 404)
                if run.replay_id is not None:
                    raise field_error(f"runs[{i}]", f"run {run_id} is a replay's run; replay the run it "
                                      f"replays, {run.replay_of}")
                found.append(run)
            return found
        assert body.selector is not None
        where = body.selector.filter(tenant or DEFAULT_TENANT)
        runs = await reads.list_runs(None, body.selector.limit, where=where)
        if not runs:
            raise field_error("selector", "matches no finished run of the tenant to replay")
        return runs

    async def get(self, replay_id: ReplayId, request: Request) -> ReplayView:
        """A replay and its report: each recorded run with its replay run's status and verdict, the pass rate
        and the totals. A replay run that has finished is scored the first time the replay is read after, and
        its verdict kept (a slow custom scorer judges for at most SCORING_BUDGET seconds per read; the rest on the
        next reads). `status` is RUNNING until every replay run has finished and been scored, then COMPLETED.
        Scope: `read`."""
        viewer = viewer_of(request)
        replay = await self.store.replay(replay_id, viewer)
        if replay is None:
            raise _not_found(replay_id)
        await self.store.score(replay.id, self._judge(replay.scorer), SCORING_BUDGET)
        pairs = await self.store.pairs(replay)
        # The counts as the results read them (another reader may have scored since the replay was read).
        judged = [p.passed for p in pairs if p.passed is not None]
        replay = dataclasses.replace(replay, runs=len(pairs), finished=sum(p.replayed.status.terminal for p in pairs),
                                     scored=sum(p.scored for p in pairs), judged=len(judged), passed=sum(judged))
        return ReplayView(
            **ReplaySummary.fields_of(replay),
            results=[ReplayResult.model_validate({
                "recordedRunId": p.recorded_id, "replayRunId": p.replayed.id, "status": p.replayed.status,
                "pass": p.passed, "diff": p.diff}) for p in pairs],
            tokens=Totals(recorded=sum(p.recorded.tokens_used_total for p in pairs if p.recorded is not None),
                          replayed=sum(p.replayed.tokens_used_total for p in pairs)),
            cost_usd=_cost_totals(pairs), selector=replay.request.get("selector"),
        )

    def _judge(self, scorer: str) -> Any:
        async def judge(replayed: Run, replayed_steps: Sequence[Step], recorded: Run | None,
                        recorded_steps: Sequence[Step]) -> report.Verdict:
            now = report.view_of(replayed, replayed_steps)
            if recorded is None:
                return report.missing_recording(replayed.replay_of, now)
            then = report.view_of(recorded, recorded_steps)
            if scorer in report.BUILT_IN:
                return report.judge(scorer, then, now)
            custom = self.scorers.load(scorer)
            diff = {**report.compare(then, now), "scorer": scorer}
            if isinstance(custom, str):  # unlisted since, or its module broke
                return report.Verdict(False, {**diff, "scorerError": custom})
            try:
                # A coroutine function (an LLM judge, say) is awaited here; a plain function may block: a thread.
                result = (await custom(then, now) if inspect.iscoroutinefunction(custom)
                          else await asyncio.to_thread(custom, then, now))
                if inspect.isawaitable(result):  # a callable object whose __call__ is async
                    result = await result
            except Exception as e:  # a scorer is foreign code: its failure is the pair's, said in its diff
                message = f"{type(e).__name__}: {e}"[:report.MAX_SCORER_ERROR]
                return report.Verdict(False, {**diff, "scorerError": message})
            return report.custom_result(diff, result)

        return judge

    async def list(
        self, request: Request,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Replays per page.")] = 50,
        after: Annotated[uuid.UUID | None, Query(
            description="The `next` cursor of the previous page: replays made before this one.")] = None,
    ) -> ReplayPage:
        """The replays the caller's tenant made, newest first, a page at a time, each with its status and pass
        rate so far (the runs of the page's replays that have finished are scored first, as by GET
        /api/replays/{id}). Scope: `read`."""
        viewer = viewer_of(request)
        found = await self.store.replays(viewer, limit + 1, after)
        if after is not None and not found and await self.store.replay(after, viewer) is None:
            raise field_error("after", "names no replay; pass the `next` of a previous page")
        page = found[:limit]
        scored = [await self.store.score(r.id, self._judge(r.scorer), SCORING_BUDGET / len(page))
                  for r in page if r.scored < r.finished]
        if any(scored):  # read again, with the verdicts just written
            found = await self.store.replays(viewer, limit + 1, after)
            page = found[:limit]
        return ReplayPage(items=[ReplaySummary.of(r) for r in page],
                          next=page[-1].id if len(found) > limit else None)


def _cost_totals(pairs: Sequence[Pair]) -> CostTotals:
    return CostTotals(recorded=float(sum(p.recorded.cost_usd_total for p in pairs if p.recorded is not None)),
                      replayed=float(sum(p.replayed.cost_usd_total for p in pairs)))


def _normalised(body: ReplayRequest, recorded: Sequence[Run]) -> dict[str, Any]:
    """The request as stored: what was asked, and the recorded runs it named or its selector found, in order."""
    return {
        "runs": [str(r.id) for r in recorded],
        "selector": body.selector.model_dump(mode="json", by_alias=True) if body.selector is not None else None,
        "change": body.change.model_dump(mode="json", by_alias=True, exclude_none=True) if body.change else {},
        "fromSeq": body.from_seq, "toolPolicy": body.tool_policy.value, "scorer": body.scorer,
    }


def _same_request(made: Replay, normalised: dict[str, Any], created_by: str | None) -> bool:
    """Whether a retry asks for what the first request did (a selector's runs may have moved on since)."""
    def asked(request: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in request.items() if not (k == "runs" and request.get("selector") is not None)}

    return made.created_by == created_by and asked(made.request) == asked(normalised)


CREATE_ERRORS: Responses = {
    400: {"model": ErrorBody, "description": "The body is not JSON at all, or over the size limit"},
    404: {"model": ErrorBody, "description": "A run of `runs` that the caller does not see (or that does not "
          "exist), or an agent named by `change.agent`: `fields` names which"},
    409: {"model": ErrorBody, "description": "A recorded run has not finished yet"},
    429: {"model": QuotaErrorBody, "description": "The tenant's quota refuses the replay's runs",
          "headers": {"Retry-After": {"description": "Seconds to wait before asking again",
                                      "schema": {"type": "integer"}}}},
}


def replays_router(
    store: RunStore, tools: ToolBox, settings: WorkerSettings, prices: PriceTable, identities: Identities | None = None,
    providers: Providers | None = None,
) -> APIRouter:
    submissions = Submissions(store, tools, settings, prices, providers or Providers())
    routes = ReplayRoutes(store, submissions, Scorers(settings.replay_scorers), prices)
    secured = identities.enabled if identities is not None else bool(settings.api_token or settings.api_tokens_file)
    router = APIRouter(prefix="/api/replays", tags=["replays"], route_class=OrjsonRoute,
                       responses=documented_errors(secured, runs=False))
    read = access(Scope.READ, secured)
    router.post("", status_code=201, response_model=ReplayCreated, **access(Scope.SUBMIT, secured),
                responses=CREATE_ERRORS)(routes.create)
    router.get("", response_model=ReplayPage, **read)(routes.list)
    router.get("/{id}", response_model=ReplayView, **read,
               responses={404: {"model": ErrorBody, "description": "No such replay (or another tenant's)"}})(routes.get)
    return router
