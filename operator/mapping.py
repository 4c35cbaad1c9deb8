"""AgentRun ⇄ run: the spec as a NewRun, and a run row as the resource's status; Agent ⇄ agent
definition and its status. Pure, no I/O."""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, TypedDict

import orjson

from agentrun.operator.errors import InvalidSpec as InvalidSpec
from agentrun.worker.core import submission
from agentrun.worker.core.agents import AGENT_NAME, MAX_VERSION, Agent, check_definition, parse_ref, planned
from agentrun.worker.core.context import parse
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import NewRun, Origin, PendingCall, Run, RunStatus
from agentrun.worker.core.submission import Caller, Defaults, Offer, Refused, RunSpec
from agentrun.worker.core.text import unstorable
from agentrun.worker.core.waits import BUILTIN_WAITS
from agentrun.worker.core.webhooks import Allow, check_webhook
from agentrun.worker.obs.tracing.context import TRACEPARENT_ANNOTATION, checked_traceparent

GROUP = "agentrun.dev"
VERSION = "v1alpha1"
PLURAL = "agentruns"
KIND = "AgentRun"
AGENT_PLURAL = "agents"
AGENT_KIND = "Agent"

# What an AgentRun gets for a field that neither its spec, nor its agent (spec.agentRef), nor its source
# (continueFrom, forkFrom) gives: the submission policy's, as for the REST API. Not the CRD schema's
# defaults: the API server would put them in every spec, overriding the agent's and the source's values.
DEFAULT_MODEL = submission.DEFAULT_MODEL
DEFAULT_TOKEN_BUDGET = submission.DEFAULT_TOKEN_BUDGET
DEFAULT_TIMEOUT_SECONDS = submission.DEFAULT_TIMEOUT_SECONDS
DEFAULT_MAX_STEPS = submission.DEFAULT_MAX_STEPS

Resolved = tuple[RunSpec, Agent | None, tuple[str, ...] | None]
"""A RunSpec with its agent applied, the agent, and the sub-agents pinned (`RunStore.for_run`)."""

PHASES: dict[RunStatus, str] = {
    RunStatus.QUEUED: "Queued",
    RunStatus.RUNNING: "Running",
    RunStatus.WAITING: "Waiting",
    RunStatus.SUCCEEDED: "Succeeded",
    RunStatus.FAILED: "Failed",
    RunStatus.CANCELLED: "Cancelled",
    RunStatus.TIMED_OUT: "TimedOut",
}
PENDING = "Pending"

# What the run table's columns hold (migrations/0001): BIGINT, INT, NUMERIC(14, 6).
BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
MICRO_DOLLAR = Decimal("0.000001")
COST_LIMIT = Decimal(10**8)
FINISHED_PHASES = frozenset(phase for status, phase in PHASES.items() if status.terminal)
# How Kubernetes writes times: RFC 3339 in UTC, to the second.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class Condition(TypedDict, total=False):
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    lastTransitionTime: str
    observedGeneration: int


@dataclasses.dataclass(frozen=True)
class Ref:
    """What the operator remembers of an AgentRun (kopf's index keeps one per uid)."""

    uid: uuid.UUID
    namespace: str
    name: str
    generation: int | None
    status: Mapping[str, Any]
    ttl_seconds: int | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Ref:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        ttl = spec.get("ttlSecondsAfterFinished")
        return cls(
            uuid.UUID(meta["uid"]), meta.get("namespace") or "", meta["name"], meta.get("generation"),
            dict(body.get("status") or {}), ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None,
        )


