"""The `agentrun` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentrun.worker import logs

if TYPE_CHECKING:
    from agentrun.worker.settings import WorkerSettings

log = logging.getLogger("agentrun.cli")

DATABASE_HELP = "PostgreSQL URL (default: $AGENTRUN_DATABASE_URL)"


def _database_url(args: argparse.Namespace) -> str:
    url = args.database_url or os.environ.get("AGENTRUN_DATABASE_URL")
    if not url:
        raise SystemExit("agentrun: no database: pass --database-url or set AGENTRUN_DATABASE_URL")
    return str(url)


def _add_database(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", metavar="URL", help=DATABASE_HELP)


# -- migrate ---------------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    from agentrun.worker import migrate

    applied = asyncio.run(migrate.migrate(_database_url(args)))
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print(f"schema is up to date (version {migrate.latest_version()})")
    return 0


# -- worker ----------------------------------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> int:
    from agentrun.worker.settings import WorkerSettings, default_worker_id

    tool_env = os.environ.get("AGENTRUN_TOOLS", "")
    settings = WorkerSettings(
        database_url=_database_url(args),
        worker_id=args.id or default_worker_id(),
        concurrency=args.concurrency,
        lease_seconds=args.lease_seconds,
        poll_interval=args.poll_interval,
        shutdown_grace=args.shutdown_grace,
        port=args.port,
        host=args.host,
        tool_modules=tuple(m.strip() for m in tool_env.split(",") if m.strip()),
        max_tokens=args.max_tokens,
        default_model=os.environ.get("AGENTRUN_DEFAULT_MODEL", "claude-sonnet-4-5"),
        prices_file=os.environ.get("AGENTRUN_PRICES_FILE") or None,
        pool_size=args.pool_size or min(max(args.concurrency, 1) + 2, 20),
        liveness_lock=not args.no_liveness_lock and _env_flag("AGENTRUN_LIVENESS_LOCK", True),
    )
    from agentrun.worker.presence import DuplicateWorker

    try:
        return asyncio.run(serve_worker(settings, migrate_first=not args.no_migrate))
    except DuplicateWorker as e:
        raise SystemExit(f"agentrun: {e}") from None


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"agentrun: {name} must be true or false, got {value!r}")


async def serve_worker(settings: WorkerSettings, migrate_first: bool = True) -> int:
    import uvicorn

    from agentrun.worker import migrate
    from agentrun.worker.api.app import create_app
    from agentrun.worker.db import open_pool
    from agentrun.worker.llm.factory import llm_from_env
    from agentrun.worker.runner import Worker
    from agentrun.worker.store import RunStore
    from agentrun.worker.tools import ToolBox, load_tool_modules

    try:
        tools = ToolBox(load_tool_modules(settings.tool_modules))
    except (ImportError, ValueError) as e:
        raise SystemExit(f"agentrun: cannot load tools from AGENTRUN_TOOLS: {e}") from None
    if migrate_first:
        await migrate.migrate(settings.database_url)
    # An API-only process (--concurrency 0) needs no model.
    llm = llm_from_env(settings) if settings.concurrency > 0 else None
    pool = await open_pool(settings.database_url, max_size=settings.pool_max)
    store = RunStore(pool)
    worker = Worker(settings, store, llm, tools) if llm is not None else None
    stopping = worker.stopping if worker else asyncio.Event()

    def stop() -> None:
        if worker:
            worker.stop()
        stopping.set()

    app = create_app(pool)
    server = uvicorn.Server(
        uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False, lifespan="off")
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    log.info(
        "%s serving on :%d with %d slots, lease %gs, tools: %s",
        settings.worker_id, settings.port, settings.concurrency, settings.lease_seconds, ", ".join(tools.names) or "none",
    )
    http = asyncio.create_task(server.serve())
    try:
        if worker:
            await worker.run()
        else:
            await stopping.wait()
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await http
        await pool.close()
    log.info("%s stopped", settings.worker_id)
    return 0


# -- parser ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrun",
        description="agentrun: a durable runtime for LLM agents on PostgreSQL and Kubernetes.",
        epilog="Environment: AGENTRUN_DATABASE_URL, AGENTRUN_LOG_FORMAT (console|json), AGENTRUN_LOG_LEVEL.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "migrate",
        help="apply the database migrations",
        description="Apply the missing schema migrations, in order, under an advisory lock (safe to run "
        "from many processes at once). Reads AGENTRUN_DATABASE_URL.",
    )
    _add_database(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "worker",
        help="claim and drive runs, and serve the HTTP API",
        description="Claim runs with leases, drive each from its last checkpoint, and serve /healthz, "
        "/readyz, the REST API and /metrics on --port.",
        epilog="Environment: AGENTRUN_DATABASE_URL; AGENTRUN_TOOLS (comma-separated modules whose @tool "
        "functions the worker offers); ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL (the model API); "
        "AGENTRUN_DEFAULT_MODEL; AGENTRUN_PRICES_FILE (price table, TOML); AGENTRUN_LIVENESS_LOCK; "
        "AGENTRUN_LOG_FORMAT.",
    )
    _add_database(p)
    p.add_argument("--id", metavar="NAME", help="worker name in leases, steps and logs (default: host-pid)")
    p.add_argument("--concurrency", type=_non_negative_int, default=4, metavar="N",
                   help="runs in flight at once; 0 serves the API only (default: 4)")
    p.add_argument("--lease-seconds", type=_positive_float, default=30.0, metavar="S",
                   help="lease length; renewed every S/3 while a step runs (default: 30)")
    p.add_argument("--poll-interval", type=_positive_float, default=1.0, metavar="S",
                   help="seconds between claim attempts while idle (default: 1)")
    p.add_argument("--shutdown-grace", type=_non_negative_float, default=25.0, metavar="S",
                   help="on SIGTERM, how long in-flight steps may take to finish (default: 25)")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default: 8080)")
    p.add_argument("--host", default="0.0.0.0", help="HTTP bind address (default: 0.0.0.0)")
    p.add_argument("--max-tokens", type=_positive_int, default=4096, metavar="N",
                   help="max_tokens of each model request (default: 4096)")
    p.add_argument("--pool-size", type=_positive_int, default=None, metavar="N",
                   help="database connections (default: concurrency + 2, at most 20)")
    p.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
    p.add_argument("--no-liveness-lock", action="store_true",
                   help="do not hold the session advisory lock that lets other workers take over this "
                   "worker's runs as soon as it dies; needed behind a connection pooler in transaction "
                   "mode, where a dead worker's runs then wait out their lease. Use the same setting on "
                   "every worker, and a unique --id per live worker (env: AGENTRUN_LIVENESS_LOCK=false)")
    p.set_defaults(func=cmd_worker)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.setup(os.environ.get("AGENTRUN_LOG_FORMAT", "console"), os.environ.get("AGENTRUN_LOG_LEVEL", "INFO"))
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
