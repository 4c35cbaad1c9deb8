"""The operator's one LISTEN connection: run ids from the `run_notify` trigger (migration 0003)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import psycopg

from agentrun.worker.store import channels
from agentrun.worker.store.channels import RUN_CHANNEL

log = logging.getLogger("agentrun.operator.notify")



async def listen(
    conninfo: str,
    on_run: Callable[[uuid.UUID], None],
    on_connect: Callable[[], None],
    max_backoff: float = 30.0,
) -> None:
    """Call `on_run` for every notified run id, forever; reconnect with backoff when the link drops.

    `on_connect` runs after each (re)connection: notifications sent while disconnected are lost, so
    the caller resynchronises everything then.
    """
    backoff = 0.5
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                await channels.listen(conn, RUN_CHANNEL)
                log.info("listening for run changes on %s", RUN_CHANNEL)
                backoff = 0.5
                on_connect()
                async for note in conn.notifies():
                    try:
                        run_id = uuid.UUID(note.payload)
                    except ValueError:
                        log.warning("ignoring notification with payload %r", note.payload[:80])
                        continue
                    on_run(run_id)
        except psycopg.OperationalError as e:
            log.warning("run change listener lost the database: %s; reconnecting in %.1fs", e, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