def new_run(
    spec: Mapping[str, Any],
    uid: str,
    namespace: str,
    name: str,
    known_tools: Collection[str] | None = None,
    prices: PriceTable | None = None,
    source: Run | None = None,
    annotations: Mapping[str, str] | None = None,
    resolved: Resolved | None = None,
    labels: Mapping[str, str] | None = None,
) -> NewRun:
    """The run an AgentRun asks for, made by the submission policy the REST API uses too; raises
    InvalidSpec naming what is wrong.

    `known_tools` is what the workers offer; None skips the check (the operator was not told).
    `prices` is the workers' price table: a cost budget on a model it does not price is refused.
    `source` is the run of the AgentRun named by `spec.continueFrom` or `spec.forkFrom`, looked up; a
    continuation or fork takes what its spec leaves out from it, as through the API.
    The `agentrun.dev/traceparent` annotation, if any, makes the run's trace a child of that span.
    `resolved` is `run_spec(spec, source)` with spec.agentRef applied by the store (`RunStore.for_run`,
    as for the REST API): the spec, the agent version it names and the sub-agents pinned; the run keeps
    `agent` and `agent_version`.
    `labels` are the AgentRun's `metadata.labels` (Kubernetes checked their syntax): the run's labels mirror
    them, so the runs list finds it by the selector kubectl does; an AgentRun without any that continues or
    forks another keeps its source's.
    """
    try:
        if resolved is None:
            resolved = run_spec(spec, source), None, None
        return planned(resolved, source, Origin.OPERATOR, caller(uid, namespace, name, annotations, labels), Defaults(),
                       offer(known_tools, prices))
    except Refused as e:
        raise InvalidSpec(refusal_message(e, known_tools)) from None


def caller(
    uid: str, namespace: str, name: str, annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None, created_by: str | None = None, tenant: str | None = None,
) -> Caller:
    """What an AgentRun attaches to its run: its uid as the run's id (a retry finds the run), its namespace and
    name, the trace of its `agentrun.dev/traceparent` annotation, its labels (when it has any), who made it,
    and its tenant (its namespace's, OperatorSettings.tenant_of; a continuation or fork its source's: None).
    Raises InvalidSpec for a malformed annotation."""
    return Caller(id=uuid.UUID(uid), k8s_namespace=namespace, k8s_name=name, traceparent=_traceparent(annotations),
                  labels=dict(labels) if labels else None, created_by=created_by, tenant=tenant)


def offer(known_tools: Collection[str] | None, prices: PriceTable | None) -> Offer:
    """What the workers can run, as far as the operator was told. The built-in tools (`wait`, `wait_for_event`)
    are every worker's, whatever it was told."""
    return Offer(has_tool=(lambda name: name in known_tools or name in BUILTIN_WAITS) if known_tools is not None
                 else None, tool_names=sorted(known_tools or ()), prices=prices)


def agent_ref(spec: Mapping[str, Any]) -> tuple[str, int | None] | None:
    """spec.agentRef as (name, version or None for the latest), checked as the CRD checks it."""
    ref = spec.get("agentRef")
    if ref is None:
        return None
    name = ref.get("name") if isinstance(ref, Mapping) else None
    if not isinstance(name, str) or not re.fullmatch(AGENT_NAME, name):
        raise InvalidSpec(f"spec.agentRef.name must be an agent's name (a DNS label), got {str(name)[:80]!r}")
    version = ref.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or not 0 < version <= MAX_VERSION):
        raise InvalidSpec(f"spec.agentRef.version must be a positive integer, got {str(version)[:40]}")
    return name, version


