"""The values the engine passes around: a run, its steps, and the progress counters of a held run."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import uuid
from decimal import Decimal
from typing import Any

from agentrun.worker.core.types import Usage

DEFAULT_MODEL = "claude-sonnet-4-6"
"""The model of a run that names none and has no source: the CRD's `spec.model` default, and the workers'
unless AGENTRUN_DEFAULT_MODEL says otherwise."""


class RunStatus(str, enum.Enum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    WAITING = "WAITING"  # needs a person's decision; no worker holds it
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"

    @property
    def terminal(self) -> bool:
        return self not in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING)


class Origin(str, enum.Enum):
    """Which way a run came in (runtime/door.py makes every run, and records it)."""

    API = "api"  # POST /api/runs: a new run, a continuation or a fork
    OPERATOR = "operator"  # an AgentRun
    SCHEDULE = "schedule"  # a schedule's tick
    CHILD = "child"  # a parent's sub-agent call
    REPLAY = "replay"  # a replay of a recorded run (runtime/door.py `Door.replay`)


class StepKind(str, enum.Enum):
    MODEL = "MODEL"
    TOOL = "TOOL"
    USER = "USER"  # a user message: the first input of a continued conversation, or the next one
    COMPACT = "COMPACT"  # the turns before a point summarised, or their old tool results cleared (core/context.py)


class DecisionKind(str, enum.Enum):
    APPROVAL = "approval"  # a call of a tool that needs a person's approval
    IN_DOUBT = "in_doubt"  # a non-idempotent call that was running when its worker died


class Decision(str, enum.Enum):
    APPROVE = "approve"
    DENY = "deny"
    RETRY = "retry"
    RECORD = "record"
    FAIL = "fail"

    @property
    def kind(self) -> DecisionKind:
        """The kind of pending call this decision answers."""
        if self in (Decision.APPROVE, Decision.DENY):
            return DecisionKind.APPROVAL
        return DecisionKind.IN_DOUBT


class StepStatus(str, enum.Enum):
    STARTED = "STARTED"  # a tool step whose outcome is not known yet (or never will be: a crash)
    DONE = "DONE"
    ERROR = "ERROR"


@dataclasses.dataclass(frozen=True)
class NewRun:
    """What a caller asks for; the store fills in the rest."""

    input: str
    model: str
    token_budget: int
    timeout_seconds: int
    max_steps: int = 100
    tools: tuple[str, ...] | None = None  # None: every registered tool
    system: str | None = None
    cost_budget_usd: Decimal | None = None
    id: uuid.UUID | None = None  # given by the operator (the AgentRun's uid); random otherwise
    idempotency_key: str | None = None
    k8s_namespace: str | None = None
    k8s_name: str | None = None
    created_by: str | None = None  # the API identity, `k8s:<namespace>/<user>`, or None on an open API
    require_approval: tuple[str, ...] | None = None  # tools whose calls wait for a person; "*": every tool
    output_schema: dict[str, Any] | None = None  # a JSON Schema the final answer must satisfy
    continue_from: uuid.UUID | None = None  # a SUCCEEDED run whose conversation this run goes on with
    fork_from: tuple[uuid.UUID, int] | None = None  # (run, seq): start from that run's first seq steps
    traceparent: str | None = None  # W3C, version 00: the run's trace is a child of the caller's span
    priority: int = 0  # higher first among claimable runs
    run_at: datetime.datetime | None = None  # not claimable before; None: at once (or `delay_seconds` from now)
    delay_seconds: float | None = None  # claimable this long after the insert, by the database's clock
    spawned_by: tuple[uuid.UUID, str] | None = None  # a sub-agent's run: (the parent run, its tool_use id)
    root_run_id: uuid.UUID | None = None  # a sub-agent's run: the top run of its tree
    depth: int = 0  # sub-agent calls between the root and this run
    agent: str | None = None  # the agent definition the run was made from (its fields are applied already)
    agent_version: int | None = None
    sub_agents: tuple[str, ...] | None = None  # pinned: each "name@version"
    schedule_name: str | None = None  # the schedule whose tick created the run
    scheduled_time: datetime.datetime | None = None  # that tick
    webhook: dict[str, Any] | None = None  # {"url", "events", "secretRef"}: told of its status changes
    context_management: dict[str, Any] | None = None  # ContextPolicy.to_json() (core/context.py); None: auto
    labels: dict[str, str] = dataclasses.field(default_factory=dict)  # Kubernetes syntax (core/labels.py)
    origin: Origin | None = None  # the way it came in, set by the door (runtime/door.py)
    tenant: str = "default"  # whose run it is (core/tenants.py): its identity's, its namespace's, its source's
    replay_id: uuid.UUID | None = None  # the replay it is part of (core/recording.py); None for every other run
    replay_of: uuid.UUID | None = None  # a replay run: the recorded run it replays
    tool_policy: str | None = None  # a replay run: how its tool calls are served (a ToolPolicy's value)


@dataclasses.dataclass(frozen=True)
class Run:
    id: uuid.UUID
    status: RunStatus
    input: str
    model: str
    system: str | None
    tools: tuple[str, ...] | None
    token_budget: int
    tokens_used: int
    cost_budget_usd: Decimal | None
    cost_usd: Decimal
    max_steps: int
    timeout_seconds: int
    deadline_at: datetime.datetime
    cancel_requested: bool
    error: str | None
    locked_by: str | None
    locked_until: datetime.datetime | None
    created_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    steps: int
    idempotency_key: str | None = None
    k8s_namespace: str | None = None
    k8s_name: str | None = None
    crashes: int = 0  # claims after which the previous holder had not handed the run back
    model_retries: int = 0  # consecutive model steps that ran out of retries on a retryable error
    created_by: str | None = None
    cancelled_by: str | None = None  # who asked first for the run to stop
    require_approval: tuple[str, ...] | None = None
    output_schema: dict[str, Any] | None = None
    output: Any = None  # the answer of a SUCCEEDED run: its final text, or the JSON value of a structured one
    parent_run_id: uuid.UUID | None = None
    forked_at_seq: int | None = None
    inherited_steps: int = 0
    lease_epoch: int = 0  # claims of the run so far: each one names its fenced writes (store.FENCE)
    pending: int = 0  # undecided calls (or unfinished children) while WAITING
    parent_tool_use_id: str | None = None  # a sub-agent's run: the parent's call that started it
    root_run_id: uuid.UUID | None = None  # a sub-agent's run: the top run of its tree (None: itself)
    depth: int = 0
    children_active: int = 0  # children started and not finished
    children_tokens: int = 0  # what its finished descendants spent
    children_cost: Decimal = Decimal(0)
    waiting_for: str | None = None  # WAITING: "children", or None (decisions)
    children_tokens_live: int = 0  # what its descendants still at work have spent so far (reads only)
    children_cost_live: Decimal = Decimal(0)
    messages_sent: int = 0  # messages posted to the run (POST /api/runs/{id}/messages)
    messages_delivered: int = 0  # of those, delivered as USER steps
    webhook: dict[str, Any] | None = None  # {"url", "events", "secretRef"} (core/webhooks.py)
    context_management: dict[str, Any] | None = None  # {"strategy", ...} as stored (core/context.py); None: auto
    labels: dict[str, str] = dataclasses.field(default_factory=dict)  # what the runs list filters on

    traceparent: str | None = None
    schedule_name: str | None = None  # the schedule whose tick created the run (issue 27)
    scheduled_time: datetime.datetime | None = None
    # The way it came in (an Origin's value); None for a run made before it was recorded (0022_origin.sql).
    # Text, not Origin: a worker must read a run a newer version made, by a way in it does not know.
    origin: str | None = None
    tenant: str = "default"  # whose run it is (core/tenants.py)
    throttled: dict[str, Any] | None = None  # QUEUED, held back by its tenant's quota: {"quota", "until", "reason"}

    @property
    def tokens_used_total(self) -> int:
        """Its own tokens and its descendants' (the parent's budget bounds the sum)."""
        return self.tokens_used + self.children_tokens + self.children_tokens_live

    @property
    def cost_usd_total(self) -> Decimal:
        return self.cost_usd + self.children_cost + self.children_cost_live

    def needs_approval(self, tool: str) -> bool:
        return self.require_approval is not None and ("*" in self.require_approval or tool in self.require_approval)
    priority: int = 0
    run_at: datetime.datetime | None = None  # when the run is (or became) claimable
    agent: str | None = None
    agent_version: int | None = None
    sub_agents: tuple[str, ...] | None = None  # pinned: each "name@version"
    replay_id: uuid.UUID | None = None  # the replay it is part of; None for every other run
    replay_of: uuid.UUID | None = None  # a replay run: the recorded run it replays
    # A replay run: how its tool calls are served (core/recording.py ToolPolicy's value); text, as `origin`.
    tool_policy: str | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    run_id: uuid.UUID
    seq: int
    kind: StepKind
    status: StepStatus
    tool_name: str | None = None
    tool_use_id: str | None = None
    request: str | None = None  # MODEL: a JSON summary of what was sent; TOOL: the tool input as JSON
    response: str | None = None  # MODEL: the content blocks as JSON, verbatim; TOOL: the tool's output
    stop_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cost_usd: Decimal | None = None
    latency_ms: int | None = None
    attempts: int = 1
    worker: str | None = None
    started_at: datetime.datetime | None = None
    finished_at: datetime.datetime | None = None
    inherited: bool = False  # copied from the run this one was continued or forked from
    created_by: str | None = None  # USER: who sent the message (a message posted to the run)
    recorded_seq: int | None = None  # TOOL, in a replay run: served from the recorded run's step of that seq


@dataclasses.dataclass(frozen=True)
class ModelTurn:
    """What a model step checkpoints: the request it sent (summarised), the content it got, and its cost."""

    request: str
    response: str
    stop_reason: str | None
    usage: Usage
    cost_usd: Decimal | None
    latency_ms: int


@dataclasses.dataclass(frozen=True)
class Progress:
    """The counters of a held run as the database saw them at the last fenced write.

    Every fenced write returns them, so the guard needs no extra round trip to learn about a cancel
    request or the budget spent.
    """

    tokens_used: int
    cost_usd: Decimal
    cancel_requested: bool
    db_now: datetime.datetime
    messages: int = 0
    """Messages posted to the run and not yet delivered: the driver delivers them at the next turn boundary."""


@dataclasses.dataclass(frozen=True)
class PendingCall:
    """A tool call that needs a person: waiting for a decision, or decided."""

    run_id: uuid.UUID
    tool_use_id: str
    kind: DecisionKind
    tool_name: str
    input: str | None
    since: datetime.datetime
    decision: Decision | None = None
    output: str | None = None
    is_error: bool = False
    reason: str | None = None
    decided_at: datetime.datetime | None = None
    decided_by: str | None = None
    attempt: int = 0
    """The executions of the call already started when it was asked (0: an approval before any); the
    decision authorises execution `attempt + 1` and no other."""


@dataclasses.dataclass(frozen=True)
class Message:
    """A message posted to a run while it works: delivered as a USER step (`seq`) at its next turn boundary."""

    run_id: uuid.UUID
    n: int  # 1, 2, ...: the order received
    text: str
    created_by: str | None
    created_at: datetime.datetime
    seq: int | None = None  # the USER step that delivered it; None until then
