"""Schedules: a run template started by the clock. When a schedule is due, which ticks a pass takes, and
the template as the workers store and read it. Pure (cronsim computes cron times; no I/O).

Cron: the standard 5 fields (minute, hour, day of month, month, day of week) in an IANA time zone, as
cron reads them (cronsim follows Debian's cron, which Kubernetes CronJob matches on daylight saving
time): a time that a spring-forward skips runs once, at the jump; a time that a fall-back repeats runs
once, at its first occurrence. Intervals (`intervalSeconds`, at least 1) count from the schedule's
anchor (when it was made), in UTC, and know nothing of time zones.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import re
import uuid
import zoneinfo
from decimal import Decimal
from typing import Any

from cronsim import CronSim, CronSimError

from agentrun.worker.core.submission import RunSpec

SCHEDULE_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # a DNS label, as an AgentSchedule's name
_NAME = re.compile(SCHEDULE_NAME)
DEFAULT_STARTING_DEADLINE_SECONDS = 60
MAX_STARTING_DEADLINE_SECONDS = 366 * 24 * 3600
MAX_INTERVAL_SECONDS = 366 * 24 * 3600
MAX_CRON_CHARS = 200
MAX_TIMEZONE_CHARS = 64
MAX_MISSED_ROWS = 100
"""Missed ticks of one catch-up written as tick rows (as Kubernetes CronJob looks back at most 100
schedules); the rest are counted only."""
MAX_CRON_CATCH_UP = 100_000  # cron ticks a pass steps through after an outage before it jumps to the latest


class ConcurrencyPolicy(enum.StrEnum):
    ALLOW = "Allow"  # a tick starts its run whatever runs of the schedule are still active
    FORBID = "Forbid"  # a tick while a run of the schedule is active is skipped
    REPLACE = "Replace"  # a tick cancels the active runs of the schedule and starts its own


@dataclasses.dataclass(frozen=True)
class Schedule:
    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    run: dict[str, Any]  # the template as given
    spec: dict[str, Any]  # the template as the workers read it (`spec_json`)
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    starting_deadline_seconds: int = DEFAULT_STARTING_DEADLINE_SECONDS
    suspend: bool = False
    anchor: datetime.datetime | None = None
    next_due_at: datetime.datetime | None = None
    last_schedule_time: datetime.datetime | None = None
    last_error: str | None = None
    missed: int = 0
    active: int = 0  # runs of the schedule not finished (reads only)
    k8s_namespace: str | None = None
    k8s_name: str | None = None
    created_at: datetime.datetime | None = None
    created_by: str | None = None
    updated_at: datetime.datetime | None = None
    tenant: str = "default"  # whose schedule: its ticks make runs of this tenant


def name_problem(name: str) -> str | None:
    if not _NAME.fullmatch(name):
        return ("must be a DNS label: 1 to 63 lowercase letters, digits and '-', starting and ending with a "
                "letter or digit")
    return None


def timezone_problem(tz: str) -> str | None:
    """Why `tz` names no IANA time zone, or None."""
    if not tz or len(tz) > MAX_TIMEZONE_CHARS or "\x00" in tz or tz.startswith("/") or ".." in tz:
        return "must name an IANA time zone, such as UTC or Europe/Berlin"
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return f"names no IANA time zone known here: {tz!r} (such as UTC or Europe/Berlin)"
    return None


def cron_problem(cron: str) -> str | None:
    """Why `cron` is no standard 5-field cron expression, or None."""
    if len(cron) > MAX_CRON_CHARS or not cron.isascii() or not cron.isprintable():
        return f"must be a 5-field cron expression of at most {MAX_CRON_CHARS} printable ASCII characters"
    if len(cron.split()) != 5:
        return "must be a standard 5-field cron expression (minute hour day-of-month month day-of-week)"
    try:
        it = CronSim(cron, datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC))
        next(it)
    except CronSimError as e:
        return f"is no valid cron expression: {e}"
    except StopIteration:
        return "never matches a time"
    return None


def timing_problem(s: Schedule) -> str | None:
    """Why the ticks of a stored schedule cannot be worked out here, or None: its cron expression or time
    zone, checked when it was stored, may no longer pass (a time zone tzdata has since dropped)."""
    if s.interval_seconds is not None:
        return None  # counted in UTC: no time zone
    if s.cron is None or (why := cron_problem(s.cron)) is not None:
        return f"cron {why or 'is missing'}"
    if (why := timezone_problem(s.timezone)) is not None:
        return f"timezone {why}"
    return None


def next_time(s: Schedule, after: datetime.datetime) -> datetime.datetime | None:
    """The schedule's first tick strictly after `after` (aware), in UTC; None if there is none."""
    after = after.astimezone(datetime.UTC)
    if s.interval_seconds is not None:
        anchor = (s.anchor or after).astimezone(datetime.UTC).replace(microsecond=0)
        if after < anchor:
            return anchor
        k = math.floor((after - anchor).total_seconds() / s.interval_seconds) + 1
        t = anchor + datetime.timedelta(seconds=k * s.interval_seconds)
        while t <= after:  # float rounding
            t += datetime.timedelta(seconds=s.interval_seconds)
        return t
    assert s.cron is not None
    local = after.astimezone(zoneinfo.ZoneInfo(s.timezone))
    try:
        t = next(CronSim(s.cron, local))
    except StopIteration:
        return None
    return t.astimezone(datetime.UTC)


