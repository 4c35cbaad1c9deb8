"""Worker settings: built once at start from flags and environment, then passed down."""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
from collections.abc import Iterable, Mapping, MutableMapping

from agentrun.worker.core.records import DEFAULT_MODEL
from agentrun.worker.core.tenants import Quotas, tenant_problem

# The secrets the worker and the operator read from the environment, each of which may instead come from
# the file `<NAME>_FILE` names (the chart mounts them so: a file is not in `kubectl describe`, in the
# process's environment for every child, or in a crash dump of it). The providers file's `apiKeyEnv`
# variables and the MCP servers file's header variables are added at start (worker/cli/main.py).
SECRET_VARIABLES = (
    "AGENTRUN_DATABASE_URL", "AGENTRUN_API_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "PGPASSWORD",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK",
)


def secret_from_env(environ: Mapping[str, str], name: str) -> str | None:
    """`name`'s value, or the content of the file `<name>_FILE` names with one trailing newline dropped
    (what `echo` and most editors leave); None when neither is set. Both set is refused rather than one
    preferred, since a stale variable silently winning over a rotated file is the kind of mistake that
    lasts. Raises ValueError naming the variables, or the file and why it cannot be read."""
    file_var = f"{name}_FILE"
    path = environ.get(file_var)
    if not path:
        return environ.get(name)
    if environ.get(name):
        raise ValueError(f"{name} and {file_var} are both set: set only one of them")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{file_var}: cannot read {path}: {e}") from None
    return text.removesuffix("\n").removesuffix("\r")


def load_secret_files(environ: MutableMapping[str, str], names: Iterable[str] = ()) -> None:
    """Set each secret variable (SECRET_VARIABLES and `names`) whose `<NAME>_FILE` is set from its file,
    once at start, so every reader (this package, the Anthropic SDK, boto3, `${VAR}` in MCP headers, log
    redaction) sees the value as if it had been set directly."""
    for name in dict.fromkeys((*SECRET_VARIABLES, *names)):
        if environ.get(f"{name}_FILE"):
            value = secret_from_env(environ, name)
            if value is not None:
                environ[name] = value


def process_worker_id(prefix: str) -> str:
    """`prefix` (a pod's name, say) and a suffix new with every process (`--id-prefix`). A container
    restarted in the same pod is then a worker of its own: the dead process's liveness lock is free, and
    its runs move at once (suspect, grace, takeover) instead of waiting out the lease under a lock the new
    process would hold under the same id."""
    return f"{prefix}-{secrets.token_hex(3)}"


def default_worker_id() -> str:
    """Host and pid, plus the per-process suffix: in a container the pid is the same at every start."""
    return process_worker_id(f"{socket.gethostname()}-{os.getpid()}")


# A tenant's quotas as AGENTRUN_TENANT_QUOTAS (and the API) name them; null or left out: no limit.
QUOTA_FIELDS = {"maxRunning": "max_running", "maxQueued": "max_queued", "tokensPerDay": "tokens_per_day",
                "costPerDayUsd": "cost_per_day_usd", "weight": "weight"}


