"""The JSON shapes of the REST API: what a client sends and what it gets back, in camelCase."""

from __future__ import annotations

import datetime
import uuid
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import orjson
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from agentrun.worker.api.identities import Scope
from agentrun.worker.core.agents import AGENT_REF, parse_ref
from agentrun.worker.core.children import TOOL_PREFIX
from agentrun.worker.core.context import MAX_KEEP_RECENT_TURNS, MAX_TRIGGER_TOKENS, STRATEGIES, ContextPolicy, parse
from agentrun.worker.core.errors import Refused
from agentrun.worker.core.labels import KEY_PATTERN, MAX_LABELS, MAX_NAME, MAX_PREFIX, VALUE_PATTERN
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import (
    Decision,
    DecisionKind,
    Message,
    PendingCall,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from agentrun.worker.core.submission import DEFAULT_MAX_STEPS, RunSpec
from agentrun.worker.core.tenants import TENANT_PATTERN
from agentrun.worker.core.text import unstorable
from agentrun.worker.core.webhooks import MAX_URL_CHARS, Delivery

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentrun.worker.store.waits import PendingWait

MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
MAX_STEPS = 10_000
MAX_TOKEN_BUDGET = 10**12
MAX_COST_BUDGET_USD = 1_000_000  # NUMERIC(14, 6) holds up to 10^8
MIN_COST_BUDGET_USD = Decimal("0.000001")  # NUMERIC(14, 6) rounds anything smaller to 0, which its CHECK refuses
MAX_TOOLS = 256
MAX_NAME_CHARS = 200
MAX_SEQ = 2**31 - 1  # run_step.seq is an INT
PREVIEW_CHARS = 120
MAX_PRIORITY = 1_000_000
MAX_DELAY_SECONDS = 10 * 366 * 24 * 3600  # ten years: far enough for any schedule, far from the calendar's end
MAX_MESSAGE_CHARS = 100_000  # a message to a running run: a person's turn, not a document store


def storable(value: str) -> str:
    """PostgreSQL TEXT holds neither NUL characters nor unpaired surrogates: say so instead of failing."""
    if why := unstorable(value):
        raise ValueError(why)
    return value


T = TypeVar("T")


def storable_json(value: T) -> T:
    """Every string of a JSON value (keys too) as PostgreSQL JSONB holds it: no NUL character."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and (why := unstorable(item)):
            raise ValueError(f"has a string that {why}")
    return value


def not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


# The same rules, stated in the OpenAPI document so that clients (and the schema fuzzer) know them.
# Unpaired surrogates need no pattern: JSON text cannot carry them (a body with one is a 400).
NO_NUL = r"^[^\u0000]*$"
NOT_BLANK = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"

def _whole(value: object) -> object:
    """JSON has one number type: 300.0 is the integer 300 (JSON Schema agrees); 300.5 stays a float and
    is refused by the strict int that follows."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def rfc3339(value: object) -> datetime.datetime:
    """An RFC 3339 time with its offset (`2026-12-01T10:00:00Z`): a time without one names no instant."""
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 time (a string) such as 2026-12-01T10:00:00Z")
    try:
        at = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an RFC 3339 time such as 2026-12-01T10:00:00Z") from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("must carry a UTC offset (Z or +hh:mm), like 2026-12-01T10:00:00Z")
    if at.astimezone(datetime.UTC).year >= 9000:  # its deadline must stay within the calendar's years
        raise ValueError("must be before the year 9000")
    return at


RunAt = Annotated[datetime.datetime, BeforeValidator(rfc3339),
                  Field(json_schema_extra={"pattern": "^[0-8][0-9]{3}-"})]


# An integer as JSON Schema has it: a number without a fractional part; never a string or a bool.
Whole = Annotated[int, BeforeValidator(_whole)]

Text = Annotated[str, AfterValidator(storable), Field(json_schema_extra={"pattern": NO_NUL})]
JsonObject = Annotated[dict[str, Any], AfterValidator(storable_json)]
Name = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_CHARS, json_schema_extra={"pattern": NOT_BLANK}),
    AfterValidator(storable), AfterValidator(not_blank),
]


def _agent_ref(value: str) -> str:
    try:
        parse_ref(value)
    except Refused as e:
        raise ValueError(e.problems[0].problem) from None
    return value


MAX_SUB_AGENTS = 64
# An agent's name, or name@version; the pattern is stated for clients, the validator words the problem.
AgentRef = Annotated[str, AfterValidator(_agent_ref), Field(json_schema_extra={"pattern": AGENT_REF})]


def _whole_counts(value: object) -> object:
    """JSON's 3.0 is the integer 3 for the policy's counts, as for every other count (Whole)."""
    if isinstance(value, dict):
        return {k: _whole(v) if k in ("triggerTokens", "keepRecentTurns") else v for k, v in value.items()}
    return value


def _context_policy(value: object) -> dict[str, Any]:
    """The policy as stored and shown (every field); core/context.parse names the field at fault."""
    return parse(value).to_json()