@dataclasses.dataclass(frozen=True)
class Due:
    """What a pass over a due schedule does at `now`: the tick to run (None: none), the older ticks it
    missed (at most MAX_MISSED_ROWS of them listed; `missed` counts them all), and the next due time."""

    run: datetime.datetime | None
    missed_times: tuple[datetime.datetime, ...]
    missed: int
    next_due: datetime.datetime | None


def due(s: Schedule, now: datetime.datetime) -> Due:
    """The ticks from `s.next_due_at` up to `now`: the latest runs if it is within the starting deadline,
    the older ones are missed (and so is the latest when it is late). At most one catch-up run per pass."""
    first = s.next_due_at
    if first is None or first > now:
        return Due(None, (), 0, first)
    listed: list[datetime.datetime] = []
    if s.interval_seconds is not None:
        step = datetime.timedelta(seconds=s.interval_seconds)
        count = math.floor((now - first) / step) + 1  # ticks first, first + step, ... at or before now
        latest = first + (count - 1) * step
        listed = [first + i * step for i in range(min(count - 1, MAX_MISSED_ROWS))]
        older = count - 1
    else:
        latest, older, t = first, 0, first
        while older < MAX_CRON_CATCH_UP:
            following = next_time(s, t)
            if following is None or following > now:
                break
            if len(listed) < MAX_MISSED_ROWS:
                listed.append(t)
            older, t = older + 1, following
        latest = t
        if older >= MAX_CRON_CATCH_UP:  # a very long outage: the latest tick at or before now, counted roughly
            back = next(CronSim(s.cron or "", now.astimezone(zoneinfo.ZoneInfo(s.timezone)) +
                                datetime.timedelta(microseconds=1), reverse=True)).astimezone(datetime.UTC)
            latest = max(back, t)
    run: datetime.datetime | None = latest
    missed = older
    if (now - latest).total_seconds() > s.starting_deadline_seconds:
        missed += 1
        if len(listed) < MAX_MISSED_ROWS:
            listed.append(latest)
        run = None
    return Due(run, tuple(listed), missed, next_time(s, max(now, latest)))


# The run template, as the workers read it: RunSpec's fields in JSON. A schedule's run has no source
# (continueFrom, forkFrom) and no time of its own (runAt, delaySeconds): its tick is its time.
_SCALARS = ("input", "model", "token_budget", "timeout_seconds", "max_steps", "system", "output_schema", "priority",
            "webhook", "context_management")
_TUPLES = ("tools", "require_approval", "sub_agents")


def spec_json(spec: RunSpec) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(spec, k) for k in _SCALARS if getattr(spec, k) is not None}
    out.update({k: list(getattr(spec, k)) for k in _TUPLES if getattr(spec, k) is not None})
    if spec.cost_budget_usd is not None:
        out["cost_budget_usd"] = str(spec.cost_budget_usd)
    if spec.agent is not None:
        out["agent"] = [spec.agent[0], spec.agent[1]]
    return out


def spec_of(data: dict[str, Any]) -> RunSpec:
    fields: dict[str, Any] = {k: data[k] for k in _SCALARS if data.get(k) is not None}
    fields.update({k: tuple(data[k]) for k in _TUPLES if data.get(k) is not None})
    if data.get("cost_budget_usd") is not None:
        fields["cost_budget_usd"] = Decimal(data["cost_budget_usd"])
    if data.get("agent") is not None:
        fields["agent"] = (data["agent"][0], data["agent"][1])
    return RunSpec(**fields)


def template_problems(spec: RunSpec) -> list[tuple[str, str]]:
    """What a schedule's run may not have: (field, problem) each."""
    problems = []
    for field, value in (("continueFrom", spec.continue_from), ("forkFrom", spec.fork_from),
                         ("runAt", spec.run_at), ("delaySeconds", spec.delay_seconds)):
        if value is not None:
            problems.append((f"run.{field}", "a schedule's run starts at its tick, fresh: leave it out"))
    return problems


def run_id_for(name: str, tick: datetime.datetime, tenant: str = "default") -> uuid.UUID:
    """The id of the run a tick creates: the same on every worker (a second insert conflicts). Another tenant's
    schedule of the same name makes its own (the `default` tenant's ids are those from before tenants, so a
    tick taken across an upgrade makes no second run)."""
    whose = "" if tenant == "default" else f"{tenant}/"
    return uuid.uuid5(uuid.NAMESPACE_URL,
                      f"agentrun:schedule:{whose}{name}:{tick.astimezone(datetime.UTC).isoformat()}")
