"""B11 (issue 46): tenants sharing one worker. Tenant A has `--backlog` runs queued when tenant B submits
`--small` runs: when does each of B's runs start, and what is the total throughput against B1 (one
tenant, the same worker)? Then the claim latency p99 with `--queued` runs over `--tenants` tenants
against the same depth in one tenant (B5's claimers, `claim.measure`).

Each run is `--turns` tool turns and a final answer, as in B1. The clock of the shared part starts when
the worker starts with A's backlog queued; B submits once the worker has been busy for `--head-start`
seconds, and the part ends `--window` seconds after the start (B's runs all done by then, or it waits).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from bench import _pg, claim, throughput  # noqa: E402
from bench.pickup import StampingLlm  # noqa: E402

BACKLOG = """INSERT INTO run
             SELECT (jsonb_populate_record(r, jsonb_build_object(
                 'id', gen_random_uuid(), 'input', 'backlog ' || i,
                 'created_at', now(), 'run_at', now() - make_interval(secs => %(n)s - i)))).*
             FROM run r, generate_series(1, %(n)s) AS i WHERE r.id = %(id)s"""
"""A's backlog: copies of one run made through the store, in one statement (the door makes 20,000 in
about as many round trips)."""


class TurnStampingLlm(StampingLlm):
    """B1's model (`turns` tool turns), noting when each run's first model step starts."""

    def __init__(self, turns: int) -> None:
        super().__init__()
        self.turns = turns


async def shared(url: str, backlog: int, small: int, turns: int, concurrency: int, head_start: float,
                 window: float) -> dict[str, Any]:
    pool = await open_pool(url, max_size=concurrency + 2, min_size=concurrency + 2)
    client_pool = await open_pool(url, max_size=2)
    try:
        store, client = RunStore(pool), RunStore(client_pool)
        first, _ = await client.create(_pg.new_run("backlog 0", tenant="tenant-a"))
        async with client_pool.connection() as conn:
            await conn.execute(BACKLOG, {"n": backlog - 1, "id": first.id})
            await conn.execute("VACUUM ANALYZE run")
        llm = TurnStampingLlm(turns)
        worker = _pg.make_worker(store, llm, [_pg.noop], concurrency=concurrency, poll_interval=1.0)
        t0 = time.perf_counter()
        serving = asyncio.create_task(worker.run())
        await asyncio.sleep(head_start)  # A's runs fill every slot: B arrives at a busy fleet
        submitted: dict[str, float] = {}
        ids = []
        for i in range(small):
            name = f"small {i}"
            submitted[name] = time.perf_counter()
            run, _ = await client.create(_pg.new_run(name, tenant="tenant-b"))
            ids.append(run.id)
        while True:
            async with client_pool.connection() as conn:  # one look, not one per run: the worker has the cores
                cur = await conn.execute("SELECT count(*) FROM run WHERE id = ANY(%s) AND finished_at IS NOT NULL",
                                         (ids,))
                (done,) = await cur.fetchone()  # type: ignore[misc]
            if done == small and time.perf_counter() - t0 >= window:
                break
            if serving.done():
                serving.result()
                raise RuntimeError("the worker stopped before B's runs finished")
            await asyncio.sleep(0.1)
        elapsed = time.perf_counter() - t0
        async with client_pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM run_step")
            (steps,) = await cur.fetchone()  # type: ignore[misc]
        worker.stop()
        await serving
    finally:
        await pool.close()
        await client_pool.close()
    starts = sorted(llm.started[name] - at for name, at in submitted.items())
    return {"backlog": backlog, "small": small, "seconds": round(elapsed, 3), "steps": steps,
            "steps_per_s": round(steps / elapsed, 1),
            "b_start_median_s": round(statistics.median(starts), 3), "b_start_max_s": round(starts[-1], 3),
            "b_started_within_2s": sum(1 for s in starts if s <= 2.0)}


async def bench(url: str, backlog: int, small: int, turns: int, concurrency: int, head_start: float, window: float,
                queued: int, tenants: int, claimers: int, claims_each: int, rounds: int = 3) -> dict[str, Any]:
    """B1 and the shared part `rounds` times, alternated (B1, shared, B1, shared, …), so a load that comes and
    goes on the machine falls on both alike: the throughput ratio is the median of each round's."""
    pairs = []
    for _ in range(rounds):
        await _empty(url)
        b1 = await throughput.bench(url, 600 if backlog >= 600 else backlog, turns, concurrency)
        await _empty(url)
        pairs.append((b1, await shared(url, backlog, small, turns, concurrency, head_start, window)))
    one = await claim.measure(url, queued, claimers, claims_each, tenants=1)
    many = await claim.measure(url, queued, claimers, claims_each, tenants=tenants)
    return {"rounds": pairs, "claim_one_tenant": one, "claim_many_tenants": many}