CONTEXT_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "strategy": {"enum": list(STRATEGIES), "default": "auto", "description": "`auto` (the default): "
                     "`server` where the provider supports it, else `summarize`; `server`: the provider compacts; "
                     "`summarize`: the engine summarises old turns (a COMPACT step); `clear_tool_results`: old "
                     "tool results are replaced by a placeholder (a COMPACT step, no model call); `none`: "
                     "nothing is done, and a request that cannot fit fails the run."},
        "triggerTokens": {"type": "integer", "minimum": 1, "maximum": MAX_TRIGGER_TOKENS,
                          "description": "Manage the conversation once a request would pass this many input "
                          "tokens; default 80% of the model's window."},
        "keepRecentTurns": {"type": "integer", "minimum": 0, "maximum": MAX_KEEP_RECENT_TURNS, "default": 2,
                            "description": "The most recent turns, never summarised or cleared."},
    },
}
"""The policy's JSON Schema, as the document states it (the validator, core/context.parse, words problems)."""

def _context_schema(schema: dict[str, Any]) -> None:
    schema.clear()
    schema.update(CONTEXT_SCHEMA)


ContextManagement = Annotated[Any, BeforeValidator(_whole_counts), AfterValidator(_context_policy),
                              Field(json_schema_extra=_context_schema)]


def context_shown(stored: dict[str, Any] | None) -> dict[str, Any]:
    """A run's or agent's stored policy as the API shows it: NULL is the default, `auto`, spelt out."""
    return ContextPolicy.of(stored).to_json()


# The base of every shape of the API: camelCase on the wire, snake_case in Python, values that do not change.
class Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


NOT_NULL = ("input", "tokenBudget", "timeoutSeconds", "continueFrom", "forkFrom")

# Which fields a request needs, as JSON Schema (amended into the document by the app): a new run needs
# input and both limits; a continuation its source and input (limits default to the source's); a fork
# its source and no input.
REQUIRED_FIELDS: list[dict[str, Any]] = [
    {"required": ["input", "tokenBudget", "timeoutSeconds"], "not": {"required": ["forkFrom"]}},
    {"required": ["continueFrom", "input"], "not": {"required": ["forkFrom"]}},
    {"required": ["forkFrom"], "not": {"anyOf": [{"required": ["input"]}, {"required": ["continueFrom"]}]}},
    # An agent gives what it defines (budgets included); what it leaves out the request must give.
    {"required": ["agent", "input"], "not": {"anyOf": [{"required": ["forkFrom"]}, {"required": ["continueFrom"]}]}},
]


class ForkFrom(Camel):
    model_config = ConfigDict(extra="forbid", strict=True)

    run_id: uuid.UUID = Field(strict=False, description="The run to fork.")
    seq: Whole = Field(ge=1, le=MAX_SEQ, description="How many of its steps the fork starts with (1..its steps).")


WEBHOOK_URL = r"^[hH][tT][tT][pP][sS]?://([^\s/?#@\[\]:]+|\[[0-9a-fA-F:.]+\])(:[0-9]{1,5})?([/?#][^\s]*)?$"
"""The URL's form as the document states it; which hosts it may name is the server's URL policy."""


