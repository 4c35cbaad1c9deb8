"""`agentrun migrate`: apply the database migrations."""

from __future__ import annotations

import argparse
import asyncio

from agentrun.worker.cli.arguments import database_url


def cmd_migrate(args: argparse.Namespace) -> int:
    import psycopg

    from agentrun.worker.store import migrate

    try:
        applied = asyncio.run(migrate.migrate(database_url(args)))
    except psycopg.errors.InsufficientPrivilege as e:
        # The runtime role of docs/database-role.sql, as meant: nothing was changed (one transaction).
        raise SystemExit(f"agentrun: this database role may not change the schema ({e.diag.message_primary}); "
                         "run `agentrun migrate` as the owner role (the chart's database.migrationSecret)") from None
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print(f"schema is up to date (version {migrate.latest_version()})")
    return 0
