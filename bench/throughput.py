"""B1: steps per second of one worker process, with a zero-latency scripted model and a no-op tool.

Each run is `--turns` tool turns and a final answer (2 × turns + 1 steps). The clock starts when the
worker starts with every run queued and stops when the last one has finished (its `finished_at`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.obs import logs  # noqa: E402
from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from agentrun.worker.testing.scripted import TurnBasedLlm  # noqa: E402
from bench import _pg  # noqa: E402


async def bench(url: str, runs: int, turns: int, concurrency: int, liveness: bool = True) -> dict[str, object]:
    pool = await open_pool(url, max_size=concurrency + 2, min_size=concurrency + 2)
    try:
        store = RunStore(pool)
        for _ in range(runs):
            await store.create(_pg.new_run())
        worker = _pg.make_worker(store, TurnBasedLlm(turns), [_pg.noop], concurrency=concurrency, poll_interval=1.0,
                                  liveness_lock=liveness)
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT clock_timestamp()")
            (started,) = await cur.fetchone()  # type: ignore[misc]
            t0 = time.perf_counter()
            serving = asyncio.create_task(worker.run())
            while True:
                await asyncio.sleep(0.05)
                cur = await conn.execute("SELECT count(*) FILTER (WHERE finished_at IS NULL), count(*) FROM run")
                left, total = await cur.fetchone()  # type: ignore[misc]
                if left == 0:
                    break
                if serving.done():
                    serving.result()
                    raise RuntimeError("the worker stopped before the runs finished")
            polled = time.perf_counter() - t0
            worker.stop()
            await serving
            # The clock stops when the last run ended, as the database wrote it, not at the poll that saw it
            # (up to 50 ms later: 5 % of a 200-run measurement); the poll's figure bounds it.
            cur = await conn.execute("SELECT extract(epoch FROM max(finished_at) - %s)::float8 FROM run", (started,))
            (ended,) = await cur.fetchone()  # type: ignore[misc]
            elapsed = min(polled, ended) if ended and ended > 0 else polled
            cur = await conn.execute("SELECT count(*) FROM run_step")
            (steps,) = await cur.fetchone()  # type: ignore[misc]
            cur = await conn.execute("SELECT status, count(*) FROM run GROUP BY status")
            statuses = dict(await cur.fetchall())
    finally:
        await pool.close()
    return {
        "runs": runs, "turns": turns, "concurrency": concurrency, "steps": steps, "seconds": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed, 1), "runs_per_s": round(runs / elapsed, 1), "statuses": statuses,
        "writes_per_batch": round(store.writes.stats.writes / max(store.writes.stats.batches, 1), 2),
    }


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--no-liveness-lock", action="store_true", help="run the worker without its liveness lock")
    p.add_argument("--log-level", default="WARNING",
                   help="the worker's log level; INFO logs every step to stderr as `agentrun worker` does")
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        logs.setup("console", args.log_level)
        env = _pg.describe(url)
        figures = asyncio.run(bench(url, args.runs, args.turns, args.concurrency, not args.no_liveness_lock))
    figures.update(env, target_steps_per_s=1500, met=figures["steps_per_s"] >= 1500)
    print(f"B1 throughput: {figures['runs']} runs × {2 * args.turns + 1} steps, concurrency {args.concurrency}")
    print(f"  {figures['steps']} steps in {figures['seconds']} s: {figures['steps_per_s']} steps/s, "
          f"{figures['runs_per_s']} runs/s (target ≥ 1500 steps/s: {'met' if figures['met'] else 'MISSED'})")
    print(f"  statuses: {figures['statuses']}; PostgreSQL {env['postgres']} over {env['db_host']}, "
          f"{env['cores']} cores")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