class WebhookRequest(Camel):
    """Where to tell of the run's status changes (docs/guides/webhooks.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: Annotated[str, Field(min_length=1, max_length=MAX_URL_CHARS, pattern=WEBHOOK_URL,
                              description="An http or https URL. Loopback, "
                              "private, link-local, CGNAT, multicast and metadata addresses are refused (at "
                              "submission for a literal address, at each attempt after resolving a name) unless "
                              "the server's AGENTRUN_WEBHOOK_ALLOW names them.")]
    events: list[Literal["finished", "waiting"]] = Field(
        ["finished"], min_length=1, max_length=2,
        description="`finished`: the run ended (SUCCEEDED, FAILED, CANCELLED, TIMED_OUT); `waiting`: it parked "
        "WAITING. Default: finished.")
    secret_ref: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, description="The name of one of "
                                     "the server's webhook secrets (AGENTRUN_WEBHOOK_SECRETS) the deliveries are "
                                     "signed with.")]

    def as_stored(self) -> dict[str, Any]:
        return {"url": self.url, "events": list(dict.fromkeys(self.events)), "secretRef": self.secret_ref}


class RunRequest(Camel):
    """A run to start. Unknown fields are refused, so a misspelt budget does not pass unnoticed."""

    # strict: a number must be a JSON number and text a JSON string; nothing is coerced (but see Whole).
    model_config = ConfigDict(extra="forbid", strict=True,  # merged with Camel's
                              json_schema_extra={"not": {"anyOf": [
                                  {"required": ["runAt", "delaySeconds"]}, {"required": ["agent", "continueFrom"]},
                                  {"required": ["agent", "forkFrom"]}]}})

    input: Annotated[
        str, Field(min_length=1, description="The user's request: the first message (with `continueFrom`, the "
                   "next one). Required, except with `forkFrom`, which takes none.",
                   json_schema_extra={"pattern": NOT_BLANK}),
        AfterValidator(storable), AfterValidator(not_blank),
    ] | None = None
    model: Name | None = Field(None, description="Model name; when absent the source's (with `continueFrom` or "
                               "`forkFrom`), else the server's default model.")
    token_budget: Annotated[Whole, Field(gt=0, le=MAX_TOKEN_BUDGET)] | None = Field(
        None,
        description="Tokens the run may spend, all kinds. Required, except with `continueFrom` or `forkFrom` "
        "(then the source's).",
    )
    timeout_seconds: Annotated[Whole, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] | None = Field(
        None,
        description="Wall-clock limit (at most 7 days). Required, except with `continueFrom` or `forkFrom`.",
    )
    max_steps: Whole = Field(DEFAULT_MAX_STEPS, gt=0, le=MAX_STEPS, description="Most steps (model and tool) the "
                             "run may take; with `continueFrom` or `forkFrom`, the source's when absent.")
    tools: list[Name] | None = Field(
        None, max_length=MAX_TOOLS, description="Tools the model may call; when absent the source's (with "
        "`continueFrom` or `forkFrom`), else every tool of the worker.",
    )
    system: Text | None = Field(None, description="System prompt.")
    cost_budget_usd: float | None = Field(
        None, ge=float(MIN_COST_BUDGET_USD), le=MAX_COST_BUDGET_USD,
        description="Optional spending limit in USD, kept to the micro-dollar (6 decimal places).",
    )

    require_approval: list[Name] | None = Field(
        None, max_length=MAX_TOOLS,
        description='Tools whose every call waits for a person\'s approval in this run; "*" for every tool.',
    )
    continue_from: uuid.UUID | None = Field(
        None, strict=False,
        description="A SUCCEEDED run whose whole conversation this run goes on with; `input` is the next user message.",
    )
    fork_from: ForkFrom | None = Field(
        None, description="Start from the first `seq` steps of another run, whatever its status (no `input`).",
    )
    output_schema: JsonObject | None = Field(
        None, description="A JSON Schema (an object): the run's answer must be JSON valid against it, and "
        "`output` is then that JSON value.",
    )

    @model_validator(mode="before")
    @classmethod
    def _absent_not_null(cls, data: Any) -> Any:
        """These may be left out (see each), but not sent as null: the document says so too."""
        if isinstance(data, dict):
            for key in NOT_NULL:
                if key in data and data[key] is None:
                    raise PydanticCustomError("not_null", "{key}: may be left out, but must not be null",
                                              {"key": key})
        return data
    priority: Whole = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY,
                            description="Higher first among claimable runs; equal priorities oldest first.")
    run_at: RunAt | None = Field(None, description="RFC 3339 time before which no worker claims the run; its "
                                 "timeout counts from then. Not with `delaySeconds`.")
    delay_seconds: float | None = Field(None, ge=0, le=MAX_DELAY_SECONDS,
                                        description="Seconds from now before the run may be claimed; its "
                                        "timeout counts from then. Not with `runAt`.")

    agent: AgentRef | None = Field(
        None, description="An agent definition (`researcher`, or `researcher@3` for that version; else the latest) "
        "whose fields the run takes where the request gives none; the run is pinned to that version "
        "(`agentVersion`). Budgets, `maxSteps` and `timeoutSeconds` given here may only be lower than the "
        "agent's. Not with `continueFrom` or `forkFrom`: those keep their source's agent.")
    sub_agents: list[AgentRef] | None = Field(
        None, max_length=MAX_SUB_AGENTS, description="Agents this run may hand work to (`name` or `name@N`), "
        "pinned at submission (`name@version`); when absent the agent's, or the source's.")
    webhook: WebhookRequest | None = Field(
        None, description="Signed HTTP POSTs of the run's JSON when it finishes (or waits): docs/guides/webhooks.md. "
        "When absent the agent's, or the source's (with `continueFrom` or `forkFrom`).")
    context_management: ContextManagement | None = Field(
        None, description="How the conversation is kept within the model's context window (docs/guides/"
        "context-management.md): `{strategy, triggerTokens?, keepRecentTurns?}`. When absent the agent's, "
        "or the source's (with `continueFrom` or `forkFrom`), else `{\"strategy\": \"auto\"}`.")

    labels: dict[str, str] | None = Field(
        None, max_length=MAX_LABELS, json_schema_extra={
            "propertyNames": {"pattern": KEY_PATTERN, "maxLength": MAX_PREFIX + 1 + MAX_NAME},
            "additionalProperties": {"type": "string", "pattern": VALUE_PATTERN, "maxLength": MAX_NAME}},
        description="Labels to find the run by (`{\"team\": \"billing\"}`), in "
        "Kubernetes' syntax: a key is an optional DNS-subdomain prefix and `/`, then a name of at most 63 letters, "
        "digits, `-`, `_` or `.` starting and ending with a letter or digit; a value is empty or a name. A bad one "
        "is a 422 naming `labels.<key>`. When absent the source's (with `continueFrom` or `forkFrom`), else none. "
        "`GET /api/runs?labelSelector=` filters on them.")
    tenant: str | None = Field(
        None, min_length=1, max_length=63, pattern=TENANT_PATTERN,
        description="The tenant the run belongs to. When absent the caller's: its identity's tenant (`tenant` in "
        "AGENTRUN_API_TOKENS), or with `continueFrom`/`forkFrom` the source's; `default` for a platform "
        "operator's identity (tenant `\"*\"`) and on an open API. Only a platform operator's identity may name a "
        "tenant other than its own (else 403); a continuation or fork is always its source's tenant's.")

    @model_validator(mode="after")
    def _one_schedule(self) -> RunRequest:
        if {"run_at", "delay_seconds"} <= self.model_fields_set:
            raise ValueError("give runAt or delaySeconds, not both")
        return self

    def cost_budget(self) -> Decimal | None:
        # Through str: the decimal the client wrote, not the binary float nearest to it; then rounded as
        # the NUMERIC(14, 6) column will store it, so an idempotent retry compares equal to what was stored.
        if self.cost_budget_usd is None:
            return None
        return Decimal(str(self.cost_budget_usd)).quantize(MIN_COST_BUDGET_USD, rounding=ROUND_HALF_UP)

    def spec(self) -> RunSpec:
        """The request as the submission policy reads it: a field left out (or null) is None."""
        return RunSpec(
            input=self.input, model=self.model, token_budget=self.token_budget, timeout_seconds=self.timeout_seconds,
            # The schema's default stands for "absent", which a continuation fills from its source.
            max_steps=self.max_steps if "max_steps" in self.model_fields_set else None,
            tools=tuple(self.tools) if self.tools is not None else None, system=self.system,
            cost_budget_usd=self.cost_budget(),
            require_approval=tuple(self.require_approval) if self.require_approval is not None else None,
            output_schema=self.output_schema, continue_from=self.continue_from,
            fork_from=(self.fork_from.run_id, self.fork_from.seq) if self.fork_from is not None else None,
            priority=self.priority, run_at=self.run_at, delay_seconds=self.delay_seconds,
            agent=parse_ref(self.agent) if self.agent is not None else None,
            sub_agents=tuple(self.sub_agents) if self.sub_agents is not None else None,
            labels=dict(self.labels) if self.labels is not None else None,
            webhook=self.webhook.as_stored() if self.webhook is not None else None,
            context_management=self.context_management,
        )


class RunCreated(Camel):
    id: uuid.UUID
    status: RunStatus


def _usd(value: Decimal | None) -> float | None:
    return float(value) if value is not None else None


class RunView(Camel):
    """A run as it is now."""

    id: uuid.UUID
    status: RunStatus
    input: str
    model: str
    system: str | None
    tools: list[str] | None
    token_budget: int
    tokens_used: int
    cost_budget_usd: float | None
    cost_usd: float | None = Field(description="USD spent so far; null when unknown: the run's model has no "
                                   "price and nothing the run did was priced.")
    max_steps: int
    timeout_seconds: int
    deadline_at: datetime.datetime
    cancel_requested: bool
    steps: int = Field(description="The highest step seq written so far.")
    error: str | None
    locked_by: str | None = Field(description="The worker holding the run, or the one that finished it; null "
                                  "while no worker holds it (queued, handed back, waiting for a decision).")
    created_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    k8s_namespace: str | None = Field(
        default=None, serialization_alias="k8sNamespace",
        description="The namespace of the AgentRun this run mirrors, if any.",
    )
    k8s_name: str | None = Field(default=None, serialization_alias="k8sName", description="The name of that AgentRun.")
    created_by: str | None = Field(
        default=None, description="Who created the run: an API identity's name, `k8s:<namespace>/<user>` "
        "or `k8s` for an AgentRun, null when the API was open.",
    )
    cancelled_by: str | None = Field(
        default=None, description="Who first asked the run to stop, named as `createdBy`; null if no one did.",
    )
    pending: int = Field(0, description="While WAITING, how much it waits on: tool calls waiting for a person's "
                         "decision, its sub-agents at work, or 1 for a timer or an event (GET /api/runs/{id}/pending "
                         "lists them); 0 in any other status.")
    output: Any = Field(
        None, description="The answer of a SUCCEEDED run: the text of its final assistant message, or the JSON "
        "value of a structured answer (with `outputSchema`); null otherwise.",
    )
    require_approval: list[str] | None = Field(None, description="Tools whose calls wait for approval in this run.")
    output_schema: dict[str, Any] | None = Field(None, description="The JSON Schema the answer must satisfy.")
    parent_run_id: uuid.UUID | None = Field(
        None, description="The run this one was continued or forked from; for a sub-agent's run (one with "
        "`parentToolUseId`), the run whose sub-agent call started it.")
    forked_at_seq: int | None = Field(None, description="A fork: how many of the parent's steps it started with.")
    priority: int = Field(0, description="Higher first among claimable runs.")
    run_at: datetime.datetime | None = Field(
        None, description="When the run became (or becomes) claimable: its schedule, or the end of a backoff "
        "after a model API outage handed it back.")
    model_retries: int = Field(0, description="Handbacks in a row after a model step ran out of retries on a "
                               "retryable error (an API outage); reset by a model step that succeeds.")
    lease_epoch: int = Field(0, description="Claims of the run so far; every write of a worker names the claim "
                             "it holds the run under, and tools see it (`ToolContext.lease_epoch`).")
    agent: str | None = Field(None, description="The agent definition the run was made from (or its source was).")
    agent_version: int | None = Field(None, description="The version of that agent the run is pinned to.")
    sub_agents: list[str] | None = Field(None, description="The agents the run may hand work to, pinned: "
                                         "`name@version`.")
    messages_sent: int = Field(0, description="Messages posted to the run (POST /api/runs/{id}/messages).")
    messages_delivered: int = Field(0, description="Of those, delivered to the model as USER steps; the rest "
                                    "wait for the run's next turn boundary.")
    # Sub-agents (the run's place in its tree, and the tree's spending).
    parent_tool_use_id: str | None = Field(None, description="A sub-agent's run: the `tool_use` id of the parent's "
                                           "call that started it (the parent is `parentRunId`); null otherwise.")
    root_run_id: uuid.UUID | None = Field(None, description="The top run of its tree of sub-agents: its own id "
                                          "for a run no other run started.")
    depth: int = Field(0, description="Sub-agent calls between the root run and this one (0: the root).")
    tokens_used_total: int = Field(0, description="`tokensUsed` and what every descendant (sub-agent run) has "
                                   "spent, those still at work included: the run's budget bounds this sum.")
    cost_usd_total: float | None = Field(0, description="`costUsd` and its descendants', as `tokensUsedTotal`; "
                                         "null when unknown, as `costUsd`.")
    labels: dict[str, str] = Field(default_factory=dict, description="The run's labels (`labels` of the request, "
                                   "an AgentRun's `metadata.labels`, or its source's).")
    children_active: int = Field(0, description="Sub-agent runs it started that have not finished yet.")
    waiting_for: Literal["children", "decisions", "timer", "event"] | None = Field(
        None, description="While WAITING, what for: `children` (its sub-agents' runs), `decisions` (people), "
        "`timer` (a `wait` call) or `event` (an event posted to POST /api/events; GET /api/runs/{id}/pending "
        "says which); null in any other status.")

    schedule_name: str | None = Field(None, description="The schedule whose tick created the run (null: none).")
    scheduled_time: datetime.datetime | None = Field(None, description="That tick, RFC 3339.")
    tenant: str = Field("default", description="The tenant the run belongs to: only identities of that tenant "
                        "(or of every tenant, `\"*\"`) see it.")
    throttled: dict[str, Any] | None = Field(
        None, description="While QUEUED and held back by its tenant's quota, why: `{quota, until, reason}` "
        "(`until`: when the quota's window allows it again, RFC 3339); null otherwise.")
    origin: str | None = Field(
        None, description="Which way the run came in: `api` (POST /api/runs: a new run, a continuation or a "
        "fork), `operator` (an AgentRun), `schedule` (a schedule's tick), `child` (a parent's sub-agent call) or "
        "`replay` (a replay of a recorded run, POST /api/replays); null for a run made before it was recorded. "
        "Read-only.")
    replay_id: uuid.UUID | None = Field(None, description="The replay the run is part of; null for every other "
                                        "run. Read-only.")
    replay_of: uuid.UUID | None = Field(None, description="A replay run: the recorded run it replays. Read-only.")
    tool_policy: str | None = Field(
        None, description="A replay run: how its tool calls are served, `recorded` or `recorded_then_live_readonly` "
        "(docs/api.md \"Tool calls in a replay\"); "
        "null for every other run. Read-only.")
    webhook: dict[str, Any] | None = Field(
        None, description="`{url, events, secretRef}`: where the run's status changes are posted; its deliveries "
        "are at /api/runs/{id}/webhooks.")
    context_management: dict[str, Any] = Field(
        default_factory=lambda: context_shown(None), description="How the run's conversation is kept within "
        "the model's window: `{strategy, keepRecentTurns, triggerTokens?}` (docs/guides/context-management.md"
        "); `{\"strategy\": \"auto\", \"keepRecentTurns\": 2}` when it named none.")

    @classmethod
    def of(cls, run: Run, prices: PriceTable | None = None) -> RunView:
        """`prices`: the table that tells an unknown cost (null) from a nought; without it a cost is a number."""
        unknown = cost_unknown(run, prices)
        return cls(
            id=run.id, status=run.status, input=run.input, model=run.model, system=run.system,
            tools=list(run.tools) if run.tools is not None else None, token_budget=run.token_budget,
            tokens_used=run.tokens_used, cost_budget_usd=_usd(run.cost_budget_usd),
            cost_usd=None if unknown else float(run.cost_usd),
            max_steps=run.max_steps, timeout_seconds=run.timeout_seconds, deadline_at=run.deadline_at,
            cancel_requested=run.cancel_requested, steps=run.steps, error=run.error, locked_by=run.locked_by,
            created_at=run.created_at, started_at=run.started_at, finished_at=run.finished_at,
            k8s_namespace=run.k8s_namespace, k8s_name=run.k8s_name, created_by=run.created_by,
            cancelled_by=run.cancelled_by, pending=run.pending, output=run.output,
            require_approval=list(run.require_approval) if run.require_approval is not None else None,
            output_schema=run.output_schema, parent_run_id=run.parent_run_id, forked_at_seq=run.forked_at_seq,
            priority=run.priority, run_at=run.run_at, model_retries=run.model_retries, lease_epoch=run.lease_epoch,
            agent=run.agent, agent_version=run.agent_version,
            sub_agents=list(run.sub_agents) if run.sub_agents is not None else None,
            messages_sent=run.messages_sent, messages_delivered=run.messages_delivered,
            schedule_name=run.schedule_name, scheduled_time=run.scheduled_time, origin=run.origin,
            replay_id=run.replay_id, replay_of=run.replay_of,
            tool_policy=run.tool_policy,
            tenant=run.tenant, throttled=run.throttled if run.status is RunStatus.QUEUED else None,
            webhook=run.webhook,
            context_management=context_shown(run.context_management), labels=dict(run.labels),
            **_tree_fields(run, unknown),
        )


def cost_unknown(run: Run, prices: PriceTable | None) -> bool:
    """Whether the run's cost is unknown rather than nought: its model has no price and nothing it (or a
    descendant) did was priced. A step of an unpriced model costs null, so such a run's 0 says nothing."""
    return prices is not None and prices.price(run.model) is None and run.cost_usd_total == 0


