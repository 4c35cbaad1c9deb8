"""Operator settings: built once at start from flags and environment, then passed down."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.tenants import tenant_problem


@dataclasses.dataclass(frozen=True)
class OperatorSettings:
    database_url: str
    """libpq connection string or URL (AGENTRUN_DATABASE_URL, or the file AGENTRUN_DATABASE_URL_FILE names)."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch (kopf patterns allowed); empty means the whole cluster."""

    standalone: bool = True
    """No kopf peering: a single operator replica needs no KopfPeering objects, so it is the default."""

    peering_name: str | None = None
    """A KopfPeering name: only then do several replicas coordinate and one of them serve (not standalone)."""

    tool_names: frozenset[str] | None = None
    """Tool names the workers offer, to reject a spec naming others at once. None: no check (the run
    would then fail in the worker, or the model would just not see the tool)."""

    debounce_seconds: float = 0.2
    """How long a change notification waits for more: a busy run changes many times a second, and
    one status patch for a burst is enough. Small enough that status lags by well under a second."""

    resync_seconds: float = 60.0
    """Period of the safety-net sweep over unfinished linked runs (one query), for notifications lost
    while the listener was reconnecting."""

    schedule_status_seconds: float = 10.0
    """How often each AgentSchedule's status is refreshed from its schedule (last and next tick, active runs)."""

    retry_seconds: float = 5.0
    """First delay before a handler retries when the database is unreachable; it doubles up to a minute."""

    pool_size: int = 4
    """Database connections: handlers and the status sync write little."""

    prices: PriceTable | None = None
    """The workers' price table (AGENTRUN_PRICES_FILE), to refuse a cost budget on a model it does not
    price, which no worker could enforce. None: the table shipped with the package."""

    port: int | None = 8081
    """Where /healthz and /readyz are served; None serves none. Not the workers' 8080, so both can run
    on one machine."""

    health_host: str = "0.0.0.0"
    """Address the health endpoints listen on: the kubelet probes the pod's IP."""

    namespace_tenants: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The tenant of each namespace's AgentRuns, Agents and AgentSchedules (AGENTRUN_NAMESPACE_TENANTS, the
    chart's `tenants.namespaces`); a namespace not named is the tenant of its own name."""

    def tenant_of(self, namespace: str) -> str:
        """The tenant whose runs a namespace's resources make."""
        return self.namespace_tenants.get(namespace, namespace)

    db_retry_max_seconds: float = 10.0
    """Longest pause between two attempts to reach and migrate the database at start: an outage is
    waited out (not-ready), never a crash loop."""


def namespace_tenants(text: str | None) -> dict[str, str]:
    """AGENTRUN_NAMESPACE_TENANTS: a JSON object of namespace → tenant (empty or unset: none). ValueError
    saying what is wrong."""
    if not text or not text.strip():
        return {}
    try:
        found = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"AGENTRUN_NAMESPACE_TENANTS: not JSON: {e}") from None
    if not isinstance(found, dict):
        raise ValueError("AGENTRUN_NAMESPACE_TENANTS: must be a JSON object of namespace to tenant")
    for namespace, tenant in found.items():
        if (bad := tenant_problem(tenant, f"AGENTRUN_NAMESPACE_TENANTS[{namespace!r}]")) is not None:
            raise ValueError(bad)
    return dict(found)
