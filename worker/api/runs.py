"""The /api/runs routes: submit, read, follow and cancel runs, over the store."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response

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
    MAX_NAME_CHARS,
    MAX_SEQ,
    DecisionRequest,
    DecisionView,
    ErrorBody,
    FieldProblem,
    MessageRequest,
    MessageView,
    PendingView,
    QuotaErrorBody,
    RunCreated,
    RunPage,
    RunRequest,
    RunSummary,
    RunView,
    StepDetail,
    TimelineStep,
    WebhookDeliveryView,
    rfc3339,
)
from agentrun.worker.core import children as sub_agents
from agentrun.worker.core.agents import parse_ref
from agentrun.worker.core.answer import system_sent, tools_sent
from agentrun.worker.core.labels import Selector, parse_selector
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import Decision, NewRun, PendingCall, Run, RunStatus, StepKind
from agentrun.worker.core.replay import Conversation
from agentrun.worker.core.submission import Caller, Refused
from agentrun.worker.core.tenants import DEFAULT_TENANT, TENANT_PATTERN
from agentrun.worker.core.text import unstorable
from agentrun.worker.llm.providers import Providers
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.obs.tracing.context import TRACEPARENT_PATTERN, checked_traceparent
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import DecideOutcome, RunFilter, RunStore, ScopedReads
from agentrun.worker.tools import ToolBox

MAX_SELECTOR_CHARS = 4096

RunId = Annotated[uuid.UUID, Path(alias="id", description="The run's id (a UUID).")]


def _not_found(run_id: uuid.UUID) -> ApiError:
    return ApiError(404, f"no run with id {run_id}")


def _same_request(run: Run, new: NewRun) -> bool:
    # The identity too: another identity reusing a key is not retrying, and must not be handed the run.
    return (run.input, run.model, run.token_budget, run.timeout_seconds, run.max_steps, run.tools, run.system,
            run.cost_budget_usd, run.created_by, run.priority, run.agent, run.agent_version, run.sub_agents,
            run.webhook, run.context_management, run.labels) == (
                new.input, new.model, new.token_budget, new.timeout_seconds, new.max_steps, new.tools, new.system,
                new.cost_budget_usd, new.created_by, new.priority, new.agent, new.agent_version, new.sub_agents,
                new.webhook, new.context_management, new.labels)


def _traceparent_schema(schema: dict[str, Any]) -> None:
    """Any string (a malformed one is ignored, as W3C asks); an absent header is no value, not a JSON null."""
    schema.pop("anyOf", None)
    schema.update(type="string", examples=["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"])


class RunRoutes:
    """The /api/runs handlers over what they need; `runs_router` mounts them."""

    def __init__(self, store: RunStore, submissions: Submissions, metrics: Metrics | None) -> None:
        self.store, self.submissions, self.metrics = store, submissions, metrics
        self.tools, self.prices = submissions.tools, submissions.prices

    def reads(self, request: Request) -> ScopedReads:
        """The caller's reads: every read of runs a route makes goes through them (store/scoped.py)."""
        return self.store.scoped(viewer_of(request))

    async def get_run(self, reads: ScopedReads, run_id: uuid.UUID) -> Run:
        run = await reads.get(run_id)
        if run is None:
            raise _not_found(run_id)
        return run

    async def source(self, reads: ScopedReads, body: RunRequest) -> Run | None:
        """The run a new one continues or forks: 404 if there is none (the policy checks the rest)."""
        if body.continue_from is not None:
            source = await reads.get(body.continue_from)
            if source is None:
                raise ApiError(404, f"continueFrom: no run with id {body.continue_from}",
                               [FieldProblem(field="continueFrom", problem="names no run")])
            return source
        if body.fork_from is not None:
            source = await reads.get(body.fork_from.run_id)
            if source is None:
                raise ApiError(404, f"forkFrom: no run with id {body.fork_from.run_id}",
                               [FieldProblem(field="forkFrom.runId", problem="names no run")])
            return source
        return None

    async def submit(
        self,
        body: RunRequest,
        request: Request,
        response: Response,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key",
            description="Retrying with the same key returns the run the first request made (201 again, "
            "with `Idempotent-Replayed: true`); reusing it for a different request is a 422.",
            json_schema_extra=IDEMPOTENCY_KEY_SCHEMA,
        )] = None,
        traceparent: Annotated[str | None, Header(
            description="W3C Trace Context (version 00, `" + TRACEPARENT_PATTERN + "`): the run's trace (when "
            "workers export traces) becomes a child of this span, whichever workers drive it. A malformed value "
            "is ignored, as the W3C specification requires of a receiver (the run gets a trace of its own); the "
            "answer then carries `Traceparent-Ignored` saying why.",
            json_schema_extra=_traceparent_schema,
        )] = None,
    ) -> RunCreated:
        """Queue a run. The next free worker claims it: higher `priority` first, not before `runAt` (or
        `delaySeconds` from now). Scope: `submit`; the run records who as `createdBy`."""
        key = checked_idempotency_key(idempotency_key)
        caller_span = _caller_span(traceparent, response)
        spec, source = body.spec(), await self.source(self.reads(request), body)
        tenant = tenant_for(request, body.tenant)
        self.submissions.check_webhook(spec.webhook, tenant=tenant or (source.tenant if source else DEFAULT_TENANT))

        caller = Caller(created_by=caller_name(request), idempotency_key=key, traceparent=caller_span, tenant=tenant)
        made = await self.submissions.submit(spec, source, caller)
        run, created, new = made.run, made.created, made.new
        if not created and spec.agent is not None and spec.agent[1] is None and run.agent == new.agent \
                and run.agent_version is not None and run.agent_version != new.agent_version:
            # A retry after the agent got a new version: the first request was made of the version it pinned.
            pinned = dataclasses.replace(spec, agent=(spec.agent[0], run.agent_version))
            new = await self.submissions.planned(pinned, source, caller)
        if not created:
            _check_replay(run, new, key)
            response.headers["Idempotent-Replayed"] = "true"
        response.headers["Location"] = f"/api/runs/{run.id}"
        # A new run is QUEUED when inserted, though a worker may have claimed it by the time it is read back.
        return RunCreated(id=run.id, status=RunStatus.QUEUED if created else run.status)

    async def list_runs(
        self,
        request: Request,
        status: Annotated[str | None, Query(
            description="Only runs in these statuses, any case, comma-separated: `status=running,waiting`.",
            max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Runs per page.")] = 50,
        after: Annotated[uuid.UUID | None, Query(
            description="The `next` cursor of the previous page: runs created before this one.")] = None,
        parent: Annotated[uuid.UUID | None, Query(
            description="Only runs whose `parentRunId` is this run: its sub-agents' runs, continuations and forks.")
        ] = None,
        label_selector: Annotated[str | None, Query(
            alias="labelSelector", max_length=MAX_SELECTOR_CHARS,
            description="Kubernetes' label selector, equality and set syntax: "
            "`team=billing,env!=prod,tier in (a,b),tier notin (c),key,!key`.")] = None,
        model: Annotated[str | None, Query(max_length=MAX_NAME_CHARS, description="Only runs of this model.")
                         ] = None,
        agent: Annotated[str | None, Query(max_length=MAX_NAME_CHARS, description="Only runs made from this "
                                           "agent: `name` (any version) or `name@version`.")] = None,
        created_by: Annotated[str | None, Query(alias="createdBy", max_length=MAX_NAME_CHARS,
                                                description="Only runs created by this identity.")] = None,
        created_after: Annotated[str | None, Query(
            alias="createdAfter", max_length=64, json_schema_extra={"format": "date-time"},
            description="Only runs created after this ISO 8601 time, with its offset: `2026-12-01T10:00:00Z`.")
        ] = None,
        created_before: Annotated[str | None, Query(
            alias="createdBefore", max_length=64, json_schema_extra={"format": "date-time"},
            description="Only runs created before this ISO 8601 time, with its offset.")] = None,
        q: Annotated[str | None, Query(max_length=MAX_NAME_CHARS,
                                       description="Only runs whose input contains this text, any case.")] = None,
        tenant: Annotated[str | None, Query(
            max_length=63, pattern=TENANT_PATTERN,
            description="Only runs of this tenant. An identity sees its own tenant's runs only, whatever it "
            "asks; a platform operator's (tenant `*`) sees every tenant's, and narrows them with this.")] = None,
        replays: Annotated[bool, Query(
            description="Include the runs of replays (POST /api/replays), left out by default.")] = False,
        replay_of: Annotated[uuid.UUID | None, Query(
            alias="replayOf", description="Only the replay runs of this recorded run (replays' runs included).")
        ] = None,
        replay_id: Annotated[uuid.UUID | None, Query(
            alias="replayId", description="Only the runs of this replay (replays' runs included).")] = None,
    ) -> RunPage:
        """Runs, newest first, a page at a time (keyset pagination: stable while runs are added).

        The answer is `{"items": [...], "next": "<uuid>" | null}`; to get the following page pass `next` as
        `after`, with the same filters. `next` is null on the last page. Every filter is optional and they
        combine (all must hold); a bad value is a 422 naming the parameter. The runs of replays are left out
        unless `replays=true` (or `replayOf` / `replayId` names them). Scope: `read`.
        """
        where = RunFilter(
            statuses=_statuses(status), selector=_selector(label_selector), model=_storable_query(model, "model"),
            **_agent_filter(agent), created_by=_storable_query(created_by, "createdBy"), parent=parent,
            created_after=_aware(created_after, "createdAfter"), created_before=_aware(created_before, "createdBefore"),
            text=_storable_query(q, "q"), tenant=tenant,
            # A replay's runs are tests of a change, not work: listed when asked for.
            replays=None if replays or replay_of or replay_id else False, replay_of=replay_of, replay_id=replay_id,
        )
        reads = self.reads(request)
        runs = await reads.list_runs(None, limit + 1, after, where=where)
        # A cursor naming no run yields an empty page; only then is it worth a query to tell the two apart.
        if after is not None and not runs and await reads.get(after) is None:
            problem = "names no run; pass the `next` of a previous page"
            raise ApiError(422, f"after: {problem}", [FieldProblem(field="after", problem=problem)])
        page = runs[:limit]
        return RunPage(items=[RunSummary.of(r, self.prices) for r in page],
                       next=page[-1].id if len(runs) > limit else None)

    async def get(self, run_id: RunId, request: Request) -> RunView:
        """A run: status, input, model, budgets, tokens and cost so far, error, times, the holding worker,
        who created it and who cancelled it. Scope: `read`."""
        return RunView.of(await self.get_run(self.reads(request), run_id), self.prices)

    async def children(self, run_id: RunId, request: Request) -> list[RunView]:
        """The runs the run's sub-agent calls started, in the order of the calls (empty when none). Each
        has `parentRunId` (this run), `parentToolUseId` (the call) and its own totals. Scope: `read`."""
        children = await self.reads(request).children(run_id)
        if children is None:
            raise _not_found(run_id)
        return [RunView.of(c, self.prices) for c in children]

    async def timeline(self, run_id: RunId, request: Request) -> list[TimelineStep]:
        """The run's steps in seq order, without their request and response bodies. Scope: `read`."""
        reads = self.reads(request)
        steps = await reads.timeline(run_id)
        if steps is None:
            raise _not_found(run_id)
        by_call: dict[str, list[PendingCall]] = {}
        for call in await reads.decisions(run_id) or []:
            by_call.setdefault(call.tool_use_id, []).append(call)
        rows = [TimelineStep.of(s) for s in steps]
        for i, s in enumerate(steps):
            if s.tool_use_id in by_call:
                rows[i] = rows[i].model_copy(update={
                    "decisions": [DecisionView.of(c) for c in by_call.pop(s.tool_use_id)]
                })
        # Calls that wait for a person and have no step yet (approvals not given) follow the steps; those of
        # a run that has ended (cancelled or timed out while it waited) will never be made: ABANDONED.
        if by_call:
            ended = (await self.get_run(reads, run_id)).status.terminal
            rows.extend(TimelineStep.waiting(c[-1], c, abandoned=ended) for c in by_call.values())
        return rows

    async def webhooks(self, run_id: RunId, request: Request) -> list[WebhookDeliveryView]:
        """The run's webhook deliveries, oldest first, each with every attempt (status code, latency, error)
        and its state: PENDING (retried with backoff), DELIVERED, or FAILED (given up). Scope: `read`."""
        found = await self.reads(request).webhooks_of(run_id)
        if found is None:
            raise _not_found(run_id)
        return [WebhookDeliveryView.of(d) for d in found]

    async def pending(self, run_id: RunId, request: Request) -> list[PendingView]:
        """The tool calls waiting for a person's decision, oldest first (empty when none); for a run that
        waits for its sub-agents, one entry (kind `children`) per child run not finished yet, in call order;
        for a run that waits for a timer or an event, that wait (kind `timer` with `wakeAt`, kind `event`
        with `key` and `timeoutAt`). Scope: `read`."""
        reads = self.reads(request)
        run = await self.get_run(reads, run_id)
        if run.status is not RunStatus.WAITING:
            return []
        if run.waiting_for == "children":
            return [PendingView.of_child(c) for c in await reads.children(run_id) or [] if not c.status.terminal]
        if run.waiting_for in ("timer", "event"):
            wait = await reads.pending_wait(run_id)
            return [] if wait is None else [PendingView.of_wait(wait, await reads.steps(run_id) or [])]
        return [PendingView.of(c) for c in await reads.decisions(run_id) or [] if c.decision is None]

    async def decide(
        self, run_id: RunId, body: DecisionRequest, request: Request,
        tool_use_id: Annotated[str, Path(alias="toolUseId", max_length=MAX_NAME_CHARS,
                                         description="The pending call's tool_use id.")],
    ) -> RunView:
        """Decide a pending call, exactly once: `approve` or `deny` an approval; `retry`, `record` (with
        `output`, optionally `isError`) or `fail` a call in doubt. When the last open call is decided the
        run is queued again and a worker resumes it. Scope: `decide`; recorded as `decidedBy`."""
        if body.decision is Decision.RECORD and body.output is None:
            problem = "is required with the decision record: what the call returned"
            raise ApiError(422, f"output {problem}", [FieldProblem(field="output", problem=problem)])
        reads = self.reads(request)
        await self._not_a_child_call(reads, run_id, tool_use_id)
        before = await reads.decisions(run_id) or []
        outcome, run = await self.store.decide(
            run_id, tool_use_id, body.decision, output=body.output, is_error=body.is_error, reason=body.reason,
            by=caller_name(request),
        )
        _check_decided(outcome, run_id, tool_use_id, body.decision, before)
        assert run is not None
        if self.metrics is not None:
            since = min((c.since for c in before if c.decision is None), default=None)
            waited = None
            if run.status is not RunStatus.WAITING and since is not None:
                waited = max((datetime.datetime.now(datetime.UTC) - since).total_seconds(), 0.0)
            self.metrics.decided(body.decision.kind.value, body.decision.value, waited)
        return RunView.of(run, self.prices)

    async def _not_a_child_call(self, reads: ScopedReads, run_id: uuid.UUID, tool_use_id: str) -> None:
        """A 409 for a decision on a sub-agent call, or on any call of a run that waits for its sub-agents:
        such a run goes on when its children finish, and no decision is asked of anyone."""
        run = await self.get_run(reads, run_id)
        waits = run.status is RunStatus.WAITING and run.waiting_for == "children"
        if waits or run.sub_agents:  # only a run with sub-agents has calls that started one
            calls = {c.parent_tool_use_id: c for c in await reads.children(run_id) or []}
            if tool_use_id in calls:
                raise ApiError(409, f"call {tool_use_id} of run {run_id} started the sub-agent run "
                               f"{calls[tool_use_id].id}: it takes no decision, the run goes on when that run ends")
            if waits:
                raise ApiError(409, f"run {run_id} waits for its sub-agents, not for a decision")

    async def step(
        self, run_id: RunId, seq: Annotated[int, Path(ge=1, le=MAX_SEQ, description="The step's seq (from 1).")],
        request: Request,
    ) -> StepDetail:
        """One step with its request and response bodies, for debugging. Scope: `read`."""
        reads = self.reads(request)
        found = await reads.step(run_id, seq)
        if found is None:
            await self.get_run(reads, run_id)
            raise ApiError(404, f"run {run_id} has no step {seq}")
        detail = StepDetail.of(found)
        if found.kind is StepKind.MODEL:
            detail = detail.model_copy(update={"sent": await self.sent(reads, run_id, seq)})
        if found.kind is StepKind.TOOL and found.tool_use_id is not None:  # its decisions, as the timeline shows
            decided = [DecisionView.of(c) for c in await reads.decisions(run_id) or []
                       if c.tool_use_id == found.tool_use_id]
            detail = detail.model_copy(update={"decisions": decided})
        return detail

    async def sent(self, reads: ScopedReads, run_id: uuid.UUID, seq: int) -> dict[str, Any] | None:
        """A MODEL step's request as it was sent: the conversation rebuilt by replay of the steps before it, as
        the engine rebuilds it, with the system prompt and the tool definitions the engine adds (this server's
        tool box and the run's pinned sub-agents)."""
        run = await reads.get(run_id)
        if run is None:
            return None
        conv = Conversation.replay(run.input, await reads.steps_before(run_id, seq) or [])
        agents = []
        for name, version in sub_agents.refs_by_tool(run.sub_agents).values():
            agent = await self.store.agent(name, version, deleted=True, tenant=run.tenant)
            if agent is not None:
                agents.append(sub_agents.definition(agent.name, agent.version, agent.description))
        return {"system": system_sent(run.system, run.output_schema),
                "tools": tools_sent(self.tools.definitions(run.tools), agents, run.output_schema),
                "messages": list(conv.messages)}

    async def message(self, run_id: RunId, body: MessageRequest, request: Request) -> MessageView:
        """Send a message to a run while it works. It is stored at once (202) and delivered to the model as a
        user turn at the run's next turn boundary: after the model's current turn and all its tool calls,
        before its next call; a WAITING run gets it when it resumes. Messages are delivered in the order
        received, each as a USER step of the timeline with `createdBy`. A run that has finished (or was asked
        to stop) takes none: a 409; go on with its conversation in a new run with `continueFrom`. A run that
        ends by its guard (budget, deadline, step cap) before the next boundary does not deliver it (`seq`
        stays null); one never succeeds with a message undelivered. Scope: `submit`; recorded as `createdBy`."""
        if not await self.reads(request).sees(run_id):
            raise _not_found(run_id)
        message, status = await self.store.post_message(run_id, body.text, caller_name(request))
        if status is None:
            raise _not_found(run_id)
        if message is None:
            why = f"has already finished: {status.value}" if status.terminal else "was asked to stop"
            raise ApiError(409, f"run {run_id} {why}; to go on with its conversation, submit a new run with "
                           f'"continueFrom": "{run_id}" and your message as its input')
        return MessageView.of(message)

    async def messages(self, run_id: RunId, request: Request) -> list[MessageView]:
        """The messages posted to the run, in the order received; `seq` is null for those not delivered yet.
        Scope: `read`."""
        found = await self.reads(request).messages(run_id)
        if found is None:
            raise _not_found(run_id)
        return [MessageView.of(m) for m in found]

    async def cancel(self, run_id: RunId, request: Request) -> RunView:
        """Ask a run to stop: a queued run is CANCELLED at once, a running one at its next step boundary.

        Scope: `cancel`. The first caller to ask is recorded as `cancelledBy`."""
        before = await self.get_run(self.reads(request), run_id)
        if before.status.terminal:
            raise ApiError(409, f"run {run_id} has already finished: {before.status.value}")
        after = await self.store.cancel(run_id, by=caller_name(request))
        if after is None:
            raise _not_found(run_id)
        if after.status.terminal and not after.cancel_requested:  # it finished in between
            raise ApiError(409, f"run {run_id} has already finished: {after.status.value}")
        return RunView.of(after, self.prices)


def _statuses(text: str | None) -> tuple[RunStatus, ...] | None:
    """`running,Waiting`: the statuses named, any case; a name that is no status is a 422 listing them."""
    if text is None or not text.strip():
        return None
    known = {s.value: s for s in RunStatus}
    found = []
    for part in text.split(","):
        status = known.get(part.strip().upper())
        if status is None:
            raise field_error("status", f"{part.strip()!r} is no status; one or more of {', '.join(known)}, "
                             "comma-separated, any case")
        found.append(status)
    return tuple(dict.fromkeys(found))


def _selector(text: str | None) -> Selector | None:
    if text is None:
        return None
    try:
        return parse_selector(text)
    except ValueError as e:
        raise field_error("labelSelector", str(e)) from None


def _agent_filter(text: str | None) -> dict[str, Any]:
    """`name` (any version) or `name@version`, as the run's agent and agentVersion."""
    if text is None:
        return {}
    try:
        name, version = parse_ref(text)
    except Refused as e:
        raise refusal(e) from None
    return {"agent": name, "agent_version": version}


def _aware(text: str | None, name: str) -> datetime.datetime | None:
    """An ISO 8601 time with its offset: one without names no instant (UTC is only a guess of what was meant)."""
    if text is None:
        return None
    try:
        return rfc3339(text)
    except ValueError as e:
        raise field_error(name, str(e)) from None


def _storable_query(text: str | None, name: str) -> str | None:
    if text is not None and (why := unstorable(text)) is not None:
        raise field_error(name, why)
    return text


def _caller_span(traceparent: str | None, response: Response) -> str | None:
    try:
        return checked_traceparent(traceparent)
    except ValueError as e:
        # A tracing header a proxy mangled must not cost the caller its run: W3C receivers ignore it.
        response.headers["Traceparent-Ignored"] = f"traceparent {e}"
        return None


def _check_replay(run: Run, new: NewRun, key: str | None) -> None:
    """An existing run found for `new`: a retry with its idempotency key, or a 409 or 422 saying why not."""
    if key is None or run.idempotency_key != key:  # a random id never collides in practice
        raise ApiError(409, "a run with this id already exists")
    if not _same_request(run, new):
        problem = "was already used for a different request"
        raise ApiError(422, f"Idempotency-Key {problem}", [FieldProblem(field="Idempotency-Key", problem=problem)])


def _check_decided(
    outcome: DecideOutcome, run_id: uuid.UUID, tool_use_id: str, decision: Decision, before: list[PendingCall]
) -> None:
    """A decision the store did not take, as the error the API answers it with."""
    if outcome is DecideOutcome.NO_RUN:
        raise _not_found(run_id)
    if outcome is DecideOutcome.NO_CALL:
        raise ApiError(404, f"run {run_id} has no pending call {tool_use_id!r}")
    if outcome is DecideOutcome.WRONG_KIND:
        kinds = {c.kind.value for c in before if c.tool_use_id == tool_use_id}
        fits = "approve or deny" if "approval" in kinds else "retry, record or fail"
        raise ApiError(409, f"{decision.value} does not fit call {tool_use_id}: it needs {fits}")
    if outcome is DecideOutcome.ALREADY:
        raise ApiError(409, f"call {tool_use_id} of run {run_id} was already decided")


SUBMIT_ERRORS: Responses = {
    400: {"model": ErrorBody, "description": "The body is not JSON at all, or over the size limit"},
    404: {"model": ErrorBody, "description": "No run to continue or fork, or no agent (or version of it) named "
          "by `agent` or `subAgents`: `fields` names which"},
    429: {"model": QuotaErrorBody, "description": "The tenant's quota refuses a new run: its queued runs are at "
          "`maxQueued`, or its tokens or cost over the last 1,440 minutes at `tokensPerDay` or `costPerDayUsd`. "
          "`quota` names it; `Retry-After` says when to ask again. A retry of a run made already returns it.",
          "headers": {"Retry-After": {"description": "Seconds to wait before asking again",
                                      "schema": {"type": "integer"}}}},
}
DECIDE_ERRORS: Responses = {
    409: {"model": ErrorBody, "description": "The decision does not fit the call's kind, or the call was already "
          "decided, or the run waits for its sub-agents (a sub-agent call takes no decision)"},
    400: {"model": ErrorBody, "description": "The body is not JSON at all"},
}
CANCEL_ERRORS: Responses = {409: {"model": ErrorBody, "description": "The run has already finished"}}
MESSAGE_ERRORS: Responses = {
    409: {"model": ErrorBody, "description": "The run has finished (or was asked to stop): continue its "
          "conversation with a new run whose `continueFrom` names it"},
    400: {"model": ErrorBody, "description": "The body is not JSON, or over the size limit"},
}


def runs_router(
    store: RunStore, tools: ToolBox, settings: WorkerSettings, prices: PriceTable, identities: Identities | None = None,
    metrics: Metrics | None = None, providers: Providers | None = None,
) -> APIRouter:
    routes = RunRoutes(store, Submissions(store, tools, settings, prices, providers or Providers()), metrics)
    # ScopedRoute (OrjsonRoute's base) enforces each route's scope before any parsing; `access` declares it.
    secured = identities.enabled if identities is not None else bool(settings.api_token or settings.api_tokens_file)
    router = APIRouter(
        prefix="/api/runs", tags=["runs"], route_class=OrjsonRoute,
        responses=documented_errors(secured),
    )
    read = access(Scope.READ, secured)
    router.post("", status_code=201, response_model=RunCreated, **access(Scope.SUBMIT, secured),
                responses=SUBMIT_ERRORS)(routes.submit)
    router.get("", response_model=RunPage, **read)(routes.list_runs)
    router.get("/{id}", response_model=RunView, **read)(routes.get)
    router.get("/{id}/timeline", response_model=list[TimelineStep], **read)(routes.timeline)
    router.get("/{id}/children", response_model=list[RunView], **read)(routes.children)
    router.get("/{id}/pending", response_model=list[PendingView], **read)(routes.pending)
    router.get("/{id}/webhooks", response_model=list[WebhookDeliveryView], **read)(routes.webhooks)
    router.post("/{id}/pending/{toolUseId}", response_model=RunView, **access(Scope.DECIDE, secured),
                responses=DECIDE_ERRORS)(routes.decide)
    router.get("/{id}/steps/{seq}", response_model=StepDetail, **read)(routes.step)
    router.post("/{id}/messages", status_code=202, response_model=MessageView, **access(Scope.SUBMIT, secured),
                responses=MESSAGE_ERRORS)(routes.message)
    router.get("/{id}/messages", response_model=list[MessageView], **read)(routes.messages)
    router.post("/{id}/cancel", status_code=202, response_model=RunView, **access(Scope.CANCEL, secured),
                responses=CANCEL_ERRORS)(routes.cancel)
    return router
