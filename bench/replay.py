"""B14 (issue 47): a replay of `--runs` recorded runs against running them fresh, on the same zero-latency model.

The fresh runs (each `--turns` tool turns of a no-op tool and a final answer) are made and run to the end by an
in-process worker: they are the recording. Then one replay of all of them (`Door.replay`, tool policy
`recorded`) is made and run by the same kind of worker: every tool call is served from the recording. Each
clock starts before its runs are made and stops when the last one has finished. Target: the replay within 2×.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.core.recording import NewReplay  # noqa: E402
from agentrun.worker.core.submission import Caller  # noqa: E402
from agentrun.worker.obs import logs  # noqa: E402
from agentrun.worker.runtime.door import Door  # noqa: E402
from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from agentrun.worker.testing.scripted import TurnBasedLlm  # noqa: E402
from bench import _pg  # noqa: E402

TARGET_RATIO = 2.0

# The runs of one phase that have not finished: the recorded ones (not a replay's), or the replay's.
_LEFT = """SELECT count(*) FROM run WHERE finished_at IS NULL
    AND CASE WHEN %(replay)s::uuid IS NULL THEN replay_id IS NULL ELSE replay_id = %(replay)s END"""


async def _drain(store: RunStore, turns: int, concurrency: int, replay: uuid.UUID | None) -> None:
    """Run the phase's runs to the end with a fresh in-process worker."""
    worker = _pg.make_worker(store, TurnBasedLlm(turns), [_pg.noop], concurrency=concurrency, poll_interval=1.0)
    serving = asyncio.create_task(worker.run())
    try:
        async with store.pool.connection() as conn:
            while True:
                await asyncio.sleep(0.02)
                (left,) = await (await conn.execute(_LEFT, {"replay": replay})).fetchone()  # type: ignore[misc]
                if left == 0:
                    return
                if serving.done():
                    serving.result()
                    raise RuntimeError("the worker stopped before the runs finished")
    finally:
        worker.stop()
        await serving


async def bench(url: str, runs: int, turns: int, concurrency: int) -> dict[str, Any]:
    pool = await open_pool(url, max_size=concurrency + 2, min_size=concurrency + 2)
    try:
        store = RunStore(pool)
        t0 = time.perf_counter()
        ids = [(await store.create(_pg.new_run(f"benchmark {i}")))[0].id for i in range(runs)]
        await _drain(store, turns, concurrency, None)
        fresh = time.perf_counter() - t0

        recorded = await store.get_many(ids)
        replay = NewReplay(id=uuid.uuid4(), request={"runs": [str(i) for i in ids]})
        t0 = time.perf_counter()
        await Door(store).replay(replay, recorded, Caller(created_by="bench"))
        await _drain(store, turns, concurrency, replay.id)
        replayed = time.perf_counter() - t0

        async with pool.connection() as conn:
            cur = await conn.execute(
                """SELECT r.status, count(DISTINCT r.id), count(s.seq) FILTER (WHERE s.recorded_seq IS NOT NULL),
                          count(s.seq) FILTER (WHERE s.kind = 'TOOL' AND s.recorded_seq IS NULL)
                   FROM run r LEFT JOIN run_step s ON s.run_id = r.id
                   WHERE r.replay_id = %s GROUP BY r.status""", (replay.id,))
            rows = await cur.fetchall()
    finally:
        await pool.close()
    statuses = {status: n for status, n, _, _ in rows}
    served, not_served = sum(r[2] for r in rows), sum(r[3] for r in rows)
    ratio = replayed / fresh
    return {
        "runs": runs, "turns": turns, "concurrency": concurrency, "fresh_seconds": round(fresh, 3),
        "replay_seconds": round(replayed, 3), "ratio": round(ratio, 3), "statuses": statuses,
        "served_calls": served, "calls_not_served": not_served, "target_ratio": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO and statuses == {"SUCCEEDED": runs} and not_served == 0,
    }


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        logs.setup("console", "WARNING")
        env = _pg.describe(url)
        figures = asyncio.run(bench(url, args.runs, args.turns, args.concurrency))
    figures.update(env)
    print(f"B14 replay: {figures['runs']} runs × {2 * args.turns + 1} steps, concurrency {args.concurrency}")
    print(f"  fresh {figures['fresh_seconds']} s, replayed {figures['replay_seconds']} s: ratio {figures['ratio']} "
          f"(target ≤ {TARGET_RATIO}: {'met' if figures['met'] else 'MISSED'})")
    print(f"  replay runs {figures['statuses']}; {figures['served_calls']} calls served from the recording, "
          f"{figures['calls_not_served']} not")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