def run_spec(spec: Mapping[str, Any], source: Run | None) -> RunSpec:
    """The spec's fields typed and bounded as the run table holds them (what the CRD schema cannot say,
    checked again for objects that reached us without it); what it leaves out is None."""
    tools, approval = _names(spec, "tools"), _names(spec, "requireApproval")
    texts = [("input", _text(spec, "input", blank=False)), ("system", _text(spec, "system")),
             ("model", _text(spec, "model", blank=False)), *((f"tools[{i}]", t) for i, t in enumerate(tools or ()))]
    # The CRD cannot express these; refused here, a NUL would fail every INSERT and kopf retry for ever.
    for field, value in texts:
        if value is not None and (why := unstorable(value)):
            raise InvalidSpec(f"spec.{field} {why}")
    schema = spec.get("outputSchema")
    return RunSpec(
        input=texts[0][1], system=texts[1][1], model=texts[2][1],
        token_budget=_positive_int(spec, "tokenBudget", BIGINT_MAX),
        timeout_seconds=_positive_int(spec, "timeoutSeconds", INT_MAX),
        max_steps=_positive_int(spec, "maxSteps", INT_MAX),
        tools=tools, cost_budget_usd=_cost_budget(spec), require_approval=approval,
        output_schema=dict(schema) if isinstance(schema, Mapping) else schema,
        agent=agent_ref(spec), **_lineage(spec, source), **_schedule(spec), webhook=_webhook(spec),
        context_management=_context_management(spec),
    )


def _context_management(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """spec.contextManagement as the run stores it (core/context.parse, as the REST API checks it)."""
    value = spec.get("contextManagement")
    if value is None:
        return None
    try:
        return parse(dict(value) if isinstance(value, Mapping) else value, "spec.contextManagement").to_json()
    except ValueError as e:
        raise InvalidSpec(str(e)) from None


def _webhook(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """spec.webhook as the run stores it, under the URL policy the REST API applies (AGENTRUN_WEBHOOK_ALLOW
    of the operator's environment). Whether its secretRef is configured is the workers' to say: a delivery
    whose secret they lack is a failed attempt naming it (GET /api/runs/{id}/webhooks)."""
    value = spec.get("webhook")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidSpec("spec.webhook must be an object {url, events, secretRef}")
    try:
        return check_webhook(dict(value), None, Allow.parse(os.environ.get("AGENTRUN_WEBHOOK_ALLOW", "")))
    except ValueError as e:  # WebhookProblem names the field
        raise InvalidSpec(f"spec.{e}") from None


def refusal_message(e: Refused, known_tools: Collection[str] | None = None) -> str:
    """A refusal of the policy, naming the fields as the spec has them; unknown tools in one phrase."""
    if not e.problems:
        return f"spec.{e.message}"
    # The REST body's `agent` is the spec's agentRef.
    e = Refused(e.kind, e.message, [dataclasses.replace(p, field="agentRef") if p.field == "agent" else p
                                    for p in e.problems])
    unknown = {field: sorted({p.unknown_tool for p in e.problems if p.unknown_tool and p.field.startswith(field)})
               for field in ("tools", "requireApproval")}
    offered = ", ".join(sorted(known_tools or ())) or "none"
    return "; ".join([
        *([f"unknown tools: {', '.join(unknown['tools'])} (the workers offer: {offered})"] if unknown["tools"] else []),
        *([f"spec.requireApproval names unknown tools: {', '.join(unknown['requireApproval'])}"]
          if unknown["requireApproval"] else []),
        *(f"spec.{p.field} {p.problem}" for p in e.problems if p.unknown_tool is None),
    ])


def _text(spec: Mapping[str, Any], field: str, blank: bool = True) -> str | None:
    value = spec.get(field)
    if value is not None and (not isinstance(value, str) or (not blank and not value.strip())):
        raise InvalidSpec(f"spec.{field} must be a {'' if blank else 'non-empty '}string")
    return value


def _names(spec: Mapping[str, Any], field: str) -> tuple[str, ...] | None:
    names = spec.get(field)
    if names is not None and (not isinstance(names, list) or not all(isinstance(t, str) and t for t in names)):
        raise InvalidSpec(f"spec.{field} must be a list of tool names")
    return tuple(names) if names is not None else None


def _lineage(spec: Mapping[str, Any], source: Run | None) -> dict[str, Any]:
    """spec.continueFrom or spec.forkFrom as the source's id (and the fork's seq)."""
    fork = spec.get("forkFrom")
    if spec.get("continueFrom") is None and fork is None:
        return {}
    if source is None:
        raise InvalidSpec("the AgentRun named by spec.continueFrom or spec.forkFrom has no run")
    if fork is None:
        return {"continue_from": source.id}
    seq = fork.get("seq") if isinstance(fork, Mapping) else None
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise InvalidSpec(f"spec.forkFrom.seq must be between 1 and {source.steps}, the steps its run has")
    return {"fork_from": (source.id, seq)}


def _traceparent(annotations: Mapping[str, str] | None) -> str | None:
    traceparent = (annotations or {}).get(TRACEPARENT_ANNOTATION)
    try:
        return checked_traceparent(traceparent) if isinstance(traceparent, str) else None
    except ValueError as e:
        raise InvalidSpec(f"annotation {TRACEPARENT_ANNOTATION} {e}") from None


def source_name(spec: Mapping[str, Any]) -> str | None:
    """The AgentRun (same namespace) this one continues or forks, if any."""
    fork = spec.get("forkFrom")
    name = fork.get("name") if isinstance(fork, Mapping) else spec.get("continueFrom")
    return name if isinstance(name, str) and name else None


MAX_PRIORITY = 1_000_000
MAX_DELAY_SECONDS = 10 * 366 * 24 * 3600


def _schedule(spec: Mapping[str, Any]) -> dict[str, Any]:
    """spec.priority, spec.runAt and spec.delaySeconds as NewRun fields (the CRD's bounds, checked again)."""
    priority = spec.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidSpec(f"spec.priority must be an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}, "
                          f"got {str(priority)[:40]}")
    run_at, delay = spec.get("runAt"), spec.get("delaySeconds")
    if run_at is not None and delay is not None:
        raise InvalidSpec("give spec.runAt or spec.delaySeconds, not both")
    at = None
    if run_at is not None:
        try:
            at = datetime.datetime.fromisoformat(run_at) if isinstance(run_at, str) else None
        except ValueError:
            at = None
        if at is None or at.utcoffset() is None or at.year > 9000:
            raise InvalidSpec(f"spec.runAt must be an RFC 3339 time like 2026-12-01T10:00:00Z, got {str(run_at)[:40]}")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int)
                              or not 0 <= delay <= MAX_DELAY_SECONDS):
        raise InvalidSpec(f"spec.delaySeconds must be an integer from 0 to {MAX_DELAY_SECONDS}, got {str(delay)[:40]}")
    return {"priority": priority, "run_at": at, "delay_seconds": float(delay) if delay is not None else None}


