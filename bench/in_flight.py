"""B7: thousands of runs in flight in one worker, the model's latency simulated at 1 s per call.

Each part runs in a process of its own (so its RSS is its own) against a fresh database on one
PostgreSQL: first B1 (bench/throughput.py, zero latency) for the figure to compare with, then one
worker with `--runs` runs of `--turns` tool turns at once for each size in `--sizes`. For each size:
peak runs in flight (target: all of them), steps/s (target: ≥ 0.8 × B1 of the same run, or the
latency bound if lower), RSS while all are in flight (target ≤ 250 MB at 5,000), and the database
sessions the worker opened (target: its pool's size; its presence session is counted apart).

Issue 48 §1 adds: steps/s against the latency bound (≥ 0.9 of it at 1,000 runs, ≥ 0.8 at 10,000), RSS per run
in flight beyond the worker's base (the process's RSS before the worker started, its modules loaded and the
runs created: ≤ 30 KB a run at 10,000), and what a worker holds per waiting run: a part with tracemalloc on,
`--holders-runs` runs all waiting on the model, the growth of Python's allocations from before the worker
started grouped by file and line, the top holders in bytes per run (tracemalloc counts Python's allocations
only, not the allocator's slack: RSS per run is the figure the target is on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from bench import _pg  # noqa: E402
from bench.memory import SlowLlm, load_serving_modules, rss_mb  # noqa: E402

POOL_SIZE = 20
RSS_TARGET_MB = 250
BOUND_TARGETS = {1000: 0.9, 10000: 0.8}
"""Issue 48 §1: the share of the latency bound each size must reach."""
KB_PER_RUN_TARGET = 30


async def in_flight(url: str, runs: int, turns: int, latency: float) -> dict[str, Any]:
    load_serving_modules()
    pool = await open_pool(url, max_size=POOL_SIZE)
    store = RunStore(pool)
    for start in range(0, runs, POOL_SIZE):
        await asyncio.gather(*(store.create(_pg.new_run()) for _ in range(min(POOL_SIZE, runs - start))))
    before = rss_mb()
    worker = _pg.make_worker(store, SlowLlm(turns, latency), [_pg.noop], concurrency=runs, pool_size=POOL_SIZE)
    monitor = await open_pool(url, max_size=1)  # apart from the worker's pool, and not counted with it
    peak, all_at_once_s, samples, pool_peak, sessions_peak = 0, None, [], 0, 0
    at_peak = before
    first_s: float | None = None
    t0 = time.perf_counter()
    serving = asyncio.create_task(worker.run())
    async with monitor.connection() as conn:
        me = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]  # type: ignore[index]
        while True:
            await asyncio.sleep(0.05)
            now_in_flight = len(worker.driving)
            if now_in_flight and first_s is None:
                first_s = time.perf_counter() - t0  # the worker's start-up: before any run is claimed
            if now_in_flight and now_in_flight >= peak:
                at_peak = rss_mb()  # per run in flight, also when not all of them get in flight at once
            peak = max(peak, now_in_flight)
            if now_in_flight >= runs:
                samples.append(rss_mb())
                if all_at_once_s is None:
                    all_at_once_s = time.perf_counter() - t0
            pool_peak = max(pool_peak, pool.get_stats()["pool_size"])
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE pid <> %s) FROM pg_stat_activity WHERE datname = current_database()",
                (me,),
            )
            sessions_peak = max(sessions_peak, (await cur.fetchone())[0])  # type: ignore[index]
            cur = await conn.execute("SELECT count(*) FROM run WHERE finished_at IS NULL")
            if (await cur.fetchone())[0] == 0:  # type: ignore[index]
                break
            if serving.done():
                serving.result()
                raise RuntimeError("the worker stopped before the runs finished")
        elapsed = time.perf_counter() - t0
        cur = await conn.execute("SELECT count(*) FROM run_step")
        (steps,) = await cur.fetchone()  # type: ignore[misc]
        cur = await conn.execute("SELECT status, count(*) FROM run GROUP BY status")
        statuses = dict(await cur.fetchall())
    worker.stop()
    await serving
    stats = store.writes.stats
    await monitor.close()
    await pool.close()
    model_calls = turns + 1
    return {
        "runs": runs, "turns": turns, "model_latency_s": latency, "peak_in_flight": peak,
        "all_in_flight_after_s": round(all_at_once_s, 2) if all_at_once_s is not None else None,
        "first_in_flight_after_s": round(first_s, 2) if first_s is not None else None,
        "steps": steps, "seconds": round(elapsed, 2), "steps_per_s": round(steps / elapsed, 1),
        "latency_bound_steps_per_s": round(runs * (2 * turns + 1) / (model_calls * latency), 1),
        "rss_before_mb": round(before, 1), "rss_in_flight_max_mb": round(max(samples), 1) if samples else None,
        "kb_per_run_in_flight": round(1024 * (at_peak - before) / peak, 1) if peak else None,
        "pool_size": POOL_SIZE, "pool_connections_peak": pool_peak,
        "db_sessions_peak": sessions_peak, "statuses": statuses,
        "writes": stats.writes, "write_batches": stats.batches, "largest_batch": stats.largest,
    }


async def holders(url: str, runs: int, top: int = 12) -> dict[str, Any]:
    """What a worker holds per run waiting on the model: tracemalloc's growth from before the worker
    started to when every run is in flight and waiting (a model call of 3 s), by file and line."""
    import tracemalloc

    load_serving_modules()
    pool = await open_pool(url, max_size=POOL_SIZE)
    store = RunStore(pool)
    for start in range(0, runs, POOL_SIZE):
        await asyncio.gather(*(store.create(_pg.new_run()) for _ in range(min(POOL_SIZE, runs - start))))
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    llm = SlowLlm(1, 3.0)
    worker = _pg.make_worker(store, llm, [_pg.noop], concurrency=runs, pool_size=POOL_SIZE)
    serving = asyncio.create_task(worker.run())
    while len(worker.driving) < runs and not serving.done():
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # every run's first model call under way: all waiting
    waiting = len(worker.driving)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    worker.stop()
    await serving
    await pool.close()
    root = str(Path(__file__).resolve().parents[1])
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    rows = []
    for s in sorted(stats, key=lambda s: -s.size_diff)[:top]:
        frame = s.traceback[0]
        rows.append({"where": f"{frame.filename.replace(root + '/', '')}:{frame.lineno}",
                     "bytes_per_run": round(s.size_diff / waiting), "blocks_per_run": round(s.count_diff / waiting, 1)})
    return {"runs": runs, "waiting": waiting, "python_bytes_per_run": round(total / max(waiting, 1)), "top": rows}


def _part(args: list[str], database_url: str) -> dict[str, Any]:
    """One part in a process of its own; its last line is its JSON figures."""
    out = subprocess.run(
        [sys.executable, __file__, "--database-url", database_url, *args], capture_output=True, text=True,
        check=False, timeout=1800,
    )
    if out.returncode != 0:
        raise SystemExit(f"part {args} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,5000,10000", help="comma-separated numbers of runs in flight")
    p.add_argument("--holders-runs", type=int, default=1000,
                   help="runs waiting in the tracemalloc part (what a worker holds per run); 0: no such part")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--model-latency", type=float, default=1.0)
    p.add_argument("--part", choices=["b1", "in-flight", "holders"], help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=1000, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part == "b1":
        from bench.throughput import bench as b1

        with _pg.database(args.database_url) as url:
            _pg.emit(asyncio.run(b1(url, 200, 5, 8)))
        return
    if args.part == "holders":
        with _pg.database(args.database_url) as url:
            _pg.emit(asyncio.run(holders(url, args.runs)))
        return
    if args.part == "in-flight":
        with _pg.database(args.database_url) as url:
            _pg.emit(asyncio.run(in_flight(url, args.runs, args.turns, args.model_latency)))
        return
    with _pg.server(args.database_url) as server:
        env = _pg.describe(server)
        b1_figures = _part(["--part", "b1"], server)
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        parts = [
            _part(["--part", "in-flight", "--runs", str(n), "--turns", str(args.turns),
                   "--model-latency", str(args.model_latency)], server)
            for n in sizes
        ]
        held = _part(["--part", "holders", "--runs", str(args.holders_runs)], server) if args.holders_runs else None
    b1_steps = b1_figures["steps_per_s"]
    print(f"B7 in flight: one worker, {args.turns} tool turns per run, model latency {args.model_latency:g} s")
    print(f"  B1 in the same run (200 runs × 11 steps, concurrency 8, zero latency): {b1_steps} steps/s")
    all_met = True
    for f in parts:
        n = f["runs"]
        wanted = min(0.8 * b1_steps, f["latency_bound_steps_per_s"])
        rss = f["rss_in_flight_max_mb"]
        bound_ratio = f["steps_per_s"] / f["latency_bound_steps_per_s"]
        met = {
            "all_in_flight": f["peak_in_flight"] >= n,
            "steps_per_s": f["steps_per_s"] >= wanted,
            "rss": n != 5000 or (rss is not None and rss <= RSS_TARGET_MB),
            "connections": f["pool_connections_peak"] <= f["pool_size"],
        }
        if n in BOUND_TARGETS:  # issue 48 §1
            met["bound_ratio"] = bound_ratio >= BOUND_TARGETS[n]
        if n >= 10000:
            kb = f["kb_per_run_in_flight"]
            met["kb_per_run"] = kb is not None and kb <= KB_PER_RUN_TARGET
        f.update(target_steps_per_s=round(wanted, 1), ratio_to_b1=round(f["steps_per_s"] / b1_steps, 2),
                 ratio_to_bound=round(bound_ratio, 2), met=met)
        all_met = all_met and all(met.values())
        print(f"  {n} runs: peak in flight {f['peak_in_flight']} (the first after {f['first_in_flight_after_s']} s, "
              f"all after {f['all_in_flight_after_s']} s); "
              f"{f['steps_per_s']} steps/s = {f['ratio_to_b1']} × B1 (target ≥ {wanted:.1f}; latency bound "
              f"{f['latency_bound_steps_per_s']}: {f['ratio_to_bound']} of it"
              f"{', target ≥ ' + str(BOUND_TARGETS[n]) if n in BOUND_TARGETS else ''}); RSS {rss} MB in flight, "
              f"{f['kb_per_run_in_flight']} KB per run beyond the base {f['rss_before_mb']} MB; pool connections ≤ "
              f"{f['pool_connections_peak']} of {f['pool_size']}, database sessions {f['db_sessions_peak']} "
              f"(the pool's and the presence session); {f['writes']} writes in {f['write_batches']} batches "
              f"(largest {f['largest_batch']}); {'met' if all(met.values()) else 'MISSED: ' + str(met)}")
    if held is not None:
        print(f"  what a worker holds per run waiting on the model ({held['waiting']} waiting, tracemalloc): "
              f"{held['python_bytes_per_run']} bytes of Python allocations per run; the top holders:")
        for row in held["top"]:
            print(f"    {row['bytes_per_run']:>7} B/run  {row['blocks_per_run']:>6} blocks/run  {row['where']}")
    _pg.emit({"b1_steps_per_s": b1_steps, "parts": parts, "holders": held, "met": all_met, **env})


if __name__ == "__main__":
    main()
