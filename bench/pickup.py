"""B3: time from creating a run to its first model step starting, with an idle worker polling once a second.

An idle worker wakes on the LISTEN/NOTIFY of migration 0002; its poll is only the safety net. Each
sample creates one run on another connection while the worker is idle and waits for it to finish.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.core.types import LlmRequest, LlmResponse  # noqa: E402
from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from agentrun.worker.testing.scripted import TurnBasedLlm  # noqa: E402
from bench import _pg  # noqa: E402


class StampingLlm(TurnBasedLlm):
    """Notes when each run's first model step starts (the run's input names the sample)."""

    def __init__(self) -> None:
        super().__init__(turns=0)
        self.started: dict[str, float] = {}

    async def send(self, request: LlmRequest) -> LlmResponse:
        first = request.messages[0]["content"]
        self.started.setdefault(str(first), time.perf_counter())
        return await super().send(request)


async def bench(url: str, samples: int, poll: float, gap: float) -> dict[str, object]:
    worker_pool = await open_pool(url, max_size=4)
    client_pool = await open_pool(url, max_size=2)
    llm = StampingLlm()
    worker = _pg.make_worker(RunStore(worker_pool), llm, [_pg.noop], concurrency=4, poll_interval=poll)
    client = RunStore(client_pool)
    serving = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.presence.ready.wait(), 10)
    latencies: list[float] = []
    try:
        for i in range(samples):
            await asyncio.sleep(gap)  # the worker is idle, waiting on its poll or a notification
            name = f"pickup-{i}"
            t0 = time.perf_counter()
            run, _ = await client.create(_pg.new_run(name))
            while name not in llm.started:
                await asyncio.sleep(0.001)
            latencies.append((llm.started[name] - t0) * 1000)
            while (r := await client.get(run.id)) is not None and r.finished_at is None:
                await asyncio.sleep(0.01)
    finally:
        worker.stop()
        await serving
        await worker_pool.close()
        await client_pool.close()
    latencies.sort()
    median = statistics.median(latencies)
    return {
        "samples": samples, "poll_interval_s": poll, "median_ms": round(median, 1),
        "p90_ms": round(latencies[int(0.9 * (len(latencies) - 1))], 1), "max_ms": round(latencies[-1], 1),
        "min_ms": round(latencies[0], 1), "median_over_poll": round(median / (poll * 1000), 4),
        "target_median_over_poll": 0.10, "met": median <= 0.10 * poll * 1000,
    }


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--gap", type=float, default=0.3, help="seconds idle before each sample")
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        figures = asyncio.run(bench(url, args.samples, args.poll_interval, args.gap))
    figures.update(env)
    print(f"B3 pickup: {args.samples} runs created one at a time for an idle worker "
          f"polling every {args.poll_interval:g} s")
    print(f"  create → first model step: median {figures['median_ms']} ms, p90 {figures['p90_ms']} ms, "
          f"max {figures['max_ms']} ms; median/poll = {figures['median_over_poll']} "
          f"(target ≤ 0.10: {'met' if figures['met'] else 'MISSED'})")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
