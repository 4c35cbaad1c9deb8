"""`agentrun worker`: the worker's settings from its flags and environment, then the worker (worker/serve.py)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from typing import TYPE_CHECKING, Any

from agentrun.worker.cli.arguments import database_url, module_list, positive_int

if TYPE_CHECKING:
    from agentrun.worker.settings import WorkerSettings


def cmd_worker(args: argparse.Namespace) -> int:
    settings = worker_settings(args)  # before the imports below: a bad setting exits with its message alone
    from agentrun.worker.runtime.presence import DuplicateWorker
    from agentrun.worker.serve import serve_worker

    try:
        return asyncio.run(serve_worker(settings, migrate_first=not args.no_migrate))
    except DuplicateWorker as e:
        raise SystemExit(f"agentrun: {e}") from None


def worker_id(args: argparse.Namespace) -> str:
    """`--id` exactly, or `--id-prefix` (else host-pid) with a suffix new with every process."""
    from agentrun.worker.settings import default_worker_id, process_worker_id

    return str(args.id) if args.id else process_worker_id(args.id_prefix) if args.id_prefix else default_worker_id()


def worker_settings(args: argparse.Namespace) -> WorkerSettings:
    """The flags of `agentrun worker`, and for what has no flag (or a flag left out) the environment."""
    from agentrun.worker.settings import WorkerSettings

    return WorkerSettings(
        database_url=database_url(args),
        worker_id=worker_id(args),
        concurrency=args.concurrency,
        lease_seconds=args.lease_seconds,
        poll_interval=args.poll_interval,
        shutdown_grace=args.shutdown_grace,
        port=args.port,
        host=args.host,
        tool_modules=module_list(os.environ.get("AGENTRUN_TOOLS", "")),
        mcp_servers_file=os.environ.get("AGENTRUN_MCP_SERVERS") or None,
        max_tokens=args.max_tokens,
        default_model=os.environ.get("AGENTRUN_DEFAULT_MODEL", WorkerSettings.default_model),
        prices_file=os.environ.get("AGENTRUN_PRICES_FILE") or None,
        providers_file=os.environ.get("AGENTRUN_PROVIDERS") or None,
        pool_size=args.pool_size or min(max(args.concurrency, 1) + 2, 20),
        api_token=os.environ.get("AGENTRUN_API_TOKEN") or None,
        api_tokens_file=os.environ.get("AGENTRUN_API_TOKENS") or None,
        max_body_bytes=args.max_body_bytes
        or _env_positive_int("AGENTRUN_MAX_BODY_BYTES", WorkerSettings.max_body_bytes),
        liveness_lock=not args.no_liveness_lock and _env_flag("AGENTRUN_LIVENESS_LOCK", True),
        max_crash_claims=args.max_crash_claims
        or _env_positive_int("AGENTRUN_MAX_CRASH_CLAIMS", WorkerSettings.max_crash_claims),
        max_agent_depth=_env_positive_int("AGENTRUN_MAX_AGENT_DEPTH", WorkerSettings.max_agent_depth),
        max_children_per_turn=_env_positive_int("AGENTRUN_MAX_CHILDREN_PER_TURN", WorkerSettings.max_children_per_turn),
        tool_threads=_env_positive_int("AGENTRUN_TOOL_THREADS", WorkerSettings.tool_threads),
        retention_days=args.retention_days if args.retention_days is not None
        else _env_positive_float("AGENTRUN_RETENTION_DAYS"),
        retention_interval=_env_positive_float("AGENTRUN_RETENTION_INTERVAL_SECONDS")
        or WorkerSettings.retention_interval,
        model_limits_file=os.environ.get("AGENTRUN_MODEL_LIMITS") or None,
        event_retention=_env_duration("AGENTRUN_EVENT_RETENTION", WorkerSettings.event_retention),
        database_retry_max=_env_positive_float("AGENTRUN_DATABASE_RETRY_MAX_SECONDS")
        or WorkerSettings.database_retry_max,
        tenant_quotas=_tenant_quotas(),
        replay_scorers=_replay_scorers(),
        **_webhook_settings(),
    )


def _tenant_quotas() -> Any:
    """The chart's initial quotas per tenant (AGENTRUN_TENANT_QUOTAS), checked here so a bad one exits."""
    from agentrun.worker.settings import tenant_quotas

    try:
        return tenant_quotas(os.environ.get("AGENTRUN_TENANT_QUOTAS"))
    except ValueError as e:
        raise SystemExit(f"agentrun: {e}") from None


def _replay_scorers() -> tuple[str, ...]:
    """The custom scorers replays may name (AGENTRUN_REPLAY_SCORERS), checked here so a bad one exits."""
    from agentrun.worker.core.replays import scorers_setting

    try:
        return scorers_setting(os.environ.get("AGENTRUN_REPLAY_SCORERS"))
    except ValueError as e:
        raise SystemExit(f"agentrun: {e}") from None


def _webhook_settings() -> dict[str, Any]:
    """The completion webhooks' settings (docs/guides/webhooks.md), checked here so a bad one exits."""
    from agentrun.worker.core.webhooks import Allow, Backoff
    from agentrun.worker.settings import WorkerSettings

    allow = os.environ.get("AGENTRUN_WEBHOOK_ALLOW", "")
    try:
        Allow.parse(allow)
        backoff = Backoff.parse(os.environ.get("AGENTRUN_WEBHOOK_BACKOFF"), None, None)
    except ValueError as e:
        raise SystemExit(f"agentrun: {e}") from None
    return {
        "webhook_secrets_file": os.environ.get("AGENTRUN_WEBHOOK_SECRETS") or None,
        "webhook_allow": allow,
        "webhook_timeout": _env_positive_float("AGENTRUN_WEBHOOK_TIMEOUT_SECONDS") or WorkerSettings.webhook_timeout,
        "webhook_backoff": tuple(backoff.first),
        "webhook_backoff_max": _env_positive_float("AGENTRUN_WEBHOOK_BACKOFF_MAX_SECONDS")
        or WorkerSettings.webhook_backoff_max,
        "webhook_give_up": _env_positive_float("AGENTRUN_WEBHOOK_GIVE_UP_SECONDS") or WorkerSettings.webhook_give_up,
        "webhook_poll_interval": _env_positive_float("AGENTRUN_WEBHOOK_POLL_SECONDS")
        or WorkerSettings.webhook_poll_interval,
    }


def _env_positive_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        return positive_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise SystemExit(f"agentrun: {name} must be a positive integer, got {text!r}") from None


def _env_positive_float(name: str) -> float | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SystemExit(f"agentrun: {name} must be a positive number, got {text!r}")
    return value


def _env_duration(name: str, default: float) -> float:
    """Seconds, or a duration like `24h`, `30m`, `2d` (cli/arguments.duration); more than zero."""
    from agentrun.worker.cli.arguments import duration

    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = duration(text)
    except argparse.ArgumentTypeError:
        value = 0.0
    if value <= 0:
        raise SystemExit(f"agentrun: {name} must be a duration of more than zero (like 86400, 24h or 30m), "
                         f"got {text!r}")
    return value


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"agentrun: {name} must be true or false, got {value!r}")
