"""Tenants (issue 46): whom a run belongs to, and the names a tenant may have.

A tenant is a name in Kubernetes' DNS-label syntax (a namespace's name is one, so a namespace maps to the
tenant of its own name by default). Runs that name none are the tenant `default`. An API identity of the
tenant `*` is a platform operator's: it belongs to no one tenant and, with `admin`, sees every tenant's runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from decimal import Decimal

DEFAULT_TENANT = "default"
"""The tenant of runs and identities that name none (and of every run made before tenants existed)."""

ALL_TENANTS = "*"
"""The tenant of a platform operator's identity: it acts for every tenant."""

TENANT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A DNS label, as a Kubernetes namespace's name (and the tenant table's CHECK) has it."""

TENANT_PATTERN = f"^{TENANT_NAME.pattern}$"
"""TENANT_NAME anchored, as JSON Schema (the API's `tenant` fields and parameters) reads a pattern."""


def tenant_problem(name: object, where: str = "tenant") -> str | None:
    """Why `name` is not a tenant's name, or None if it is one."""
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
        return (f"{where}: {name!r} is not a tenant name: 1 to 63 lower-case letters, digits or '-', "
                "starting and ending with a letter or digit")
    return None


QUOTAS = ("maxRunning", "maxQueued", "tokensPerDay", "costPerDayUsd")
"""A tenant's limits, as the API, the CLI and a 429's `quota` name them."""

MAX_WEIGHT = 1000.0
"""The largest share weight (the tenant table's CHECK): a tenant a thousand times another's share at most."""
MIN_WEIGHT = 0.001
"""The smallest share weight: a thousandth of the default's."""
MAX_RUN_LIMIT = 2**31 - 1
"""The largest maxRunning or maxQueued (the tenant table's INT)."""
MAX_TOKENS_PER_DAY = 10**15
"""The largest tokensPerDay: far beyond any fleet's day, and well within the table's BIGINT."""
MAX_COST_PER_DAY_USD = 10**9
"""The largest costPerDayUsd (the tenant table's NUMERIC(16, 6) holds less than 10^10)."""


@dataclasses.dataclass(frozen=True)
class Quotas:
    """A tenant's limits (None: no limit) and its share weight. A new tenant has none and weight 1."""

    max_running: int | None = None
    max_queued: int | None = None
    tokens_per_day: int | None = None
    cost_per_day_usd: Decimal | None = None
    weight: float = 1.0

    def problems(self) -> list[tuple[str, str]]:
        """(field, problem) for each value the tenant table would refuse, fields named as the API names them."""
        found = [(field, "must be 0 or more, or null for no limit")
                 for field, value in zip(QUOTAS, (self.max_running, self.max_queued, self.tokens_per_day,
                                                  self.cost_per_day_usd), strict=True)
                 if value is not None and value < 0]
        for field, value, most in zip(QUOTAS, (self.max_running, self.max_queued, self.tokens_per_day,
                                               self.cost_per_day_usd),
                                      (MAX_RUN_LIMIT, MAX_RUN_LIMIT, MAX_TOKENS_PER_DAY, MAX_COST_PER_DAY_USD),
                                      strict=True):
            if value is not None and value > most:
                found.append((field, f"must be at most {most}, or null for no limit"))
        if not (MIN_WEIGHT <= self.weight <= MAX_WEIGHT):
            found.append(("weight", f"must be at least {MIN_WEIGHT:g} and at most {MAX_WEIGHT:g}"))
        return found


@dataclasses.dataclass(frozen=True)
class Throttle:
    """Why a tenant's new runs are refused, or its runs held back before their next model step: the quota
    (one of QUOTAS), until when (None: until its queue has room, which no clock says) and why, in a line."""

    quota: str
    until: datetime.datetime | None
    reason: str

    def json(self) -> dict[str, str | None]:
        """As `run.throttled` holds it (`GET /api/runs/{id}` shows it as `throttled`)."""
        return {"quota": self.quota, "until": self.until.isoformat() if self.until else None, "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class Tenant:
    """A tenant's quotas and what it uses of them now: its runs queued (scheduled and handed-back ones
    included) and running, its tokens and cost over the last 1,440 minutes, the runs held back by a
    quota (`throttled`), and the quota it is over now, if any (`over`)."""

    name: str
    quotas: Quotas
    queued: int = 0
    running: int = 0
    tokens_today: int = 0
    cost_today_usd: Decimal = Decimal(0)
    throttled: int = 0
    over: Throttle | None = None
    configured_at: datetime.datetime | None = None
    """When its quotas were last set through the API or the CLI; None: never (the chart's may apply)."""
    updated_at: datetime.datetime | None = None


def over_budget(quotas: Quotas, tokens: int, cost: Decimal, tokens_until: datetime.datetime | None,
                cost_until: datetime.datetime | None) -> Throttle | None:
    """The daily budget a tenant that spent `tokens` and `cost` over the last 1,440 minutes is at or over
    (tokens first), with when the rolling window allows again; None if it is within both."""
    if quotas.tokens_per_day is not None and tokens >= quotas.tokens_per_day:
        return Throttle("tokensPerDay", tokens_until, f"tenant used {tokens} tokens of its {quotas.tokens_per_day} "
                        "per day (the last 1,440 minutes)")
    if quotas.cost_per_day_usd is not None and cost >= quotas.cost_per_day_usd:
        return Throttle("costPerDayUsd", cost_until, f"tenant spent ${cost:.4f} of its "
                        f"${quotas.cost_per_day_usd} per day (the last 1,440 minutes)")
    return None