def _positive_int(spec: Mapping[str, Any], field: str, limit: int) -> int | None:
    value = spec.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        raise InvalidSpec(f"spec.{field} must be a positive integer of at most {limit}, got {str(value)[:40]}")
    return value


def _cost_budget(spec: Mapping[str, Any]) -> Decimal | None:
    value = spec.get("costBudgetUsd")
    if value is None:
        return None
    try:
        # Through str: a YAML 0.1 arrives as a float, and Decimal(0.1) would carry its binary error.
        cost = Decimal(str(value)) if not isinstance(value, bool) else Decimal("NaN")
    except InvalidOperation:
        cost = Decimal("NaN")
    if not cost.is_finite() or cost <= 0:
        raise InvalidSpec(f"spec.costBudgetUsd must be a positive number, got {value!r}")
    # Rounded as NUMERIC(14, 6) stores it: anything under half a micro-dollar would become 0, which the
    # column's CHECK refuses, and anything from 10^8 up would overflow it; either failed every retry.
    cost = cost.quantize(MICRO_DOLLAR, rounding=ROUND_HALF_UP) if cost < COST_LIMIT else cost
    if not MICRO_DOLLAR <= cost < COST_LIMIT:
        raise InvalidSpec(f"spec.costBudgetUsd must be from 0.000001 to under 100000000, got {value!r}")
    return cost


