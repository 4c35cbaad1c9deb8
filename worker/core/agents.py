"""Agent definitions: a named, versioned run configuration, and how a run's request is made from one. Pure."""

from __future__ import annotations

import dataclasses
import datetime
import re
from decimal import Decimal
from typing import Any

from agentrun.worker.core.answer import schema_problem
from agentrun.worker.core.errors import Problem, Refusal, Refused
from agentrun.worker.core.records import NewRun, Origin, Run
from agentrun.worker.core.submission import (
    Caller,
    Defaults,
    Offer,
    RunSpec,
    check_runnable,
    new_run,
    unknown_tools,
)

AGENT_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # DNS label
"""An agent's name: a DNS label, so that one Kubernetes object (an `Agent`) can bear it unchanged."""

AGENT_REF = AGENT_NAME.removesuffix("$") + r"(@[1-9][0-9]{0,8})?$"
"""A reference to an agent: its name, or `name@version` (versions count from 1; nine digits at most)."""

_NAME = re.compile(AGENT_NAME)
_REF = re.compile(r"(?P<name>[^@]*)(?:@(?P<version>[^@]*))?")
_VERSION = re.compile(r"[1-9][0-9]{0,8}")
MAX_VERSION = 999_999_999  # what a reference can name


@dataclasses.dataclass(frozen=True)
class Agent:
    """One version of an agent's definition. A field left None is left to the run that names the agent."""

    name: str
    version: int
    description: str | None = None
    system: str | None = None
    model: str | None = None
    tools: tuple[str, ...] | None = None
    require_approval: tuple[str, ...] | None = None
    output_schema: dict[str, Any] | None = None
    max_steps: int | None = None
    token_budget: int | None = None
    cost_budget_usd: Decimal | None = None
    timeout_seconds: int | None = None
    sub_agents: tuple[str, ...] | None = None  # as given in the definition (names, optionally name@N)
    webhook: dict[str, Any] | None = None  # its runs' webhook unless their request names one
    context_management: dict[str, Any] | None = None  # its runs' contextManagement unless they name one
    created_at: datetime.datetime | None = None
    created_by: str | None = None
    tenant: str = "default"  # whose agent: a run finds its agent among its own tenant's only

    @property
    def ref(self) -> str:
        """The pinned reference to this version: `name@version`."""
        return f"{self.name}@{self.version}"


DEFINITION = ("description", "system", "model", "tools", "require_approval", "output_schema", "max_steps",
              "token_budget", "cost_budget_usd", "timeout_seconds", "sub_agents", "webhook",
              "context_management")
"""The fields that make a definition: two versions with the same values are the same definition."""

# Applied to a run; the spec may give its own. The first four may only be lowered.
_APPLIED = ("model", "system", "tools", "require_approval", "output_schema", "token_budget", "cost_budget_usd",
            "max_steps", "timeout_seconds", "sub_agents", "webhook", "context_management")
LOWER_ONLY = {"token_budget": "tokenBudget", "cost_budget_usd": "costBudgetUsd", "max_steps": "maxSteps",
              "timeout_seconds": "timeoutSeconds"}


def same_definition(a: Agent, b: Agent) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in DEFINITION)


def name_problem(name: str) -> str | None:
    """Why `name` cannot name an agent, or None."""
    if not _NAME.fullmatch(name):
        return ("must be a DNS label: 1 to 63 lowercase letters, digits and '-', starting and ending with a "
                "letter or digit")
    return None


def parse_ref(text: str, field: str = "agent") -> tuple[str, int | None]:
    """`"researcher"` -> `("researcher", None)` (the latest); `"researcher@3"` -> `("researcher", 3)`.

    Raises Refused (INVALID, naming `field`) for anything else."""
    m = _REF.fullmatch(text)
    if m is None:
        problem = "must be an agent's name, optionally with @version: researcher or researcher@3"
        raise Refused.of(Refusal.INVALID, [Problem(field, problem)])
    if (why := name_problem(m["name"])) is not None:
        raise Refused.of(Refusal.INVALID, [Problem(field, f"names no agent: its name {why}")])
    if m["version"] is not None and not _VERSION.fullmatch(m["version"]):
        problem = "has a bad version: after @ comes a version number from 1, without leading zeros, 9 digits at most"
        raise Refused.of(Refusal.INVALID, [Problem(field, problem)])
    return m["name"], int(m["version"]) if m["version"] is not None else None