async def _empty(url: str) -> None:
    """No run left from the part before: each part counts the steps of the table."""
    pool = await open_pool(url, max_size=1)
    async with pool.connection() as conn:
        await conn.execute("TRUNCATE run CASCADE")
    await pool.close()


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--backlog", type=int, default=20_000)
    p.add_argument("--small", type=int, default=50)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--head-start", type=float, default=1.0)
    p.add_argument("--window", type=float, default=6.0)
    p.add_argument("--queued", type=int, default=100_000)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--claimers", type=int, default=8)
    p.add_argument("--claims-each", type=int, default=250)
    p.add_argument("--rounds", type=int, default=3, help="B1 and the shared part, alternated this many times")
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        r = asyncio.run(bench(url, args.backlog, args.small, args.turns, args.concurrency, args.head_start,
                              args.window, args.queued, args.tenants, args.claimers, args.claims_each, args.rounds))
    one, many = r["claim_one_tenant"], r["claim_many_tenants"]
    ratios = [fair["steps_per_s"] / b1["steps_per_s"] for b1, fair in r["rounds"]]
    ratio = statistics.median(ratios)
    fair = max((fair for _, fair in r["rounds"]), key=lambda f: f["b_start_max_s"])  # B's worst round
    p99_ratio = many["p99_ms"] / one["p99_ms"]
    met = {"b_within_2s": fair["b_start_max_s"] <= 2.0, "throughput_within_10pct": ratio >= 0.9,
           "claim_p99_within_2x": p99_ratio <= 2.0,
           "no_double_claims": one["double_claims"] + many["double_claims"] == 0}
    print(f"B11 fairness: tenant A {fair['backlog']} queued, tenant B submits {fair['small']} "
          f"after {args.head_start} s; concurrency {args.concurrency}, {2 * args.turns + 1} steps a run; "
          f"{args.rounds} rounds of B1 then the shared part")
    print(f"  B's runs started (worst round): median {fair['b_start_median_s']} s, last {fair['b_start_max_s']} s "
          f"after submission; {fair['b_started_within_2s']} of {fair['small']} within 2 s")
    for b1, shared_ in r["rounds"]:
        print(f"  throughput shared {shared_['steps_per_s']} steps/s vs B1 {b1['steps_per_s']} steps/s: "
              f"{shared_['steps_per_s'] / b1['steps_per_s']:.3f}")
    print(f"  throughput ratio, median of {len(ratios)} rounds: {ratio:.3f}")
    print(f"  claim p99 {one['queued']} queued: one tenant {one['p99_ms']} ms, {many['tenants']} tenants "
          f"{many['p99_ms']} ms: {p99_ratio:.2f}; double claims {one['double_claims'] + many['double_claims']}")
    verdicts = ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items())
    print(f"  targets: {verdicts}")
    _pg.emit({"rounds": [{"b1": b1, "shared": shared_} for b1, shared_ in r["rounds"]],
              "throughput_ratios": [round(x, 3) for x in ratios], "throughput_ratio": round(ratio, 3),
              "claim_one_tenant": one, "claim_many_tenants": many, "claim_p99_ratio": round(p99_ratio, 3),
              "met": met, **env})


if __name__ == "__main__":
    main()
