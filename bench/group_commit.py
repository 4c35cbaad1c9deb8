"""B8: B1 against the ceiling of a store that writes each step in its own statement, in the same run.

`--rounds` times, alternately: bench/ceiling.py (fenced model checkpoints, each in its own statement,
from 8 clients and from as many clients as B1 has runs in flight; the higher counts) and B1
(bench/throughput.py: one worker, group commit on, `--concurrency` runs in flight), each on a fresh
database of one PostgreSQL. The figures are the medians; the target is B1 ≥ 1.0 × the ceiling.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _pg  # noqa: E402
from bench.ceiling import bench as ceiling  # noqa: E402
from bench.throughput import bench as b1  # noqa: E402


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=1000, help="B1's runs (each 2 × turns + 1 steps)")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=32, help="B1's runs in flight")
    p.add_argument("--seconds", type=float, default=5.0, help="how long the ceiling writes, each round")
    args = p.parse_args()
    ceilings, steps, batches = [], [], []
    with _pg.server(args.database_url) as server:
        env = _pg.describe(server)
        for _ in range(args.rounds):
            best = 0.0
            for clients in sorted({8, args.concurrency}):
                with _pg.database(server) as url:
                    best = max(best, asyncio.run(ceiling(url, clients, args.seconds))["checkpoints_per_s"])
            ceilings.append(best)
            with _pg.database(server) as url:
                figures = asyncio.run(b1(url, args.runs, args.turns, args.concurrency))
                steps.append(figures["steps_per_s"])
                batches.append(figures.get("writes_per_batch"))
    top, ours = statistics.median(ceilings), statistics.median(steps)
    ratio = round(ours / top, 2)
    clients = " and ".join(str(c) for c in sorted({8, args.concurrency}))
    print(f"B8 beyond one statement per step: {args.rounds} rounds, ceiling (the best of {clients} clients) and B1 "
          f"({args.runs} runs × {2 * args.turns + 1} steps, concurrency {args.concurrency}) alternately")
    print(f"  ceiling {ceilings} checkpoints/s, median {top}")
    print(f"  B1 {steps} steps/s, median {ours}; writes per batch {batches}")
    print(f"  B1 / ceiling = {ratio} (target ≥ 1.0: {'met' if ratio >= 1.0 else 'MISSED'})")
    _pg.emit({"rounds": args.rounds, "concurrency": args.concurrency, "ceiling_checkpoints_per_s": ceilings,
              "b1_steps_per_s": steps,
              "ceiling_median": top, "b1_median": ours, "ratio": ratio, "writes_per_batch": batches,
              "met": ratio >= 1.0, **env})


if __name__ == "__main__":
    main()
