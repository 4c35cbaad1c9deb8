"""B6: worker memory with 100 runs in flight, the model's latency simulated at 1 s per call.

The worker runs in this process, with the modules `agentrun worker` loads (HTTP API, uvicorn, the
Anthropic SDK) imported so they are counted; RSS is read from /proc while all runs are in flight.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.core.types import LlmRequest, LlmResponse  # noqa: E402
from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from agentrun.worker.testing.scripted import TurnBasedLlm  # noqa: E402
from bench import _pg  # noqa: E402


class SlowLlm(TurnBasedLlm):
    """A scripted model that takes `latency` seconds per call, like a real one."""

    def __init__(self, turns: int, latency: float) -> None:
        super().__init__(turns)
        self.latency = latency

    async def send(self, request: LlmRequest) -> LlmResponse:
        await asyncio.sleep(self.latency)
        return await super().send(request)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def load_serving_modules() -> None:
    import anthropic  # noqa: F401
    import uvicorn  # noqa: F401

    from agentrun.worker.api.app import create_app  # noqa: F401


async def bench(url: str, runs: int, turns: int, latency: float, concurrency: int | None = None) -> dict[str, object]:
    """`concurrency` (default: `runs`) below `runs` keeps the in-flight target out of reach: the figures
    then say so (no in-flight sample, not met) instead of failing."""
    load_serving_modules()
    concurrency = runs if concurrency is None else concurrency
    # As `agentrun worker --concurrency 100` sizes it: concurrency + 2, at most 20 connections.
    pool_size = min(concurrency + 2, 20)
    pool = await open_pool(url, max_size=pool_size)
    store = RunStore(pool)
    for _ in range(runs):
        await store.create(_pg.new_run())
    before = rss_mb()
    worker = _pg.make_worker(store, SlowLlm(turns, latency), [_pg.noop], concurrency=concurrency, pool_size=pool_size)
    serving = asyncio.create_task(worker.run())
    peak_in_flight, samples = 0, []
    t0 = time.perf_counter()
    async with pool.connection() as conn:
        while True:
            await asyncio.sleep(0.2)
            peak_in_flight = max(peak_in_flight, len(worker.in_flight))
            if len(worker.in_flight) >= runs:
                samples.append(rss_mb())
            cur = await conn.execute("SELECT count(*) FROM run WHERE finished_at IS NULL")
            (left,) = await cur.fetchone()  # type: ignore[misc]
            if left == 0:
                break
    elapsed = time.perf_counter() - t0
    worker.stop()
    await serving
    await pool.close()
    # No sample at all when the in-flight target was never reached (the model answered too fast, or
    # the worker ran fewer at a time): the process peak is still known.
    peak = max([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, *samples])
    return {"runs": runs, "turns": turns, "model_latency_s": latency, "peak_in_flight": peak_in_flight,
            "rss_before_mb": round(before, 1),
            "rss_in_flight_max_mb": round(max(samples), 1) if samples else None,
            "rss_peak_mb": round(peak, 1), "seconds": round(elapsed, 1), "target_mb": 150,
            "met": peak <= 150 and peak_in_flight >= runs}


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--model-latency", type=float, default=1.0)
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        figures = asyncio.run(bench(url, args.runs, args.turns, args.model_latency))
    figures.update(env)
    print(f"B6 memory: {args.runs} runs in flight in one worker, model latency {args.model_latency:g} s")
    in_flight = figures["rss_in_flight_max_mb"]
    reached = f"up to {in_flight} MB" if in_flight is not None else f"(never all {args.runs} at once: no sample)"
    print(f"  RSS before the worker {figures['rss_before_mb']} MB; with {figures['peak_in_flight']} in flight "
          f"{reached}; process peak {figures['rss_peak_mb']} MB "
          f"(target ≤ 150 MB: {'met' if figures['met'] else 'MISSED'})")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