def agent_ref(run: Run) -> str | None:
    """The agent the run was made from, pinned: `name@version` (null when none)."""
    if run.agent is None:
        return None
    return f"{run.agent}@{run.agent_version}" if run.agent_version is not None else run.agent


def _tree_fields(run: Run, unknown: bool = False) -> dict[str, Any]:
    """The run's place among sub-agents and its tree's totals, as RunView fields."""
    waiting: str | None = None
    if run.status is RunStatus.WAITING:
        waiting = run.waiting_for if run.waiting_for in ("children", "timer", "event") else "decisions"
    return dict(
        parent_tool_use_id=run.parent_tool_use_id, root_run_id=run.root_run_id or run.id, depth=run.depth,
        tokens_used_total=run.tokens_used_total, cost_usd_total=None if unknown else float(run.cost_usd_total),
        children_active=run.children_active, waiting_for=waiting,
    )


class RunSummary(Camel):
    """A run in a list: its counters and the start of its input (GET /api/runs/{id} has all of it)."""

    id: uuid.UUID
    status: RunStatus
    input_preview: str
    model: str
    tokens_used: int
    cost_usd: float | None = Field(description="USD spent so far; null when unknown (an unpriced model).")
    cost_usd_total: float | None = Field(None, description="`costUsd` and its sub-agents' runs'; null when unknown.")
    steps: int
    error: str | None
    locked_by: str | None
    created_at: datetime.datetime
    started_at: datetime.datetime | None = Field(None, description="When a worker first claimed it.")
    finished_at: datetime.datetime | None
    created_by: str | None = Field(default=None, description="Who created the run, as in the run's `createdBy`.")
    labels: dict[str, str] = Field(default_factory=dict, description="The run's labels.")
    tenant: str = Field("default", description="The tenant the run belongs to.")
    parent_run_id: uuid.UUID | None = Field(None, description="The run it continues, forks, or was started by "
                                            "(a sub-agent's).")
    agent: str | None = Field(None, description="The agent it was made from, pinned: `name@version`.")
    replay_id: uuid.UUID | None = Field(None, description="The replay this run is part of; null for every other run.")
    replay_of: uuid.UUID | None = Field(None, description="A replay's run: the recorded run it replays.")

    @classmethod
    def of(cls, run: Run, prices: PriceTable | None = None) -> RunSummary:
        preview = run.input if len(run.input) <= PREVIEW_CHARS else run.input[: PREVIEW_CHARS - 1] + "…"
        unknown = cost_unknown(run, prices)
        return cls(
            id=run.id, status=run.status, input_preview=preview, model=run.model, tokens_used=run.tokens_used,
            cost_usd=None if unknown else float(run.cost_usd),
            cost_usd_total=None if unknown else float(run.cost_usd_total), steps=run.steps, error=run.error,
            locked_by=run.locked_by, created_at=run.created_at, started_at=run.started_at,
            finished_at=run.finished_at, created_by=run.created_by, labels=dict(run.labels), tenant=run.tenant,
            parent_run_id=run.parent_run_id, agent=agent_ref(run), replay_id=run.replay_id, replay_of=run.replay_of,
        )