# -- Agent ----------------------------------------------------------------------------------------

AGENT_FIELDS = ("system", "model", "tools", "requireApproval", "outputSchema", "maxSteps", "tokenBudget",
                "costBudgetUsd", "timeoutSeconds", "webhook", "contextManagement")
"""The fields an Agent's spec shares with an AgentRun's: checked by the same code, as a run of it would be."""


def agent_definition(
    name: str, spec: Mapping[str, Any], known_tools: Collection[str] | None = None, prices: PriceTable | None = None
) -> Agent:
    """The agent definition an Agent's spec is (its version is the store's to give); raises InvalidSpec
    naming what is wrong: a name that is no DNS label, a bad field, an unknown tool, a bad output
    schema, a cost budget on a model without a price. Whether its sub-agents exist is the store's to say."""
    if not re.fullmatch(AGENT_NAME, name):
        raise InvalidSpec(f"metadata.name {name!r} is no agent name: a DNS label (a-z, 0-9, '-', at most 63)")
    description = _text(spec, "description", blank=False)
    if description is not None and (why := unstorable(description)):
        raise InvalidSpec(f"spec.description {why}")
    shared = run_spec({field: spec[field] for field in AGENT_FIELDS if field in spec}, None)
    agent = Agent(
        name=name, version=0, description=description, system=shared.system, model=shared.model,
        tools=shared.tools, require_approval=shared.require_approval, output_schema=shared.output_schema,
        max_steps=shared.max_steps, token_budget=shared.token_budget, cost_budget_usd=shared.cost_budget_usd,
        timeout_seconds=shared.timeout_seconds, sub_agents=_sub_agents(spec), webhook=shared.webhook,
        context_management=shared.context_management,
    )
    try:
        check_definition(agent, offer(known_tools, prices))  # as POST /api/agents checks it
    except Refused as e:
        raise InvalidSpec(refusal_message(e, known_tools)) from None
    return agent


def _sub_agents(spec: Mapping[str, Any]) -> tuple[str, ...] | None:
    names = spec.get("subAgents")
    if names is None:
        return None
    if not isinstance(names, list):
        raise InvalidSpec("spec.subAgents must be a list of agent names (name or name@version)")
    for i, ref in enumerate(names):
        try:
            parse_ref(ref if isinstance(ref, str) else "")
        except Refused:
            raise InvalidSpec(
                f"spec.subAgents[{i}] must be an agent name or name@version, got {str(ref)[:80]!r}") from None
    return tuple(dict.fromkeys(names))


def agent_owner(created_by: str | None) -> str | None:
    """The namespace of the Agent resource that made an agent version (`k8s:<namespace>/<manager>`);
    None for one made otherwise (the REST API, the CLI)."""
    if created_by is None or not created_by.startswith("k8s:"):
        return None
    return created_by.removeprefix("k8s:").split("/", 1)[0]


def agent_creator(body: Mapping[str, Any]) -> str:
    """Who made this version: the field manager of the latest change of spec, always with the namespace
    (which `agent_owner` reads back)."""
    who = requester(body, latest=True)
    return who if who != "k8s" else f"k8s:{(body.get('metadata') or {}).get('namespace') or ''}"


def agent_status(
    agent: Agent, created: bool, generation: int | None, previous: Mapping[str, Any] | None, now: datetime.datetime
) -> dict[str, Any]:
    """The status of an Agent whose spec is stored as `agent` (a new version, or the same as before)."""
    message = f"version {agent.version} {'stored' if created else 'stored already (the spec is unchanged)'}"
    ready = ("Ready", "True", "Stored", message)
    return _status({"version": agent.version, "message": message}, [ready], generation, previous, now)