def with_agent(spec: RunSpec, agent: Agent) -> RunSpec:
    """`spec` with the agent's fields where it gives none; the result has `agent` cleared (it is applied).

    Budgets, step cap and timeout given on the spec may only be lower than (or equal to) the agent's:
    else Refused (INVALID), naming every such field."""
    problems = []
    for attr, field in LOWER_ONLY.items():
        mine, theirs = getattr(spec, attr), getattr(agent, attr)
        if mine is not None and theirs is not None and mine > theirs:
            problems.append(Problem(field, f"may only lower agent {agent.ref}'s {theirs}"))
    if problems:
        raise Refused.of(Refusal.INVALID, problems)
    given = {attr: getattr(spec, attr) if getattr(spec, attr) is not None else getattr(agent, attr)
             for attr in _APPLIED}
    return dataclasses.replace(spec, agent=None, **given)


def pinned(
    new: NewRun, agent: Agent | None, sub_agents: tuple[str, ...] | None, source: Run | None
) -> NewRun:
    """`new` with the agent it was made from and its sub-agents pinned (`name@version`).

    A continuation or fork keeps its source's agent, and its sub-agents unless it names its own: what
    the source was pinned to, never the agent's latest."""
    if agent is None and source is not None:
        return dataclasses.replace(new, agent=source.agent, agent_version=source.agent_version,
                                   sub_agents=sub_agents if sub_agents is not None else source.sub_agents)
    return dataclasses.replace(new, agent=agent.name if agent else None, agent_version=agent.version if agent else None,
                               sub_agents=sub_agents)


def planned(
    resolved: tuple[RunSpec, Agent | None, tuple[str, ...] | None], source: Run | None, origin: Origin,
    caller: Caller = Caller(), defaults: Defaults = Defaults(), offer: Offer = Offer(),
) -> NewRun:
    """The run a request makes, once the store has resolved its agent and sub-agents (`RunStore.for_run`):
    the submission policy applied, the agent and sub-agents pinned, and what its way in attaches. The
    pure half of the door (runtime/door.py); raises Refused as `new_run` does."""
    spec, agent, sub_agents = resolved
    new = caller.stamped(pinned(new_run(spec, source, defaults, offer), agent, sub_agents, source), origin)
    if source is not None and caller.tenant is None:
        new = dataclasses.replace(new, tenant=source.tenant)
    elif source is not None and caller.tenant != source.tenant:
        field = "continueFrom" if spec.continue_from is not None else "forkFrom"
        raise Refused.of(Refusal.INVALID, [Problem("tenant", f"a run made from {field} is its source's tenant's, "
                                                   f"{source.tenant!r}, not {caller.tenant!r}")])
    return new


def check_definition(agent: Agent, offer: Offer) -> None:
    """Refuse a definition no run could be made of, with the statuses a run's request gets for the same
    fault: unknown tools (the same check as a run's) or a sub-agent naming the agent itself (INVALID,
    every such field at once); then a bad output schema, a model no provider serves, a cost budget on a
    model without a price (UNFIT). Malformed sub-agent references raise INVALID too (parse_ref)."""
    problems = unknown_tools(RunSpec(tools=agent.tools, require_approval=agent.require_approval), offer,
                             agent.sub_agents)
    for i, ref in enumerate(agent.sub_agents or ()):
        if parse_ref(ref, f"subAgents[{i}]")[0] == agent.name:
            problems.append(Problem(f"subAgents[{i}]", "names the agent itself: an agent is not its own sub-agent"))
    if problems:
        raise Refused.of(Refusal.INVALID, problems)
    if agent.model is not None:
        check_runnable(RunSpec(output_schema=agent.output_schema), agent.model, agent.cost_budget_usd, offer)
    elif agent.output_schema is not None and (why := schema_problem(agent.output_schema)) is not None:
        raise Refused(Refusal.UNFIT, f"outputSchema {why}", [Problem("outputSchema", why)])
