"""The kopf handlers of AgentSchedule resources: the spec is stored as the schedule of the resource's name
(the workers' tickers create its runs), its status shows the last and next tick and the active runs, and
deleting the resource deletes the schedule.

Schedule names are one per database, AgentSchedules are namespaced: the namespace of the AgentSchedule that
stored a schedule owns the name (`k8s_namespace` of the row). One of the same name in another namespace, or
over a schedule made through the REST API, is refused in its status and its deletion leaves it alone.

A spec is untrusted: every way it can be wrong (a cron expression or time zone cron cannot read, a run
template the submission policy refuses, a text PostgreSQL cannot hold anywhere in spec.run, a template too
big) ends as a status message, never as an exception kopf would retry for ever.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import kopf
import orjson

from agentrun.operator import mapping
from agentrun.worker.core.errors import Refused
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.schedules import (
    DEFAULT_STARTING_DEADLINE_SECONDS,
    MAX_INTERVAL_SECONDS,
    MAX_STARTING_DEADLINE_SECONDS,
    ConcurrencyPolicy,
    Schedule,
    cron_problem,
    name_problem,
    spec_json,
    spec_of,
    template_problems,
    timezone_problem,
)
from agentrun.worker.core.text import unstorable
from agentrun.worker.store import RunStore

log = logging.getLogger("agentrun.operator.schedules")

PLURAL = "agentschedules"
KIND = "AgentSchedule"
MAX_TEMPLATE_BYTES = 256 * 1024
"""The most spec.run may hold, as JSON: a run template, not a data store."""
MAX_DEPTH = 32

T = TypeVar("T")
Guarded = Callable[[Callable[[RunStore], Awaitable[T]], str, int], Awaitable[T]]


def _json_problem(value: Any, where: str, depth: int = 0) -> str | None:
    """The first text in `value` (keys too) PostgreSQL cannot hold, or a nesting too deep, as a message."""
    if depth > MAX_DEPTH:
        return f"{where} nests deeper than {MAX_DEPTH} levels"
    if isinstance(value, str):
        return f"{where} {why}" if (why := unstorable(value)) is not None else None
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str) and (why := unstorable(k)) is not None:
                return f"{where}: a key {why}"
            if (found := _json_problem(v, f"{where}.{k}"[:200], depth + 1)) is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if (found := _json_problem(v, f"{where}[{i}]"[:200], depth + 1)) is not None:
                return found
    return None


def schedule_definition(name: str, namespace: str, spec: Mapping[str, Any]) -> Schedule:
    """The schedule an AgentSchedule's spec is; raises InvalidSpec naming what is wrong (checked again here
    for what the CRD schema says, for objects that reached us without it)."""
    if (why := name_problem(name)) is not None:
        raise mapping.InvalidSpec(f"metadata.name {why}")
    cron, interval = spec.get("cron"), spec.get("intervalSeconds")
    if (cron is None) == (interval is None):
        raise mapping.InvalidSpec("spec: exactly one of cron and intervalSeconds is required")
    if cron is not None:
        if not isinstance(cron, str):
            raise mapping.InvalidSpec("spec.cron must be a string")
        if (why := cron_problem(cron)) is not None:
            raise mapping.InvalidSpec(f"spec.cron {why}")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int)
                                 or not 1 <= interval <= MAX_INTERVAL_SECONDS):
        raise mapping.InvalidSpec(f"spec.intervalSeconds must be an integer from 1 to {MAX_INTERVAL_SECONDS}")
    tz = spec.get("timezone", "UTC")
    if not isinstance(tz, str) or (why := timezone_problem(tz)) is not None:
        raise mapping.InvalidSpec(f"spec.timezone {why if isinstance(tz, str) else 'must be a string'}")
    policy = spec.get("concurrencyPolicy", "Allow")
    if policy not in {p.value for p in ConcurrencyPolicy}:
        raise mapping.InvalidSpec("spec.concurrencyPolicy must be Allow, Forbid or Replace")
    deadline = spec.get("startingDeadlineSeconds", DEFAULT_STARTING_DEADLINE_SECONDS)
    if isinstance(deadline, bool) or not isinstance(deadline, int) \
            or not 0 <= deadline <= MAX_STARTING_DEADLINE_SECONDS:
        raise mapping.InvalidSpec(f"spec.startingDeadlineSeconds must be an integer from 0 to "
                                  f"{MAX_STARTING_DEADLINE_SECONDS}")
    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        raise mapping.InvalidSpec("spec.suspend must be true or false")
    run = spec.get("run")
    if not isinstance(run, Mapping):
        raise mapping.InvalidSpec("spec.run must be an object: the run each tick starts")
    if (why := _json_problem(run, "spec.run")) is not None:
        raise mapping.InvalidSpec(why)
    try:
        size = len(orjson.dumps(run))
    except (TypeError, orjson.JSONEncodeError) as e:
        raise mapping.InvalidSpec(f"spec.run cannot be stored as JSON: {e}") from None
    if size > MAX_TEMPLATE_BYTES:
        raise mapping.InvalidSpec(f"spec.run is {size} bytes of JSON; at most {MAX_TEMPLATE_BYTES}")
    for field in ("continueFrom", "forkFrom", "runAt", "delaySeconds"):
        if field in run:
            raise mapping.InvalidSpec(f"spec.run.{field}: a schedule's run starts at its tick, fresh: leave it out")
    try:
        run_spec = mapping.run_spec(run, None)
    except mapping.InvalidSpec as e:
        raise mapping.InvalidSpec(str(e).replace("spec.", "spec.run.", 1)) from None
    if unfit := template_problems(run_spec):
        raise mapping.InvalidSpec("spec." + "; spec.".join(f"{f}: {p}" for f, p in unfit))
    return Schedule(
        name=name, cron=cron, interval_seconds=interval, timezone=tz, run=dict(run), spec=spec_json(run_spec),
        concurrency_policy=ConcurrencyPolicy(policy), starting_deadline_seconds=deadline, suspend=suspend,
        k8s_namespace=namespace, k8s_name=name,
    )


def timing(s: Schedule) -> str:
    return f"{s.cron} ({s.timezone})" if s.cron is not None else f"every {s.interval_seconds}s"


def schedule_status(s: Schedule, generation: int | None, previous: Mapping[str, Any] | None,
                    now: datetime.datetime) -> dict[str, Any]:
    message = s.last_error or ("suspended" if s.suspend else "stored; the workers tick it")
    status: dict[str, Any] = {
        "schedule": timing(s), "active": s.active, "message": message,
        "lastScheduleTime": mapping.timestamp(s.last_schedule_time) if s.last_schedule_time else None,
        "nextScheduleTime": mapping.timestamp(s.next_due_at) if s.next_due_at else None,
    }
    if generation is not None:
        status["observedGeneration"] = generation
    ready = ("Ready", "True", "Stored", "stored") if s.last_error is None else ("Ready", "True", "TickFailed", message)
    status["conditions"] = mapping.conditions([ready], generation, previous, now)
    return status


def refused_status(reason: str, message: str, generation: int | None, previous: Mapping[str, Any] | None,
                   now: datetime.datetime) -> dict[str, Any]:
    status: dict[str, Any] = {"message": message[:2000]}
    if generation is not None:
        status["observedGeneration"] = generation
    status["conditions"] = mapping.conditions([("Ready", "False", reason, message[:2000])], generation, previous, now)
    return status


class Schedules:
    """AgentSchedule resources ⇄ the schedule table, through the store."""

    def __init__(self, known_tools: frozenset[str] | None, prices: PriceTable, guarded: Guarded[Any],
                 tenant_of: Callable[[str], str] = lambda namespace: namespace) -> None:
        self.known_tools, self.prices, self.guarded = known_tools, prices, guarded
        self.tenant_of = tenant_of  # a namespace's tenant, whose schedule an AgentSchedule of it is

    async def reconcile(self, body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int) -> None:
        """Store the spec as the schedule (replacing its definition) and show it."""
        meta = body.get("metadata") or {}
        namespace, name, generation = meta.get("namespace") or "", meta["name"], meta.get("generation")
        previous = dict(body.get("status") or {})
        now = datetime.datetime.now(datetime.UTC)

        def refuse(reason: str, message: str) -> None:
            log.warning("schedule %s/%s not stored: %s", namespace, name, message[:500])
            patch.status.update(mapping.status_patch(previous, refused_status(reason, message, generation, previous,
                                                                               now)))

        tenant = self.tenant_of(namespace)
        try:
            s = dataclasses.replace(schedule_definition(name, namespace, spec), tenant=tenant)
        except mapping.InvalidSpec as e:
            return refuse("InvalidSpec", str(e))
        existing: Schedule | None = await self.guarded(lambda st: st.schedule(name, tenant), "read the schedule",
                                                       retry)
        if existing is not None and existing.k8s_namespace != namespace:
            owner = f"the AgentSchedule in namespace {existing.k8s_namespace!r}" if existing.k8s_namespace else \
                "the REST API"
            return refuse("NameConflict", f"the schedule name {name!r} is taken by {owner} (schedule names are one "
                          f"per tenant, and this is tenant {tenant!r}): rename this one, or delete that one first")
        try:
            asked = spec_of(s.spec)
            resolved = await self.guarded(lambda st: st.for_run(asked, tenant), "check the run template", retry)
            mapping.new_run(s.run, str(uuid.uuid4()), namespace, name, self.known_tools, self.prices,
                            resolved=resolved)
        except Refused as e:
            return refuse("InvalidSpec", f"spec.run.{e.message}")
        except mapping.InvalidSpec as e:
            return refuse("InvalidSpec", str(e).replace("spec.", "spec.run.", 1))
        by = mapping.agent_creator(body)
        try:
            stored, _ = await self.guarded(lambda st: st.create_schedule(s, created_by=by, replace=True),
                                           "store the schedule", retry)
        except ValueError as e:
            return refuse("InvalidSpec", f"spec: {e}")
        log.info("schedule %s/%s stored: %s", namespace, name, timing(stored))
        patch.status.update(mapping.status_patch(previous, schedule_status(stored, generation, previous, now)))

    async def refresh(self, body: kopf.Body, patch: kopf.Patch, retry: int) -> None:
        """Show the schedule's last and next tick and its active runs (a timer calls this)."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta["name"]
        previous = dict(body.get("status") or {})
        if previous.get("observedGeneration") != meta.get("generation"):
            return  # its spec is being stored (or was refused): that handler writes the status
        tenant = self.tenant_of(namespace)
        found: Schedule | None = await self.guarded(lambda st: st.schedule(name, tenant), "read the schedule", retry)
        if found is None or found.k8s_namespace != namespace:
            return
        now = datetime.datetime.now(datetime.UTC)
        status = schedule_status(found, meta.get("generation"), previous, now)
        if any(previous.get(k) != v for k, v in status.items() if k != "conditions") or \
                [(c.get("status"), c.get("reason")) for c in previous.get("conditions") or []] != \
                [(c.get("status"), c.get("reason")) for c in status["conditions"]]:
            patch.status.update(mapping.status_patch(previous, status))

    async def deleted(self, body: kopf.Body, retry: int) -> None:
        """Delete the schedule if this AgentSchedule stored it (not another namespace's, nor the REST API's)."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta["name"]
        tenant = self.tenant_of(namespace)
        found: Schedule | None = await self.guarded(lambda st: st.schedule(name, tenant), "read the schedule", retry)
        if found is None or found.k8s_namespace != namespace:
            return
        await self.guarded(lambda st: st.delete_schedule(name, tenant), "delete the schedule", retry)
        log.info("schedule %s/%s deleted", namespace, name)
