"""What every background loop of a worker needs: to stop when it is cancelled, whatever came out."""

from __future__ import annotations

import asyncio


def honour_cancel(error: BaseException | None = None) -> None:
    """Raise CancelledError if the current task was asked to stop: call it in each `except Exception` of a
    loop that rides out outages, and before each of its sleeps.

    A cancel that reaches a query in flight does not always come out as CancelledError: psycopg cancels
    the query on the server, and when that fails it closes the connection, and the pool returning a closed
    connection may raise an error of its own in its place, or a cancel that lands as a query ends may be
    lost on the way with the query's answer returned (seen: a ticker, cancelled, went back to sleep with
    the cancel pending). A loop that took that error for one more outage
    would run on, cancelled, and Worker.run, which awaits it on the way out, would never return (a fresh
    run of the suite hung so: tests/worker/test_stop_cancel.py)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError() from error