class RunPage(Camel):
    """One page of runs, newest first. `next` is the cursor of the following page: pass it as `after`.
    It is null on the last page."""

    items: list[RunSummary]
    next: uuid.UUID | None


class DecisionView(Camel):
    """What a person decided about a tool call (or that it waits for them)."""

    kind: DecisionKind
    attempt: int = Field(description="The executions of the call started when it was asked (0: an approval before "
                         "any); the decision authorises the next one only.")
    decision: Decision | None = Field(description="null while the call waits.")
    reason: str | None
    is_error: bool
    since: datetime.datetime
    decided_at: datetime.datetime | None
    decided_by: str | None = Field(description="Who decided: the identity, `reconcile` for the tool's reconcile "
                                   "probe, null on an open API.")

    @classmethod
    def of(cls, call: PendingCall) -> DecisionView:
        return cls(kind=call.kind, attempt=call.attempt, decision=call.decision, reason=call.reason,
                   is_error=call.is_error, since=call.since, decided_at=call.decided_at, decided_by=call.decided_by)


class TimelineStep(Camel):
    """A step without its request and response bodies. A tool call that waits for a person and has no step
    yet is listed too, with `status: "WAITING"` and no seq; in a run that has ended (cancelled or timed out
    while it waited) such a call never ran: `status: "ABANDONED"`."""

    seq: int | None
    kind: StepKind
    tool_name: str | None
    tool_use_id: str | None
    status: StepStatus | Literal["WAITING", "ABANDONED"]
    stop_reason: str | None
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cost_usd: float | None
    latency_ms: int | None
    attempts: int
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    worker: str | None
    inherited: bool = Field(False, description="Copied from the run this one was continued or forked from.")
    decisions: list[DecisionView] = Field(
        default_factory=list, description="What people decided about this tool call (approval, in doubt)."
    )
    created_by: str | None = Field(None, description="A USER step that delivered a message posted to the run: "
                                   "who sent it, named as the run's `createdBy` (null on an open API).")
    compaction: dict[str, Any] | None = Field(None, description="A COMPACT step: what it did, its request as "
                                              "JSON (`strategy`, `keepFromSeq`, `coversSeqs` [first, last], "
                                              "`estimatedTokens`, `window`, `triggerTokens`) and `cleared`, the "
                                              "tool results it replaced (clear_tool_results); null for other kinds.")
    recorded_seq: int | None = Field(None, description="A TOOL step of a replay run served from the recording "
                                     "(its tool never ran): the seq of the recorded run's step whose result it got; "
                                     "null for a step that ran.")

    @classmethod
    def waiting(cls, call: PendingCall, decided: list[PendingCall], *, abandoned: bool = False) -> TimelineStep:
        """A call waiting for a person that has no step row yet (`abandoned`: its run has ended)."""
        return cls(seq=None, kind=StepKind.TOOL, tool_name=call.tool_name, tool_use_id=call.tool_use_id,
                   status="ABANDONED" if abandoned else "WAITING", stop_reason=None, input_tokens=0, output_tokens=0,
                   cache_creation_input_tokens=0, cache_read_input_tokens=0, cost_usd=None, latency_ms=None,
                   attempts=0, started_at=None, finished_at=None, worker=None, inherited=False, created_by=None,
                   compaction=None, recorded_seq=None, decisions=[DecisionView.of(d) for d in decided])

    @classmethod
    def fields_of(cls, step: Step) -> dict[str, object]:
        return dict(
            seq=step.seq, kind=step.kind, tool_name=step.tool_name, tool_use_id=step.tool_use_id,
            status=step.status, stop_reason=step.stop_reason, input_tokens=step.input_tokens,
            output_tokens=step.output_tokens, cache_creation_input_tokens=step.cache_creation_input_tokens,
            cache_read_input_tokens=step.cache_read_input_tokens, cost_usd=_usd(step.cost_usd),
            latency_ms=step.latency_ms, attempts=step.attempts, started_at=step.started_at,
            finished_at=step.finished_at, worker=step.worker, inherited=step.inherited, created_by=step.created_by,
            compaction=compaction_of(step), recorded_seq=step.recorded_seq,
        )

    @classmethod
    def of(cls, step: Step) -> TimelineStep:
        return cls(**cls.fields_of(step))  # type: ignore[arg-type]


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def compaction_of(step: Step) -> dict[str, Any] | None:
    """A COMPACT step's request as JSON, with `cleared`: how many tool results it replaced (its response
    lists them; a summary's response is text). Anything unreadable shows as an empty object, never a 500."""
    if step.kind is not StepKind.COMPACT:
        return None
    request = _json_or_none(step.request)
    out: dict[str, Any] = dict(request) if isinstance(request, dict) else {}
    if out.get("strategy") == "clear_tool_results":
        cleared = _json_or_none(step.response)
        out["cleared"] = len(cleared) if isinstance(cleared, list) else 0
    return out


