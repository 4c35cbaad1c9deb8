"""`agentrun prune`: delete finished runs older than a cutoff (worker/store/retention.py does the work)."""

from __future__ import annotations

import argparse
import asyncio

from agentrun.worker.cli.arguments import database_url


def cmd_prune(args: argparse.Namespace) -> int:
    import datetime

    import psycopg

    from agentrun.worker.store.retention import prune

    async def go() -> str:
        async with await psycopg.AsyncConnection.connect(database_url(args), autocommit=True) as conn:
            pruned = await prune(conn, datetime.timedelta(seconds=args.older_than), batch_size=args.batch_size,
                                 dry_run=args.dry_run)
        return pruned.describe(dry_run=args.dry_run)

    try:
        print(asyncio.run(go()))
    except psycopg.Error as e:
        raise SystemExit(f"agentrun: prune failed: {str(e).strip() or type(e).__name__}") from None
    return 0
