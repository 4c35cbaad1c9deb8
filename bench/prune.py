"""B10: pruning under load. A worker runs the B1 workload over a table holding `--steps` steps of old
finished runs: alone, then again and again while `agentrun prune` deletes all of them, then alone once
more; B1 steps/s with pruning (the worst pass) ≥ 0.7 × without, and claim p99 ≤ 2 × without.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.store import Claim, RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from agentrun.worker.store.retention import prune  # noqa: E402
from agentrun.worker.testing.scripted import TurnBasedLlm  # noqa: E402
from bench import _pg  # noqa: E402


class TimedStore(RunStore):
    """The store, timing each claim (a statement that takes up to as many runs as the worker has free slots)."""

    claim_ms: list[float]

    async def claim_many(self, *args: Any, **kwargs: Any) -> list[Claim]:
        t0 = time.perf_counter()
        try:
            return await super().claim_many(*args, **kwargs)
        finally:
            self.claim_ms.append((time.perf_counter() - t0) * 1000)


async def fill(url: str, steps: int, steps_per_run: int) -> int:
    """Old finished runs holding `steps` steps in all (and a lease row each), 40 days old."""
    runs = max(1, steps // steps_per_run)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            """INSERT INTO run (id, status, input, model, token_budget, timeout_seconds, deadline_at, created_at,
                                finished_at)
               SELECT gen_random_uuid(), 'SUCCEEDED', 'old ' || i, %s, 1000, 60, now(), now() - interval '41 days',
                      now() - interval '40 days' - make_interval(secs => i)
               FROM generate_series(1, %s) AS i""",
            (_pg.MODEL, runs),
        )
        await conn.execute(
            """INSERT INTO run_step (run_id, seq, kind, status, request, response, started_at, finished_at)
               SELECT r.id, s, 'MODEL', 'DONE', '{"model": "m"}', '[{"type": "text", "text": "an answer"}]',
                      r.finished_at, r.finished_at
               FROM run r CROSS JOIN generate_series(1, %s) AS s WHERE r.status = 'SUCCEEDED'""",
            (steps_per_run,),
        )
        await conn.execute(
            "INSERT INTO run_lease (run_id, worker, claimed_at) SELECT id, 'old', created_at FROM run")
        await conn.execute("VACUUM ANALYZE")
    return runs * steps_per_run


async def b1(url: str, runs: int, turns: int, concurrency: int) -> dict[str, Any]:
    """The B1 workload: `runs` queued runs of `turns` tool turns, one worker; steps/s and claim p99."""
    pool = await open_pool(url, max_size=concurrency + 2, min_size=concurrency + 2)
    try:
        store = TimedStore(pool)
        store.claim_ms = []
        ids = [(await store.create(_pg.new_run()))[0].id for _ in range(runs)]
        worker = _pg.make_worker(store, TurnBasedLlm(turns), [_pg.noop], concurrency=concurrency, poll_interval=1.0)
        async with pool.connection() as conn:
            t0 = time.perf_counter()
            serving = asyncio.create_task(worker.run())
            while True:
                await asyncio.sleep(0.05)
                cur = await conn.execute("SELECT count(*) FROM run WHERE id = ANY(%s) AND finished_at IS NULL", (ids,))
                (left,) = await cur.fetchone()  # type: ignore[misc]
                if left == 0:
                    break
                if serving.done():
                    serving.result()
                    raise RuntimeError("the worker stopped before the runs finished")
            elapsed = time.perf_counter() - t0
            worker.stop()
            await serving
            cur = await conn.execute("SELECT count(*) FROM run_step WHERE run_id = ANY(%s)", (ids,))
            (steps,) = await cur.fetchone()  # type: ignore[misc]
            await conn.execute("DELETE FROM run_step WHERE run_id = ANY(%s)", (ids,))
            await conn.execute("DELETE FROM run_lease WHERE run_id = ANY(%s)", (ids,))
            await conn.execute("DELETE FROM run WHERE id = ANY(%s)", (ids,))
    finally:
        await pool.close()
    claims = sorted(store.claim_ms)
    return {"steps": steps, "seconds": round(elapsed, 3), "steps_per_s": round(steps / elapsed, 1),
            "claim_p99_ms": round(claims[min(len(claims) - 1, int(0.99 * len(claims)))], 3), "claims": len(claims)}


async def bench(url: str, steps: int, steps_per_run: int, runs: int, turns: int, concurrency: int,
                batch_size: int) -> dict[str, Any]:
    filled = await fill(url, steps, steps_per_run)
    alone = await b1(url, runs, turns, concurrency)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        t0 = time.perf_counter()
        pruning = asyncio.create_task(prune(conn, datetime.timedelta(days=30), batch_size=batch_size))
        # B1 again, as many times as fit while the prune runs (at least once), so each figure is measured
        # under pruning for its whole length.
        during = []
        while not pruning.done() or not during:
            during.append(await b1(url, runs, turns, concurrency))
            if pruning.done():
                break
        pruned = await pruning
        prune_seconds = time.perf_counter() - t0
    # Alone again afterwards: on a shared machine the load drifts, so the figure without pruning is the
    # mean of one before and one after.
    after = await b1(url, runs, turns, concurrency)
    alone = {"steps_per_s": round((alone["steps_per_s"] + after["steps_per_s"]) / 2, 1),
             "claim_p99_ms": round((alone["claim_p99_ms"] + after["claim_p99_ms"]) / 2, 3),
             "before": alone, "after": after}
    worst = min(during, key=lambda x: x["steps_per_s"])
    return {"steps_filled": filled, "alone": alone, "during": during, "worst_during": worst,
            "pruned": dict(pruned.rows), "prune_seconds": round(prune_seconds, 3),
            "steps_pruned_per_s": round(pruned.rows.get("run_step", 0) / prune_seconds, 1)}


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200_000, help="old steps to prune (the issue's figure: 1000000)")
    p.add_argument("--steps-per-run", type=int, default=20)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=100)
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        r = asyncio.run(bench(url, args.steps, args.steps_per_run, args.runs, args.turns, args.concurrency,
                              args.batch_size))
    alone, worst = r["alone"], r["worst_during"]
    throughput_ratio = worst["steps_per_s"] / alone["steps_per_s"]
    claim_ratio = max(x["claim_p99_ms"] for x in r["during"]) / alone["claim_p99_ms"]
    met = throughput_ratio >= 0.7 and claim_ratio <= 2.0
    print(f"B10 prune under load: {r['steps_filled']} old steps, pruned in {r['prune_seconds']} s "
          f"({r['steps_pruned_per_s']} steps/s, batches of {args.batch_size} runs): {r['pruned']}")
    print(f"  B1 alone (mean of before and after): {alone['steps_per_s']} steps/s, "
          f"claim p99 {alone['claim_p99_ms']} ms")
    for x in r["during"]:
        print(f"  B1 while pruning: {x['steps_per_s']} steps/s, claim p99 {x['claim_p99_ms']} ms")
    print(f"  throughput ratio {throughput_ratio:.2f} (target ≥ 0.7), claim p99 ratio {claim_ratio:.2f} "
          f"(target ≤ 2): {'met' if met else 'MISSED'}")
    _pg.emit({"throughput_ratio": round(throughput_ratio, 3), "claim_p99_ratio": round(claim_ratio, 3),
              "met": met, **r, **env})


if __name__ == "__main__":
    main()