class StepDetail(TimelineStep):
    """A step with its bodies: MODEL request summary and content blocks, TOOL input and output (JSON text),
    COMPACT what it covers (request) and the summary or the cleared results (response)."""

    request: str | None
    response: str | None
    context: dict[str, Any] | None = Field(None, description="A MODEL step: what was done to keep its request "
                                           "within the window, from its request summary (`strategy`, "
                                           "`estimatedTokens`, `window`, `contextTokens`, `compacted`, "
                                           "`clearedToolUses`); null when the summary has none.")
    sent: dict[str, Any] | None = Field(None, description="A MODEL step: its request as it was sent, "
                                        "`{system, tools, messages}` (the system prompt, the tool definitions, "
                                        "the messages), rebuilt by replay of the steps before it; null for other "
                                        "kinds.")

    @classmethod
    def of(cls, step: Step) -> StepDetail:
        context = None
        if step.kind is StepKind.MODEL and isinstance(summary := _json_or_none(step.request), dict):
            context = summary.get("context") if isinstance(summary.get("context"), dict) else None
        return cls(**cls.fields_of(step), request=step.request, response=step.response,  # type: ignore[arg-type]
                   context=context)


class WhoAmI(BaseModel):
    """The caller: the name of the identity its token stands for, and what it may do."""

    name: str | None = Field(description="The identity's name; null when the server requires no token.")
    scopes: list[Scope] = Field(description="Its scopes, `admin` expanded into all the others.")
    tenant: str = Field("*", description="The tenant whose runs it sees and acts on; `*` for every tenant's (a "
                        "platform operator's identity, AGENTRUN_API_TOKEN's, or anyone on an open API).")


