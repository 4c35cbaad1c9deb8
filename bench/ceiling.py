"""The database's ceiling for B1: fenced model checkpoints per second with no engine around them.

`--clients` tasks each claim a run and then write checkpoint_model in a loop, through the same store
and pool as a worker but each write in its own statement (no group commit: `max_batch=1`), so the
figure is what a store that writes each step in its own statement can commit on this machine: the
ceiling of B1 before group commit, and the figure B8 must beat.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from agentrun.worker.core.records import ModelTurn
from agentrun.worker.core.types import Usage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.groupcommit import GroupCommit  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from bench import _pg  # noqa: E402


async def bench(url: str, clients: int, seconds: float) -> dict[str, object]:
    pool = await open_pool(url, max_size=clients, min_size=clients)
    store = RunStore(pool, GroupCommit(pool, senders=clients, max_batch=1))
    count = 0

    async def client(i: int) -> None:
        nonlocal count
        me = f"ceiling-{i}"
        await store.create(_pg.new_run())
        claimed = await store.claim(me, 30)
        assert claimed is not None
        run_id = claimed.run.id
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await store.checkpoint_model(
                run_id, me, 30,
                ModelTurn("{}", '[{"type":"text","text":"x"}]', "end_turn", Usage(10, 5, 0, 0), None, 0),
            )
            count += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - t0
    await pool.close()
    return {"clients": clients, "checkpoints": count, "seconds": round(elapsed, 2),
            "checkpoints_per_s": round(count / elapsed, 1)}


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    _pg.pg_version_option(p)
    args = p.parse_args()
    with _pg.database(args.database_url, args.pg) as url:
        env = _pg.describe(url)
        figures = asyncio.run(bench(url, args.clients, args.seconds))
    figures.update(env)
    print(f"DB ceiling: {args.clients} clients writing fenced model checkpoints for {args.seconds:g} s")
    print(f"  {figures['checkpoints']} checkpoints: {figures['checkpoints_per_s']} per second")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