def tenant_quotas(text: str | None) -> dict[str, Quotas]:
    """AGENTRUN_TENANT_QUOTAS, a JSON object of tenant name → {maxRunning, maxQueued, tokensPerDay, costPerDayUsd,
    weight}; ValueError naming the entry and field at fault."""
    import json
    from decimal import Decimal

    if not text or not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ValueError(f"AGENTRUN_TENANT_QUOTAS is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError("AGENTRUN_TENANT_QUOTAS must be a JSON object of tenant name to quotas")
    found: dict[str, Quotas] = {}
    for name, entry in raw.items():
        where = f"AGENTRUN_TENANT_QUOTAS[{name!r}]"
        if (bad := tenant_problem(name, where)) is not None:
            raise ValueError(bad)
        if not isinstance(entry, dict) or (unknown := set(entry) - set(QUOTA_FIELDS)):
            known = ", ".join(QUOTA_FIELDS)
            raise ValueError(f"{where}: must be an object of {known}" + (f"; unknown: {', '.join(sorted(unknown))}"
                                                                        if isinstance(entry, dict) else ""))
        values: dict[str, object] = {}
        for field, attr in QUOTA_FIELDS.items():
            value = entry.get(field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{where}.{field}: must be a number or null")
            if attr == "cost_per_day_usd":
                values[attr] = Decimal(str(value))
            elif attr == "weight":
                values[attr] = float(value)
            elif float(value).is_integer():
                values[attr] = int(value)
            else:
                raise ValueError(f"{where}.{field}: must be a whole number or null")
        quotas = Quotas(**values)  # type: ignore[arg-type]
        if problems := quotas.problems():
            raise ValueError("; ".join(f"{where}.{f}: {p}" for f, p in problems))
        found[name] = quotas
    return found


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    database_url: str = dataclasses.field(repr=False)
    """libpq connection string or URL (AGENTRUN_DATABASE_URL, or the file AGENTRUN_DATABASE_URL_FILE names). Kept
    out of repr: it may hold a password."""

    worker_id: str = dataclasses.field(default_factory=default_worker_id)
    """The name written into locked_by and every step: unless given, host, pid and a per-process suffix,
    so it is unique, and new when a container restarts."""

    concurrency: int = 4
    """Runs in flight at once. Most of a step is waiting on the model, so this can exceed the cores.
    0 makes an API-only process that never claims. A run whose last write (its end) is on its way no longer
    counts: its successor is claimed while that write commits, so for that moment the worker holds one more."""

    lease_seconds: float = 30.0
    """How long a claim lasts without renewal. The heartbeat renews every third of it while a step runs,
    so it bounds how long a dead worker's runs wait, not how long a step may take."""

    poll_interval: float = 1.0
    """Seconds between claim attempts while idle: the safety net under the wake-up notifications."""

    shutdown_grace: float = 25.0
    """On SIGTERM, how long in-flight steps may take to finish before they are cancelled. Keep it below
    the pod's terminationGracePeriodSeconds."""

    port: int = 8080
    """HTTP port for health, the REST API and metrics."""

    host: str = "0.0.0.0"

    tool_modules: tuple[str, ...] = ()
    """Modules imported at start so their @tool functions are available (AGENTRUN_TOOLS)."""

    mcp_servers_file: str | None = None
    """YAML or JSON file of MCP servers whose tools the worker offers, `servers: [...]`
    (AGENTRUN_MCP_SERVERS; docs/getting-started/first-mcp-server.md). None: Python tools only."""

    max_tokens: int = 4096
    """`max_tokens` of every model request."""

    default_model: str = DEFAULT_MODEL
    """Model for runs that name none and continue or fork none (AGENTRUN_DEFAULT_MODEL)."""

    prices_file: str | None = None
    """Price table overriding the shipped one (AGENTRUN_PRICES_FILE)."""

    providers_file: str | None = None
    """OpenAI-compatible endpoints, `providers: [...]` in YAML or JSON (AGENTRUN_PROVIDERS). None: only the
    built-in providers (Anthropic API, Bedrock, Vertex), so an existing deployment needs nothing new."""

    api_token: str | None = dataclasses.field(default=None, repr=False)
    """Bearer token of the identity `default`, which has every scope (AGENTRUN_API_TOKEN); None with no
    `api_tokens_file` leaves the API open. Health, readiness and metrics stay open either way so probes
    and Prometheus need no secret."""

    api_tokens_file: str | None = None
    """YAML/JSON file of named identities with scopes (AGENTRUN_API_TOKENS), re-read when it changes so
    tokens rotate without a restart. With it or `api_token` set, /api requires a token; see SECURITY.md."""

    max_body_bytes: int = 1024 * 1024
    """Largest request body the API reads (AGENTRUN_MAX_BODY_BYTES). 1 MiB holds any sensible prompt
    and bounds what one request can make the process buffer."""

    metrics_cache_seconds: float = 5.0
    """How long the runs-by-status count behind /metrics is reused, so many workers scraped at once
    run one GROUP BY each per interval rather than one per scrape."""

    liveness_lock: bool = True
    """Hold a session-level advisory lock keyed by the worker id for the worker's whole life, so that
    a RUNNING run whose worker died is claimed at once instead of after its lease (AGENTRUN_LIVENESS_LOCK,
    --no-liveness-lock). Turn it off behind a connection pooler in transaction mode, where a session
    lock does not stay with one client; then a dead worker's runs wait out the lease. Set it the same on
    every worker, and keep worker ids unique: two live workers with one id would defeat it.
    """

    liveness_grace: float | None = None
    """Seconds a holder's liveness lock must stay free before its runs are taken from a live lease; None:
    a thirtieth of the lease, at least 1 s (1 s of the default 30 s). A live worker whose connection
    dropped takes its lock back well within it, and vouches for itself through its pool until then
    (presence.py), so a blip hands no run over, while a killed worker's runs move within about
    poll_interval + this."""

    max_crash_claims: int = 10
    """Claims of a run whose previous holder died (or lost its lease) mid-step, after which the run ends
    FAILED instead of being taken again (AGENTRUN_MAX_CRASH_CLAIMS, --max-crash-claims): a step that
    kills its worker (out of memory, a segfault in a tool) must not kill every worker in turn."""

    max_agent_depth: int = 4
    """Sub-agent calls between a root run and its deepest descendant (AGENTRUN_MAX_AGENT_DEPTH); a call past
    it is an error result the model sees."""

    max_children_per_turn: int = 8
    """Sub-agent calls one model turn may start (AGENTRUN_MAX_CHILDREN_PER_TURN); later ones in the turn are
    error results the model sees."""

    tool_threads: int = 32
    """Synchronous tools running at once (AGENTRUN_TOOL_THREADS). A timed-out tool's thread keeps its slot
    until the tool returns (agentrun_tool_threads_overdue); with every slot busy a call is refused with an
    error the model sees, rather than queued behind them."""

    retention_days: float | None = None
    """Prune runs finished more than this many days ago, with their steps and lease history
    (AGENTRUN_RETENTION_DAYS, --retention-days); None keeps everything. One worker of the fleet prunes
    at a time (an advisory lock), in small batches."""

    retention_interval: float = 600.0
    """Seconds between a worker's pruning passes (AGENTRUN_RETENTION_INTERVAL_SECONDS): ten minutes keeps
    each pass small on a busy database, while the lock makes extra passes of other workers free."""

    event_retention: float = 86400.0
    """Seconds an event posted to POST /api/events is kept (AGENTRUN_EVENT_RETENTION: seconds, or `24h`, `30m`):
    a wait on its key that begins within it still gets it, so a reply that comes before its waiter is not
    lost. Pruned after it by the retention pass. A day covers a tool that sends a mail and a reply that
    beats the model's next step by far."""

    model_limits_file: str | None = None
    """YAML or JSON file of fleet-wide model limits (AGENTRUN_MODEL_LIMITS); None: no limits."""

    tenant_quotas: Mapping[str, Quotas] = dataclasses.field(default_factory=dict)
    """Initial quotas per tenant (AGENTRUN_TENANT_QUOTAS, JSON: the chart's `tenants.quotas`), applied at start to
    each tenant whose quotas were never set through the API or the CLI: those set so win, so a change made at
    run time survives the next rollout. Empty: none."""

    database_retry_max: float = 5.0
    """Longest wait, in seconds, between two attempts to reach an unusable database at start
    (AGENTRUN_DATABASE_RETRY_MAX_SECONDS; the waits double from a quarter second up to it)."""

    # -- completion webhooks (docs/guides/webhooks.md) --
    webhook_secrets_file: str | None = None
    """YAML or JSON file `{"secrets": [{"name", "secret"}]}` of the secrets webhooks are signed with
    (AGENTRUN_WEBHOOK_SECRETS), `whsec_<base64>`; re-read when it changes. None: no secrets, so a request
    naming a webhook is refused (every webhook names its `secretRef`)."""

    webhook_allow: str = ""
    """Comma-separated hosts, addresses and CIDR ranges a webhook may reach though they are loopback, private,
    link-local, CGNAT, multicast or metadata addresses (AGENTRUN_WEBHOOK_ALLOW). Empty: none of those."""

    webhook_timeout: float = 10.0
    """Seconds a receiver has to answer one attempt (AGENTRUN_WEBHOOK_TIMEOUT_SECONDS); a slower one is
    cut off, and the attempt counts as failed and is retried."""

    webhook_backoff: tuple[float, ...] = (5.0, 10.0, 30.0)
    """Waits after the first failed attempts, in seconds (AGENTRUN_WEBHOOK_BACKOFF, comma-separated); after
    them each wait doubles up to `webhook_backoff_max`. Jittered by ±20%."""

    webhook_backoff_max: float = 3600.0
    """Longest wait between two attempts (AGENTRUN_WEBHOOK_BACKOFF_MAX_SECONDS): an hour."""

    webhook_give_up: float = 24 * 3600.0
    """Seconds after the status change past which a delivery is not tried again and ends FAILED
    (AGENTRUN_WEBHOOK_GIVE_UP_SECONDS): a day, long enough to outlast a receiver's outage."""

    webhook_poll_interval: float = 5.0
    """Seconds between looks at the outbox while idle: the safety net under its notifications
    (AGENTRUN_WEBHOOK_POLL_SECONDS)."""

    replay_scorers: tuple[str, ...] = ()
    """Custom scorers a replay may name, each `module:function` (AGENTRUN_REPLAY_SCORERS, comma-separated):
    foreign code the API calls on every replayed run, so only what the operator listed. Empty: the built-in
    ones only (`exact`, `schema_valid`, `same_tool_calls`)."""

    pool_size: int = 10
    """Database connections. Steps hold a connection only while they write, so a few serve many runs."""

    @property
    def takeover_grace(self) -> float:
        return self.liveness_grace if self.liveness_grace is not None else max(self.lease_seconds / 30, 1.0)

    @property
    def pool_max(self) -> int:
        return max(2, self.pool_size)