def agent_refused_status(
    reason: str, message: str, generation: int | None, previous: Mapping[str, Any] | None, now: datetime.datetime
) -> dict[str, Any]:
    """The status of an Agent whose spec was not stored: the version runs get (if any) stays shown."""
    fields: dict[str, Any] = {"message": message}
    if isinstance((previous or {}).get("version"), int):
        fields["version"] = (previous or {})["version"]
        fields["message"] = f"{message} (runs naming it still get version {fields['version']})"
    return _status(fields, [("Ready", "False", reason, fields["message"])], generation, previous, now)


# -- status ---------------------------------------------------------------------------------------


def timestamp(t: datetime.datetime) -> str:
    """RFC 3339 in UTC with seconds, the way Kubernetes writes times."""
    return t.astimezone(datetime.UTC).strftime(TIME_FORMAT)


def run_status(
    run: Run,
    generation: int | None,
    previous: Mapping[str, Any] | None,
    now: datetime.datetime,
    pending: Sequence[PendingCall] = (),
    children: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The status an AgentRun shows for its run. `previous` keeps the conditions' transition times;
    `pending` are its calls waiting for a decision (while Waiting); `children` counts the runs its
    sub-agent calls started (a run with sub-agents: see `children_status`)."""
    phase = PHASES[run.status]
    if run.status is RunStatus.SUCCEEDED:
        succeeded = ("True", "Succeeded", "the run finished")
    elif run.status.terminal:
        succeeded = ("False", phase, run.error or phase.lower())
    else:
        succeeded = ("Unknown", phase, phase_message(run))
    fields = {
        "phase": phase,
        "runId": str(run.id),
        "tokensUsed": run.tokens_used,
        "costUsd": _money(run.cost_usd),
        "steps": run.steps,
        "startedAt": timestamp(run.started_at) if run.started_at else None,
        "finishedAt": timestamp(run.finished_at) if run.finished_at else None,
        "message": run.error or phase_message(run),
        "lockedBy": run.locked_by,
        "agent": f"{run.agent}@{run.agent_version}" if run.agent is not None else None,
        "pending": [
            {"toolUseId": c.tool_use_id, "tool": c.tool_name, "kind": c.kind.value, "attempt": c.attempt,
             "since": timestamp(c.since), "input": _cut(c.input or "", MAX_PENDING_INPUT)[0]}
            for c in pending if c.decision is None
        ],
        **_output(run),
        **children_status(run, children),
    }
    ready = ("Ready", "True", "Accepted", "the run is recorded in the database")
    return _status(fields, [ready, ("Succeeded", *succeeded)], generation, previous, now)


def children_status(run: Run, children: Mapping[str, int] | None) -> dict[str, Any]:
    """For a run with sub-agents: `children` (total, active, succeeded, failed: its sub-agents' runs by
    outcome) and its totals with all its descendants, `tokensUsedTotal` and `costUsdTotal`. Nothing for
    a run without them, whose status stays as it was."""
    if children is None:
        return {}
    return {
        "children": {k: int(children.get(k, 0)) for k in ("total", "active", "succeeded", "failed")},
        "tokensUsedTotal": run.tokens_used_total,
        "costUsdTotal": _money(run.cost_usd_total),
    }


def rejected_status(
    message: str, generation: int | None, previous: Mapping[str, Any] | None, now: datetime.datetime
) -> dict[str, Any]:
    """The status of an AgentRun whose spec the runtime cannot run: no run is made."""
    fields = {"phase": "Failed", "message": message, "finishedAt": timestamp(now)}
    wanted = [("Ready", "False", "InvalidSpec", message), ("Succeeded", "False", "InvalidSpec", message)]
    return _status(fields, wanted, generation, previous, now)


def pending_status(
    message: str, generation: int | None, previous: Mapping[str, Any] | None, now: datetime.datetime,
    reason: str = "DatabaseUnavailable",
) -> dict[str, Any]:
    """Not in the database yet (it is unreachable, or its tenant's quota refuses it: `reason` says which, as
    `OverQuota`): the operator keeps retrying."""
    fields = {"phase": PENDING, "message": message}
    wanted = [("Ready", "False", reason, message), ("Succeeded", "Unknown", PENDING, message)]
    return _status(fields, wanted, generation, previous, now)


def _status(
    fields: Mapping[str, Any],
    wanted: list[tuple[str, str, str, str]],
    generation: int | None,
    previous: Mapping[str, Any] | None,
    now: datetime.datetime,
) -> dict[str, Any]:
    """`fields`, then the observedGeneration (if known) and the `wanted` conditions: every status's tail."""
    status = dict(fields)
    if generation is not None:
        status["observedGeneration"] = generation
    status["conditions"] = conditions(wanted, generation, previous, now)
    return status


def conditions(
    wanted: list[tuple[str, str, str, str]],
    generation: int | None,
    previous: Mapping[str, Any] | None,
    now: datetime.datetime,
) -> list[Condition]:
    """Conditions in the Kubernetes shape; a condition whose status did not change keeps its time."""
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or [] if isinstance(c, Mapping)}
    out: list[Condition] = []
    for type_, status, reason, message in wanted:
        old = before.get(type_)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        cond: Condition = {
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or timestamp(now),
        }
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    return out


