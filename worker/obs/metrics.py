"""Prometheus metrics of a worker, in its own registry: tokens, cost, step latency, runs by status, leases,
tool threads.

`Metrics` implements the engine's `Observer`. The runs-by-status gauge is read from the database at
scrape time (one GROUP BY) and cached for a few seconds, so a fleet of workers scraped together does
not hammer PostgreSQL.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentrun.worker.core.observer import NoObserver
from agentrun.worker.core.records import RunStatus
from agentrun.worker.core.types import Usage
from agentrun.worker.store.groupcommit import BatchStats

log = logging.getLogger(__name__)

# Every series a worker exports, as Prometheus shows them. The Helm chart's tests read this list.
METRIC_NAMES: tuple[str, ...] = (
    "agentrun_tokens_total",
    "agentrun_cost_usd_total",
    "agentrun_step_latency_seconds",
    "agentrun_runs",
    "agentrun_claims_total",
    "agentrun_lease_takeovers_total",
    "agentrun_lease_lost_total",
    "agentrun_model_retries_total",
    "agentrun_tool_errors_total",
    "agentrun_runs_in_flight",
    "agentrun_tool_threads_running",
    "agentrun_tool_threads_overdue",
    "agentrun_decisions_total",
    "agentrun_waiting_seconds",
    "agentrun_pruned_rows_total",
    "agentrun_model_limit_waits_total",
    "agentrun_model_limit_wait_seconds_total",
    "agentrun_model_limit_use",
    "agentrun_model_limit",
    "agentrun_writes_total",
    "agentrun_write_batches_total",
    "agentrun_events_received_total",
    "agentrun_event_runs_woken_total",
    "agentrun_schedule_runs_total",
    "agentrun_schedule_missed_total",
    # Completion webhooks (docs/guides/webhooks.md).
    "agentrun_webhook_deliveries_total",
    "agentrun_webhook_failures_total",
    # Tenants (docs/guides/tenants.md), read from the database.
    "agentrun_tenant_runs",
    "agentrun_tenant_throttled_runs",
    "agentrun_tenant_tokens_day",
    "agentrun_tenant_cost_usd_day",
)

WEBHOOK_OUTCOMES = ("delivered", "http_error", "redirect", "timeout", "refused", "connect_error", "no_secret",
                    "no_run", "error")
"""The `outcome` of agentrun_webhook_deliveries_total (runtime/webhooks.py `Outcome.kind`)."""

# Model steps take seconds and tools anything from milliseconds to minutes.
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)

RunCounter = Callable[[], Awaitable[Mapping[str, int]]]
TenantCounter = Callable[[], Awaitable[Sequence[Mapping[str, Any]]]]
"""Each tenant's load (store/tenants.py `count_by_tenant`): `tenant`, `queued`, `running`, `waiting`, `throttled`,
`tokens` and `cost_usd` of the rolling day."""


class ThreadCounts(Protocol):
    """What the tool-thread gauges read (the tool box's `ToolThreads`): observability watches the tools
    through this, as the engine's `Observer` watches a run, and never imports them."""

    @property
    def running(self) -> int: ...

    @property
    def overdue(self) -> int: ...


class _RunsByStatus(Collector):
    """`agentrun_runs{status}` from the last database count; every status is always present."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("agentrun_runs", "Runs in the database by status", labels=["status"])
        for status in RunStatus:
            family.add_metric([status.value], self.counts.get(status.value, 0))
        yield family


class _Tenants(Collector):
    """`agentrun_tenant_*`: each tenant's runs by status, runs held back by a quota, and what it spent in the
    rolling last day, from the last database count (as `agentrun_runs`)."""

    def __init__(self) -> None:
        self.rows: Sequence[Mapping[str, Any]] = ()

    def collect(self) -> Iterator[Metric]:
        runs = GaugeMetricFamily("agentrun_tenant_runs", "Unfinished runs of each tenant by status",
                                 labels=["tenant", "status"])
        throttled = GaugeMetricFamily(
            "agentrun_tenant_throttled_runs", "Queued runs of each tenant held back by its quotas: by a daily "
            "budget, or ready while the tenant is at its maxRunning", labels=["tenant"])
        tokens = GaugeMetricFamily("agentrun_tenant_tokens_day", "Tokens each tenant's model steps spent in the "
                                   "rolling last day (what tokensPerDay bounds)", labels=["tenant"])
        cost = GaugeMetricFamily("agentrun_tenant_cost_usd_day", "Cost in USD of each tenant's model steps in the "
                                 "rolling last day (what costPerDayUsd bounds)", labels=["tenant"])
        for row in self.rows:
            name = str(row["tenant"])
            for status in ("queued", "running", "waiting"):
                runs.add_metric([name, status.upper()], int(row[status]))
            throttled.add_metric([name], int(row["throttled"]))
            tokens.add_metric([name], int(row["tokens"]))
            cost.add_metric([name], float(row["cost_usd"]))
        yield from (runs, throttled, tokens, cost)


class _GroupCommit(Collector):
    """`agentrun_writes_total` and `agentrun_write_batches_total`, read from the batcher at scrape time."""

    def __init__(self) -> None:
        self.stats: BatchStats | None = None

    def collect(self) -> Iterator[Metric]:
        stats = self.stats or BatchStats()
        yield CounterMetricFamily("agentrun_writes", "Fenced writes of held runs sent", value=stats.writes)
        yield CounterMetricFamily(
            "agentrun_write_batches", "Batches those writes went in (group commit: one round trip and one "
            "commit each)", value=stats.batches,
        )


class Metrics(NoObserver):
    """The Prometheus side of the `Observer` seam; the hooks it does not override (spans) observe nothing."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        count_runs: RunCounter | None = None,
        cache_seconds: float = 5.0,
        count_tenants: TenantCounter | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._count_runs = count_runs
        self._cache_seconds = cache_seconds
        self._counted_at: float | None = None
        r = self.registry
        self.tokens = Counter(
            "agentrun_tokens", "Tokens billed by model steps", ["model", "direction"], registry=r
        )
        self.cost = Counter("agentrun_cost_usd", "Cost of model steps in USD", ["model"], registry=r)
        self.latency = Histogram(
            "agentrun_step_latency_seconds", "Duration of steps", ["kind", "outcome"], registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.claims = Counter("agentrun_claims", "Runs claimed by this worker", registry=r)
        self.takeovers = Counter(
            "agentrun_lease_takeovers", "Claims of a running run whose holder's lease had lapsed", registry=r
        )
        self.lease_losses = Counter(
            "agentrun_lease_lost", "Runs this worker was driving when another took them over", registry=r
        )
        self.retries = Counter("agentrun_model_retries", "Model calls retried, by HTTP status", ["status"], registry=r)
        self.tool_errors = Counter("agentrun_tool_errors", "Tool calls that ended in an error", ["tool"], registry=r)
        self.runs_in_flight = Gauge("agentrun_runs_in_flight", "Runs this worker drives now", registry=r)
        self.tool_threads_running = Gauge(
            "agentrun_tool_threads_running", "Threads running a synchronous tool now", registry=r
        )
        self.tool_threads_overdue = Gauge(
            "agentrun_tool_threads_overdue",
            "Threads still running a synchronous tool whose call timed out or was cancelled (threads "
            "cannot be killed; each keeps its slot in the bounded tool pool until the tool returns)",
            registry=r,
        )
        self.decisions = Counter(
            "agentrun_decisions", "Decisions people made on tool calls, by kind and decision",
            ["kind", "decision"], registry=r,
        )
        self.waiting = Histogram(
            "agentrun_waiting_seconds", "How long runs waited for people, from parking to the decision that "
            "queued them again", registry=r, buckets=(1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
        )
        for kind, answers in (("approval", ("approve", "deny")), ("in_doubt", ("retry", "record", "fail"))):
            for answer in answers:
                self.decisions.labels(kind, answer)
        self.pruned_rows = Counter(
            "agentrun_pruned_rows", "Rows deleted by retention, by table", ["table"], registry=r
        )
        for table in ("run", "run_step", "run_lease", "run_decision"):  # seen before the first prune
            self.pruned_rows.labels(table)
        # Schedules (issue 27): runs their ticks created, and ticks skipped past startingDeadlineSeconds.
        self.schedule_runs = Counter("agentrun_schedule_runs", "Runs created by schedule ticks", registry=r)
        self.schedule_missed = Counter(
            "agentrun_schedule_missed", "Schedule ticks missed (past startingDeadlineSeconds, or older ticks of a "
            "catch-up after an outage): no run", registry=r)
        # Completion webhooks: every attempt by its outcome (delivered, http_error, redirect, timeout,
        # refused, connect_error, no_secret, no_run), and the failed ones among them.
        self.webhook_deliveries = Counter(
            "agentrun_webhook_deliveries", "Webhook delivery attempts, by outcome", ["outcome"], registry=r)
        self.webhook_failures = Counter(
            "agentrun_webhook_failures", "Webhook delivery attempts that failed (any outcome but delivered)",
            registry=r)
        for outcome in WEBHOOK_OUTCOMES:  # each series there from the start, so a rate sees the first attempt
            self.webhook_deliveries.labels(outcome)
        self.limit_waits = Counter(
            "agentrun_model_limit_waits", "Model calls that waited for a fleet-wide limit", ["model"], registry=r
        )
        self.limit_wait_seconds = Counter(
            "agentrun_model_limit_wait_seconds", "Seconds model calls waited for a fleet-wide limit", ["model"],
            registry=r,
        )
        self.limit_use = Gauge(
            "agentrun_model_limit_use", "Fleet-wide use of a model limit at this worker's last reservation",
            ["limit", "kind"], registry=r,
        )
        self.limit_value = Gauge(
            "agentrun_model_limit", "A model limit in force (tightened after a 429)", ["limit", "kind"], registry=r,
        )
        self.events = Counter("agentrun_events_received", "Events posted to POST /api/events (retries replayed "
                              "not counted)", registry=r)
        self.events_woke = Counter("agentrun_event_runs_woken", "Waiting runs an event posted woke", registry=r)
        self._runs = _RunsByStatus()
        r.register(self._runs)
        self._writes = _GroupCommit()
        r.register(self._writes)
        self._tenants = _Tenants()
        r.register(self._tenants)
        self._count_tenants = count_tenants
        for kind in ("MODEL", "TOOL"):  # so dashboards see the series before the first step
            for outcome in ("ok", "error"):
                self.latency.labels(kind, outcome)

    def decided(self, kind: str, decision: str, waited_seconds: float | None) -> None:
        """A decision was stored; `waited_seconds` when it was the last open one and queued the run again."""
        self.decisions.labels(kind, decision).inc()
        if waited_seconds is not None:
            self.waiting.observe(waited_seconds)

    # -- the Observer seam -------------------------------------------------------------------------

    def event_posted(self, woke: int) -> None:
        self.events.inc()
        self.events_woke.inc(woke)

    def model_step(self, model: str, usage: Usage, cost_usd: Decimal | None, seconds: float, ok: bool) -> None:
        self.latency.labels("MODEL", "ok" if ok else "error").observe(seconds)
        for direction, n in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_write", usage.cache_creation_input_tokens),
            ("cache_read", usage.cache_read_input_tokens),
        ):
            self.tokens.labels(model, direction).inc(n)
        if cost_usd is not None:
            self.cost.labels(model).inc(float(cost_usd))

    def tool_step(self, tool: str, seconds: float, ok: bool) -> None:
        self.latency.labels("TOOL", "ok" if ok else "error").observe(seconds)
        if not ok:
            self.tool_errors.labels(tool).inc()

    def claimed(self, takeover: bool, run_id: uuid.UUID | None = None, taken_from: str | None = None) -> None:
        self.claims.inc()
        if takeover:
            self.takeovers.inc()

    def lease_lost(self) -> None:
        self.lease_losses.inc()

    def in_flight(self, runs: int) -> None:
        self.runs_in_flight.set(runs)

    def schedule_ticked(self, created: int, missed: int) -> None:
        self.schedule_runs.inc(created)
        self.schedule_missed.inc(missed)

    def watch_tool_threads(self, threads: ThreadCounts) -> None:
        """Read the tool-thread gauges from `threads` at scrape time."""
        self.tool_threads_running.set_function(lambda: threads.running)
        self.tool_threads_overdue.set_function(lambda: threads.overdue)

    def watch_writes(self, stats: BatchStats) -> None:
        """Read the group-commit counters from `stats` at scrape time."""
        self._writes.stats = stats

    def count_runs_with(self, count_runs: RunCounter, count_tenants: TenantCounter | None = None) -> None:
        """Set where the runs-by-status and the tenant gauges read from, once the database pool exists."""
        self._count_runs = count_runs
        self._count_tenants = count_tenants

    def model_retry(self, status: int) -> None:
        self.retries.labels(str(status)).inc()

    def pruned(self, pruned: Any) -> None:
        """Rows one retention batch deleted (`retention.Pruned`)."""
        for table, n in pruned.rows.items():
            self.pruned_rows.labels(table).inc(n)

    def webhook_attempted(self, outcome: str, given_up: bool) -> None:
        self.webhook_deliveries.labels(outcome).inc()
        if outcome != "delivered":
            self.webhook_failures.inc()

    def limit_waited(self, model: str, seconds: float) -> None:
        self.limit_waits.labels(model).inc()
        self.limit_wait_seconds.labels(model).inc(seconds)

    def limit_seen(self, limit: str, kind: str, use: float, value: float) -> None:
        """Use vs limit of one kind (concurrent, requests_per_minute, tokens_per_minute)."""
        self.limit_use.labels(limit, kind).set(use)
        self.limit_value.labels(limit, kind).set(value)

    # -- scraping ---------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Recount runs by status unless the last count is fresh; on failure keep the last count."""
        now = time.monotonic()
        if self._count_runs is None or (
            self._counted_at is not None and now - self._counted_at < self._cache_seconds
        ):
            return
        try:
            self._runs.counts = dict(await self._count_runs())
            if self._count_tenants is not None:
                self._tenants.rows = list(await self._count_tenants())
        except Exception as e:
            log.warning("metrics: cannot count runs by status and tenant: %s", e)
            return
        self._counted_at = now

    async def exposition(self) -> bytes:
        """The text a scrape of /metrics returns."""
        await self.refresh()
        return generate_latest(self.registry)
