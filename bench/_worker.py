"""A worker process for the failover benchmark: the real Worker with a scripted model and a slow tool.

`agentrun worker` needs a real model; this builds the same Worker around TurnBasedLlm instead.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from agentrun.worker.testing.scripted import TurnBasedLlm  # noqa: E402
from agentrun.worker.tools import ToolContext, tool  # noqa: E402
from bench import _pg  # noqa: E402


async def serve(args: argparse.Namespace) -> None:
    @tool(name="slow", description="Takes a while.")
    async def slow(a: dict[str, Any], ctx: ToolContext) -> str:
        await asyncio.sleep(args.tool_seconds)
        return "slow result"

    pool = await open_pool(args.database_url, max_size=4)
    worker = _pg.make_worker(
        RunStore(pool), TurnBasedLlm(args.turns, tool="slow"), [slow], worker_id=args.id, concurrency=2,
        lease_seconds=args.lease, poll_interval=args.poll, liveness_lock=not args.no_liveness_lock,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)
    serving = asyncio.create_task(worker.run())
    await worker.presence.ready.wait()
    print("ready", flush=True)
    try:
        await serving
    finally:
        await pool.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--lease", type=float, default=30.0)
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--tool-seconds", type=float, default=2.0)
    p.add_argument("--no-liveness-lock", action="store_true")
    asyncio.run(serve(p.parse_args()))


if __name__ == "__main__":
    main()