class PendingView(BaseModel):
    """A tool call waiting for a person's decision, or (kind `children`) a sub-agent call waiting for its
    child run to finish, or (kinds `timer`, `event`) a wait: those take no decision."""

    toolUseId: str  # noqa: N815 - the API's JSON names
    tool: str
    input: Any = Field(description="The call's input, as the model gave it.")
    kind: DecisionKind | Literal["children", "timer", "event"]
    attempt: int = Field(default=0, description="The executions of the call started so far (0: an approval "
                         "before any); a call in doubt again after a retried execution was interrupted asks again, "
                         "one more. 0 for a sub-agent call.")
    since: datetime.datetime
    childRunId: uuid.UUID | None = Field(  # noqa: N815
        default=None, description="Kind `children`: the sub-agent's run the call waits for; null for a decision.")
    wakeAt: datetime.datetime | None = Field(  # noqa: N815
        default=None, description="Kind `timer`: when it fires (RFC 3339).")
    key: str | None = Field(default=None, description="Kind `event`: the key of the event it waits for.")
    timeoutAt: datetime.datetime | None = Field(  # noqa: N815
        default=None, description="Kind `event`: when the wait times out (its result is then an error).")

    @classmethod
    def of(cls, call: PendingCall) -> PendingView:
        return cls(toolUseId=call.tool_use_id, tool=call.tool_name,
                   input=orjson.loads(call.input) if call.input else None, kind=call.kind, attempt=call.attempt,
                   since=call.since)

    @classmethod
    def of_wait(cls, wait: PendingWait, steps: Sequence[Step]) -> PendingView:
        """A timer or an event the run waits for, with the call that asked for it (its STARTED step)."""
        step = next((s for s in steps if s.tool_use_id == wait.tool_use_id), None)
        args = orjson.loads(step.request) if step is not None and step.request else None
        since = wait.since or wait.wake_at
        if wait.kind == "timer":
            return cls(toolUseId=wait.tool_use_id or "", tool=step.tool_name or "" if step else "", input=args,
                       kind="timer", since=since, wakeAt=wait.wake_at)
        return cls(toolUseId=wait.tool_use_id or "", tool=step.tool_name or "" if step else "", input=args,
                   kind="event", since=since, key=wait.key, timeoutAt=wait.wake_at)

    @classmethod
    def of_child(cls, child: Run) -> PendingView:
        """A sub-agent call the run waits for: its child run, not finished yet."""
        return cls(toolUseId=child.parent_tool_use_id or "", tool=TOOL_PREFIX + (child.agent or ""),
                   input={"task": child.input}, kind="children", since=child.created_at, childRunId=child.id)


