"""B2: one long run (model and tool turns); the time per step must not grow with the run's length.

Per-step time is the gap between consecutive steps' finished_at (the database's clock). The target
compares steps 451–500 with steps 1–50.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from agentrun.worker.testing.scripted import TurnBasedLlm  # noqa: E402
from bench import _pg  # noqa: E402

HERE = Path(__file__).resolve().parent


async def bench(url: str, steps: int) -> list[tuple[int, float]]:
    pool = await open_pool(url, max_size=3)
    try:
        store = RunStore(pool)
        run, _ = await store.create(_pg.new_run())
        worker = _pg.make_worker(store, TurnBasedLlm(steps // 2), [_pg.noop], concurrency=1)
        assert await worker.run_once() == run.id
        timeline = await store.timeline(run.id)
        done = await store.get(run.id)
        assert done is not None and done.status.value == "SUCCEEDED", done
        start = done.started_at
    finally:
        await pool.close()
    out, prev = [], start
    for s in timeline:
        assert s.finished_at is not None and prev is not None
        out.append((s.seq, (s.finished_at - prev).total_seconds() * 1000))
        prev = s.finished_at
    return out


def plot(per_step: list[tuple[int, float]], path: Path) -> bool:
    plt = _pg.pyplot()
    if plt is None:
        return False
    seqs, ms = zip(*per_step, strict=True)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.plot(seqs, ms, lw=0.6, color="#4c72b0", label="time per step")
    window = 25
    avg = [statistics.fmean(ms[max(0, i - window):i + 1]) for i in range(len(ms))]
    ax.plot(seqs, avg, lw=1.8, color="#dd8452", label=f"moving mean ({window} steps)")
    ax.set_xlabel("step seq")
    ax.set_ylabel("ms")
    ax.set_ylim(0, max(2.0, sorted(ms)[int(0.99 * (len(ms) - 1))] * 1.3))
    ax.set_title("B2 time per step along one run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--plot", default=str(HERE / "long_run.png"))
    args = p.parse_args()
    if args.steps < 100:
        p.error("--steps must be at least 100")
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        per_step = asyncio.run(bench(url, args.steps))
    # The first step's gap starts at the claim (started_at), so it includes the replay on claim.
    head = [ms for seq, ms in per_step if 1 <= seq <= 50]
    tail = [ms for seq, ms in per_step if args.steps - 49 <= seq <= args.steps]
    head_ms, tail_ms = statistics.fmean(head), statistics.fmean(tail)
    ratio = tail_ms / head_ms
    figures = {
        "steps": len(per_step), "first_50_mean_ms": round(head_ms, 3),
        "last_50_mean_ms": round(tail_ms, 3), "ratio": round(ratio, 3), "target_ratio": 1.5,
        "met": ratio <= 1.5, "total_s": round(sum(ms for _, ms in per_step) / 1000, 3), **env,
    }
    print(f"B2 long run: one run of {len(per_step)} steps (model and no-op tool turns)")
    print(f"  mean time per step: steps 1–50 {head_ms:.3f} ms, steps {args.steps - 49}–{args.steps} {tail_ms:.3f} ms; "
          f"ratio {ratio:.2f} (target ≤ 1.5: {'met' if ratio <= 1.5 else 'MISSED'})")
    if plot(per_step, Path(args.plot)):
        print(f"  plot: {args.plot}")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