MAX_OUTPUT = 4096
MAX_PENDING_INPUT = 1024


def _cut(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to at most `limit` bytes of UTF-8 (whole characters), and whether it was cut."""
    data = text.encode()
    if len(data) <= limit:
        return text, False
    return data[:limit].decode(errors="ignore"), True


def _output(run: Run) -> dict[str, Any]:
    """status.output: the answer (a structured one as JSON text), cut to 4 KiB, and whether it was cut."""
    if run.output is None:
        return {"output": None, "outputTruncated": None}
    text = run.output if isinstance(run.output, str) else orjson.dumps(run.output).decode()
    cut, truncated = _cut(text, MAX_OUTPUT)
    return {"output": cut, "outputTruncated": truncated}


def _question(p: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What one pending entry asks: a call, what it waits for, and at which attempt. A call in doubt again
    after a retried execution was interrupted is a new question, though its toolUseId is the same."""
    return p.get("toolUseId"), p.get("kind"), p.get("attempt", 0)


def decision_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """A DecisionRequired Event for every pending question the AgentRun did not show before."""
    shown = {_question(p) for p in old.get("pending") or [] if isinstance(p, Mapping)}
    return [
        ("Normal", "DecisionRequired",
         f"tool {p['tool']} call {p['toolUseId']} "
         + ("needs approval" if p["kind"] == "approval"
            else "is in doubt after a crash" + (f" (attempt {p['attempt']})" if p.get("attempt", 0) > 1 else "")
            + ": retry, record or fail")
         + ": add a decision to spec.decisions")
        for p in new.get("pending") or [] if _question(p) not in shown
    ]


def _money(value: Decimal) -> str:
    return f"{value.quantize(MICRO_DOLLAR):f}"


def phase_message(run: Run) -> str:
    if run.status is RunStatus.QUEUED:
        if run.throttled:  # held back by its tenant's daily budget
            until = run.throttled.get("until")
            return (f"held back by tenant {run.tenant}'s quota {run.throttled.get('quota')}"
                    + (f" until {until}" if until else "") + f": {run.throttled.get('reason') or ''}").rstrip(": ")
        if run.model_retries and run.run_at is not None:  # handed back in a model API outage
            return (f"handed back after {run.model_retries} failed model step{'s' if run.model_retries != 1 else ''}; "
                    f"to be retried from {run.run_at.isoformat(timespec='seconds')}")
        return "waiting for a worker"
    if run.status is RunStatus.RUNNING:
        return f"running on {run.locked_by}" if run.locked_by else "running"
    if run.status is RunStatus.WAITING and run.waiting_for == "children":
        return f"waiting for {run.children_active} sub-agent run{'s' if run.children_active != 1 else ''} " \
               "(see status.children)"
    if run.status is RunStatus.WAITING and run.waiting_for == "timer":
        return "waiting for a timer (the wait tool)"
    if run.status is RunStatus.WAITING and run.waiting_for == "event":
        return "waiting for an event from outside (POST /api/events)"
    if run.status is RunStatus.WAITING:
        return f"waiting for {run.pending} decision{'s' if run.pending != 1 else ''} (see status.pending)"
    return ""


def visible_change(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether patching `new` over `old` would change what a user sees."""
    if old is None:
        return True
    return any(old.get(k) != v for k, v in new.items())


def event_for(phase: str, message: str) -> tuple[str, str, str] | None:
    """The Kubernetes Event (type, reason, message) announcing a phase, or None for phases not announced."""
    if phase in ("Queued", "Running", "Waiting", "Succeeded", "Cancelled"):
        return "Normal", phase, message or phase.lower()
    if phase in ("Failed", "TimedOut", PENDING):
        return "Warning", phase, message or phase.lower()
    return None


def phase_events(old_phase: str | None, run: Run) -> list[tuple[str, str, str]]:
    """The Events announcing each phase a run went through since `old_phase` was shown, in order.

    A run can pass several phases between two looks (queued, claimed and finished within one debounce):
    every run starts Queued, and one with a start time was Running, so those are announced too, before
    its current phase. Nothing when the phase is unchanged.
    """
    new = PHASES[run.status]
    if new == old_phase:
        return []
    phases = []
    if old_phase in (None, PENDING) and new != "Queued":
        phases.append(("Queued", "waiting for a worker"))
    if run.started_at is not None and old_phase in (None, PENDING, "Queued") and new not in ("Queued", "Running"):
        phases.append(("Running", f"running on {run.locked_by}" if run.locked_by else "running"))
    phases.append((new, run.error or phase_message(run)))
    return [event for phase, message in phases if (event := event_for(phase, message)) is not None]


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch turning `old` into `new`: keys gone from `new` are removed with null."""
    patch: dict[str, Any] = dict(new)
    for key in old or {}:
        if key not in new:
            patch[key] = None
    return patch


def expires_at(ref: Ref, status: Mapping[str, Any]) -> datetime.datetime | None:
    """When a finished AgentRun with ttlSecondsAfterFinished is due for deletion."""
    finished = status.get("finishedAt")
    if ref.ttl_seconds is None or status.get("phase") not in FINISHED_PHASES or not finished:
        return None
    at = datetime.datetime.strptime(finished, TIME_FORMAT).replace(tzinfo=datetime.UTC)
    return at + datetime.timedelta(seconds=ref.ttl_seconds)


_MANAGER = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,127}")


def requester(body: Mapping[str, Any], path: Sequence[str] = ("spec",), latest: bool = False) -> str:
    """Who set `path` of an AgentRun, as the API server tells it: `k8s:<namespace>/<field manager>` of
    the managedFields entry owning that field (the earliest, or with `latest` the most recent), else `k8s`.

    The field manager is what the client calls itself (`kubectl --field-manager`, a controller's name),
    not an authenticated user: the Kubernetes audit log is the authority on who, this the best hint.
    """
    meta = body.get("metadata") or {}
    owners: list[tuple[str, str]] = []
    for entry in meta.get("managedFields") or ():
        if not isinstance(entry, Mapping) or entry.get("subresource"):
            continue
        fields: Any = entry.get("fieldsV1")
        for part in path:
            fields = fields.get(f"f:{part}") if isinstance(fields, Mapping) else None
        manager = entry.get("manager")
        if fields is not None and isinstance(manager, str) and _MANAGER.fullmatch(manager):
            owners.append((str(entry.get("time") or ""), manager))
    if not owners:
        return "k8s"
    _, manager = max(owners) if latest else min(owners)
    return f"k8s:{meta.get('namespace') or ''}/{manager}"