class DecisionRequest(Camel):
    """A decision on a pending call: `approve`/`deny` for an approval, `retry`/`record`/`fail` for a call in
    doubt. `record` needs `output` (what the call returned; `isError` says whether it failed)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "anyOf": [{"properties": {"decision": {"not": {"const": "record"}}}},
                  {"required": ["output"], "properties": {"output": {"type": "string"}}}],
    })

    decision: Decision = Field(strict=False, description="approve | deny | retry | record | fail")
    output: Text | None = Field(None, max_length=1_000_000, description="With `record`: what the call returned.")
    is_error: bool = Field(False, description="With `record`: the call failed (the model sees an error result).")
    reason: Text | None = Field(None, max_length=10_000, description="Why; the model sees it when a call is denied.")


class FieldProblem(BaseModel):
    field: str = Field(description="Where: a body field (`tokenBudget`, `tools[1]`), a path or query parameter.")
    problem: str


class ErrorBody(BaseModel):
    """Every error answer: a one-line message, and for bad input the fields at fault."""

    error: str
    fields: list[FieldProblem] = []


class QuotaErrorBody(ErrorBody):
    """A 429: a new run its tenant's quota refuses. The `Retry-After` header says when to ask again."""

    quota: str = Field(description="The quota that refused it: `maxQueued`, `tokensPerDay` or `costPerDayUsd`.")
    retryAfter: int = Field(description="Seconds after which a submit may be admitted (as `Retry-After`): when "
                            "the rolling day's window allows again, for a budget; a guess, for a full queue.")


class MessageRequest(Camel):
    """A message for a run while it works: the model gets it as a user turn at the run's next turn boundary."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: Annotated[
        str, Field(min_length=1, max_length=MAX_MESSAGE_CHARS, json_schema_extra={"pattern": NOT_BLANK},
                   description=f"The message (1 to {MAX_MESSAGE_CHARS} characters, not blank)."),
        AfterValidator(storable), AfterValidator(not_blank),
    ]


class MessageView(Camel):
    """A message posted to a run: `seq` is the USER step that delivered it, null while it waits."""

    run_id: uuid.UUID
    n: int = Field(description="1, 2, ...: the order the run received its messages in, which is the order the "
                   "model gets them.")
    text: str
    created_by: str | None = Field(description="Who sent it, named as the run's `createdBy`.")
    created_at: datetime.datetime
    seq: int | None = Field(description="The USER step that delivered it; null until it is delivered.")

    @classmethod
    def of(cls, message: Message) -> MessageView:
        return cls(run_id=message.run_id, n=message.n, text=message.text, created_by=message.created_by,
                   created_at=message.created_at, seq=message.seq)


class WebhookAttemptView(Camel):
    attempt: int = Field(description="1 for the first attempt.")
    started_at: datetime.datetime
    status_code: int | None = Field(description="The receiver's HTTP status; null when it gave none (refused, "
                                    "unreachable, timed out).")
    latency_ms: int | None
    error: str | None = Field(description="Why the attempt failed; null for a 2xx.")
    worker: str | None = Field(None, description="The worker that sent it.")


class WebhookDeliveryView(Camel):
    """One delivery of a run's webhook: one status change, sent until answered 2xx or given up."""

    id: str = Field(description="The `webhook-id` header, the same on every attempt: receivers deduplicate by it.")
    event: Literal["finished", "waiting"]
    run_status: RunStatus = Field(description="The status the run changed to. The body shows the run as it was "
                                  "when the attempt was sent.")
    url: str
    secret_ref: str
    state: Literal["PENDING", "DELIVERED", "FAILED"] = Field(
        description="PENDING: not delivered yet (retried with backoff); DELIVERED: answered 2xx; FAILED: given up.")
    attempts: int
    next_attempt_at: datetime.datetime | None = Field(description="While PENDING, when it is due next.")
    created_at: datetime.datetime
    done_at: datetime.datetime | None
    last_error: str | None
    history: list[WebhookAttemptView] = Field(description="Every attempt, first first.")

    @classmethod
    def of(cls, d: Delivery) -> WebhookDeliveryView:
        return cls(
            id=f"msg_{d.id.hex}", event=d.event, run_status=RunStatus(d.run_status), url=d.url,  # type: ignore[arg-type]
            secret_ref=d.secret_ref, state=d.state, attempts=d.attempts,  # type: ignore[arg-type]
            next_attempt_at=d.next_at if d.state == "PENDING" else None, created_at=d.created_at, done_at=d.done_at,
            last_error=d.last_error,
            history=[WebhookAttemptView(attempt=a.attempt, started_at=a.started_at, status_code=a.status_code,
                                        latency_ms=a.latency_ms, error=a.error, worker=a.worker) for a in d.history],
        )
