"""A new run from a request, whoever makes it (the REST API, the operator, a schedule, a parent's call): the
defaults, what a continuation or fork takes from its source, the checks that do not depend on the
transport, and what the way in attaches (`Caller`). Pure; runtime/door.py applies it to every new run."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from agentrun.worker.core import children
from agentrun.worker.core.answer import schema_problem
from agentrun.worker.core.errors import Problem as Problem
from agentrun.worker.core.errors import Refusal as Refusal
from agentrun.worker.core.errors import Refused as Refused
from agentrun.worker.core.labels import labels_problems
from agentrun.worker.core.pricing import PriceTable, cost_budget_problem
from agentrun.worker.core.records import DEFAULT_MODEL as DEFAULT_MODEL
from agentrun.worker.core.records import NewRun, Origin, Run, RunStatus

DEFAULT_MAX_STEPS = 100
"""Most steps of a run that names no cap and has no source: enough for long tool loops, a stop for a stuck one."""
DEFAULT_TOKEN_BUDGET = 100_000
"""Tokens of an AgentRun that names no budget (the CRD's default); a REST request must name its own."""
DEFAULT_TIMEOUT_SECONDS = 600
"""Wall-clock limit of an AgentRun that names none (the CRD's default); a REST request must name its own."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What a request asks for, typed and bounded by its transport; None is a field it leaves out."""

    input: str | None = None
    model: str | None = None
    token_budget: int | None = None
    timeout_seconds: int | None = None
    max_steps: int | None = None
    tools: tuple[str, ...] | None = None
    system: str | None = None
    cost_budget_usd: Decimal | None = None
    require_approval: tuple[str, ...] | None = None
    output_schema: dict[str, Any] | None = None
    continue_from: uuid.UUID | None = None  # the source's id, as the caller found it
    fork_from: tuple[uuid.UUID, int] | None = None  # the source's id and how many of its steps the fork takes
    priority: int = 0
    run_at: datetime.datetime | None = None
    delay_seconds: float | None = None
    agent: tuple[str, int | None] | None = None  # the agent's name and version (None: the latest)
    sub_agents: tuple[str, ...] | None = None  # as the caller gave them: `name` or `name@N`
    webhook: dict[str, Any] | None = None  # checked by the transport (core/webhooks.check_webhook)
    context_management: dict[str, Any] | None = None  # ContextPolicy.to_json(), checked by context.parse
    labels: dict[str, str] | None = None  # checked here (core/labels.py); None: the source's, else none


@dataclasses.dataclass(frozen=True)
class Defaults:
    """What a run gets for a field its request leaves out and its source (if any) cannot give.
    None: the request must name it."""

    model: str = DEFAULT_MODEL
    max_steps: int = DEFAULT_MAX_STEPS
    token_budget: int | None = DEFAULT_TOKEN_BUDGET
    timeout_seconds: int | None = DEFAULT_TIMEOUT_SECONDS


@dataclasses.dataclass(frozen=True)
class Offer:
    """What the workers can run, as far as the caller knows it; what is not known is not checked."""

    has_tool: Callable[[str], bool] | None = None
    tool_names: Sequence[str] = ()  # named when a tool is unknown (the operator words that itself)
    prices: PriceTable | None = None
    model_problem: Callable[[str], str | None] | None = None  # why a model cannot be served, None if it can


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who asks for a run, and what its way in attaches to it besides what the policy makes of the spec.
    None is a field the way in leaves as the policy made it."""

    created_by: str | None = None  # the API identity, `k8s:<namespace>/<user>`, a schedule's author, a parent's
    id: uuid.UUID | None = None  # the operator's (the AgentRun's uid), a tick's: a retry finds the run by it
    idempotency_key: str | None = None  # the API's Idempotency-Key
    traceparent: str | None = None  # the caller's span (W3C), checked by the transport
    k8s_namespace: str | None = None
    k8s_name: str | None = None
    labels: dict[str, str] | None = None  # an AgentRun's metadata.labels, instead of its spec's or source's
    schedule_name: str | None = None
    scheduled_time: datetime.datetime | None = None
    spawned_by: tuple[uuid.UUID, str] | None = None  # a sub-agent's run: (the parent run, its tool_use id)
    root_run_id: uuid.UUID | None = None
    depth: int | None = None
    tenant: str | None = None  # whose run: the identity's, the namespace's, the schedule's, the parent's

    def stamped(self, new: NewRun, origin: Origin) -> NewRun:
        """`new` as this caller, come in by `origin`, has it made."""
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
        return dataclasses.replace(new, origin=origin, **given)


# Inherited from the source when the request leaves them out; the schedule and priority never are.
INHERITED = ("model", "token_budget", "timeout_seconds", "max_steps", "tools", "system", "cost_budget_usd",
             "require_approval", "output_schema", "webhook", "context_management", "labels")


def new_run(spec: RunSpec, source: Run | None, defaults: Defaults = Defaults(), offer: Offer = Offer()) -> NewRun:
    """The run `spec` asks for, `source` being the run it continues or forks (looked up by the caller).

    Raises Refused, in this order: the source unfit for it; every problem of an incomplete or
    contradictory request at once; then the first of a bad output schema, a model no provider serves,
    a cost budget on a model without a price."""
    check_source(spec, source)
    inherited = source.sub_agents if source is not None and spec.sub_agents is None else None
    problems = [*unknown_tools(spec, offer, inherited), *_missing(spec, source, defaults), *_contradictions(spec),
                *(Problem(field, why) for field, why in labels_problems(spec.labels or {}))]
    if problems:
        raise Refused.of(Refusal.INVALID, problems)
    fields = {attr: _inherited(spec, source, attr) for attr in INHERITED}
    for attr in ("model", "max_steps", "token_budget", "timeout_seconds"):
        if fields[attr] is None:
            fields[attr] = getattr(defaults, attr)
    check_runnable(spec, fields["model"], fields["cost_budget_usd"], offer)
    fields["labels"] = dict(fields["labels"] or {})
    for attr in ("tools", "require_approval"):  # each name once, in the order given
        fields[attr] = tuple(dict.fromkeys(fields[attr])) if fields[attr] is not None else None
    return NewRun(
        input=spec.input if spec.input is not None else (source.input if source is not None else ""),
        **fields, continue_from=spec.continue_from, fork_from=spec.fork_from, priority=spec.priority,
        run_at=spec.run_at, delay_seconds=spec.delay_seconds,
    )


def check_source(spec: RunSpec, source: Run | None) -> None:
    """A continuation needs a SUCCEEDED source (else CONFLICT); a fork a seq its source has (else UNFIT)."""
    if spec.continue_from is None and spec.fork_from is None:
        return
    field = "continueFrom" if spec.continue_from is not None else "forkFrom"
    if source is None:
        raise Refused.of(Refusal.INVALID, [Problem(field, "names no run")])
    if spec.continue_from is not None:
        if source.status is not RunStatus.SUCCEEDED:
            raise Refused(Refusal.CONFLICT, f"continueFrom: run {source.id} is {source.status.value}; only a "
                          "SUCCEEDED run can be continued (fork it instead)")
    elif spec.fork_from is not None and not 1 <= spec.fork_from[1] <= source.steps:
        problem = f"must be between 1 and {source.steps}, the steps run {source.id} has"
        raise Refused(Refusal.UNFIT, f"forkFrom.seq {problem}", [Problem("forkFrom.seq", problem)])


def _inherited(spec: RunSpec, source: Run | None, attr: str) -> Any:
    """What the request gives, else (continuing or forking) the source's, else None."""
    value = getattr(spec, attr)
    if value is None and source is not None:
        return getattr(source, attr)
    return value


def unknown_tools(spec: RunSpec, offer: Offer, sub_agents: tuple[str, ...] | None = None) -> list[Problem]:
    """The names in `tools` and `requireApproval` that name no tool. `requireApproval` may also name `*` and
    the tools of the run's sub-agents (`agent__<name>`; `sub_agents` when not the spec's own)."""
    if offer.has_tool is None:
        return []
    agents = [children.tool_name(ref) for ref in (sub_agents if sub_agents is not None else spec.sub_agents) or ()]
    offered = ", ".join(offer.tool_names) or "no tools"
    if agents:
        offered += f" (and this run's sub-agents: {', '.join(agents)})"
    return [
        Problem(f"{field}[{i}]", f"unknown tool {name!r}; this server offers: {offered}", unknown_tool=name)
        for field, names in (("tools", spec.tools), ("requireApproval", spec.require_approval))
        for i, name in enumerate(names or ())
        if not offer.has_tool(name) and not (field == "requireApproval" and (name == "*" or name in agents))
    ]


def _missing(spec: RunSpec, source: Run | None, defaults: Defaults) -> list[Problem]:
    """What a run without a source must be given: its input, and the budgets that have no default."""
    if source is not None or spec.continue_from is not None or spec.fork_from is not None:
        return []
    required = [("input", spec.input, None), ("tokenBudget", spec.token_budget, defaults.token_budget),
                ("timeoutSeconds", spec.timeout_seconds, defaults.timeout_seconds)]
    return [Problem(field, "is required") for field, given, default in required if given is None and default is None]


def _contradictions(spec: RunSpec) -> list[Problem]:
    problems = []
    if spec.fork_from is not None and spec.input is not None:
        problems.append(Problem("input", "a fork takes no input: it goes on from the steps it starts with"))
    if spec.continue_from is not None and spec.input is None:
        problems.append(Problem("input", "is required: the next user message"))
    if spec.continue_from is not None and spec.fork_from is not None:
        problems.append(Problem("forkFrom", "give continueFrom or forkFrom, not both"))
    return problems


def check_runnable(spec: RunSpec, model: str, cost_budget: Decimal | None, offer: Offer) -> None:
    """The output schema is one, a provider serves the model, and a cost budget's model has a price."""
    if spec.output_schema is not None and (why := schema_problem(spec.output_schema)) is not None:
        raise Refused(Refusal.UNFIT, f"outputSchema {why}", [Problem("outputSchema", why)])
    if offer.model_problem is not None and (problem := offer.model_problem(model)):
        raise Refused(Refusal.UNFIT, f"model: {problem}", [Problem("model", problem)])
    # A step of an unpriced model costs null, so its budget would never stop the run.
    if offer.prices is not None and (problem := cost_budget_problem(offer.prices, model, cost_budget)):
        raise Refused(Refusal.UNFIT, problem, [Problem("costBudgetUsd", problem)])
