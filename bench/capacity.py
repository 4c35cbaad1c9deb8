"""B17 (issue 48 §6): what one step costs the PostgreSQL primary, and what that makes of one primary's capacity.

B1's workload (`--runs` runs of `--turns` tool turns, zero-latency model, `--concurrency` in flight) is run
while the server's own processes are measured: CPU seconds of every PostgreSQL process (from /proc, so the
server must run on this machine: the embedded one, or `--database-url` of a local one run by any user),
WAL bytes (the insert position), writing transactions (transaction ids) and the peak of connections. From the
cost of a step it derives, for a primary of `--cores` cores kept at `--utilisation` of them, the steps per
second the primary sustains and how many runs that keeps in flight at step latencies of 1 to 30 s
(a run in flight makes one model step and one tool step per model latency: 2 steps per latency).
docs/scaling.md explains the figures and what comes after one primary.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from bench import _pg, fairness, throughput  # noqa: E402

LATENCIES = (1, 5, 10, 30)
"""Model latencies (seconds) the capacity table is given for: a fast small model to a long reasoning call."""
CLOCK = os.sysconf("SC_CLK_TCK")


def server_cpu(postmaster: int) -> float:
    """CPU seconds the server has used: the postmaster's own and its reaped children's, and each live child's."""
    total = 0.0
    for pid in [postmaster, *_children(postmaster)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended between the listing and the read: its time is in the postmaster's cutime now
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        total += utime + stime + (cutime + cstime if pid == postmaster else 0)
    return total / CLOCK


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            if ppid == parent:
                found.append(int(entry.name))
    return found


def postmaster_of(url: str) -> int | None:
    """The server's postmaster pid, or None when its data directory is not readable here (another machine,
    a container, a role that may not read `data_directory`): then its CPU is not measured."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'data_directory'").fetchone()
    try:
        return int((Path(row[0]) / "postmaster.pid").read_text().split()[0]) if row else None
    except (OSError, ValueError, IndexError):
        return None


def cpu(postmaster: int | None) -> float:
    return server_cpu(postmaster) if postmaster is not None else float("nan")


def counters(url: str) -> dict[str, float]:
    """The WAL's insert position and the next transaction id: exact at once, where pg_stat_wal and
    pg_stat_database lag by up to a second (each backend flushes its statistics at most once a second)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0'), "
                           "pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    assert row is not None
    return {"wal_bytes": float(row[0]), "transactions": float(row[1])}


async def _peak_connections(url: str, stop: asyncio.Event) -> int:
    peak = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
            row = await cur.fetchone()
            peak = max(peak, int(row[0]) - 1 if row else 0)  # not this one
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except TimeoutError:
                pass
    return peak


async def measure(url: str, runs: int, turns: int, concurrency: int) -> dict[str, Any]:
    postmaster = postmaster_of(url)
    before, cpu0 = counters(url), cpu(postmaster)
    own0 = time.process_time()
    stop = asyncio.Event()
    watching = asyncio.create_task(_peak_connections(url, stop))
    figures = await throughput.bench(url, runs, turns, concurrency)
    stop.set()
    peak = await watching
    own = time.process_time() - own0
    after, cpu1 = counters(url), cpu(postmaster)
    steps = figures["steps"]
    return {
        "b1": figures, "steps": steps,
        "server_cpu_ms_per_step": round(1000 * (cpu1 - cpu0) / steps, 4),
        "worker_cpu_ms_per_step": round(1000 * own / steps, 4),
        "wal_bytes_per_step": round((after["wal_bytes"] - before["wal_bytes"]) / steps, 1),
        "write_transactions_per_step": round((after["transactions"] - before["transactions"]) / steps, 3),
        "peak_connections": peak,
    }


async def renewals(url: str, held: int, rounds: int, lease: float = 30.0) -> dict[str, Any]:
    """What keeping a run's lease costs the server: `held` runs claimed by one worker, renewed `rounds` times
    in the heartbeat's one statement (store/claims.py `renew`), per run renewed."""
    pool = await open_pool(url, max_size=2)
    try:
        store = RunStore(pool)
        async with pool.connection() as conn:
            await conn.execute("TRUNCATE run CASCADE")
            first, _ = await store.create(_pg.new_run("held 0"))
            await conn.execute(fairness.BACKLOG, {"n": held - 1, "id": first.id})
            await conn.execute("UPDATE run SET status = 'RUNNING', locked_by = 'capacity', "
                               "locked_until = now() + interval '1 hour', lease_epoch = 1")
            await conn.execute("VACUUM ANALYZE run")
            cur = await conn.execute("SELECT id FROM run")
            ids = [row[0] for row in await cur.fetchall()]
        postmaster = postmaster_of(url)
        before, cpu0 = counters(url), cpu(postmaster)
        for _ in range(rounds):
            renewed = await store.renew(ids, "capacity", lease, {i: 1 for i in ids})
            assert len(renewed) == held, f"{len(renewed)} of {held} renewed"
        after, cpu1 = counters(url), cpu(postmaster)
    finally:
        await pool.close()
    n = held * rounds
    return {"held": held, "rounds": rounds, "server_cpu_ms_per_renewal": round(1000 * (cpu1 - cpu0) / n, 4),
            "wal_bytes_per_renewal": round((after["wal_bytes"] - before["wal_bytes"]) / n, 1),
            "renew_every_s": lease / 3}


def capacity(m: dict[str, Any], cores: int, utilisation: float) -> dict[str, Any]:
    """Steps/s a primary of `cores` sustains at `utilisation` of its CPU, if CPU is what bounds it, and the
    runs in flight it keeps at each model latency: a run in flight costs 2 steps a latency and a lease renewal
    every third of the lease, whatever its latency. With the WAL written per second at that load."""
    budget = cores * utilisation * 1000  # server CPU ms a second
    step, renewal, every = (m["server_cpu_ms_per_step"], m["renewal"]["server_cpu_ms_per_renewal"],
                            m["renewal"]["renew_every_s"])
    flight = {}
    for latency in LATENCIES:
        runs = budget / (2 / latency * step + renewal / every)
        flight[f"{latency}s"] = {"runs": round(runs), "steps_per_s": round(runs * 2 / latency),
                                 "wal_mb_per_s": round(runs * (2 / latency * m["wal_bytes_per_step"]
                                                               + m["renewal"]["wal_bytes_per_renewal"] / every)
                                                       / 1e6, 1)}
    return {"cores": cores, "utilisation": utilisation, "steps_per_s_at_zero_latency": round(budget / step),
            "in_flight": flight}


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--cores", type=int, nargs="+", default=[2, 8, 32, 64],
                   help="primary sizes (cores) to derive the capacity of")
    p.add_argument("--utilisation", type=float, default=0.7, help="the share of the primary's CPU to plan for")
    p.add_argument("--held", type=int, default=10_000, help="runs held by one worker while its leases are renewed")
    p.add_argument("--renewals", type=int, default=20, help="renewals of all of them")
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        m = asyncio.run(measure(url, args.runs, args.turns, args.concurrency))
        m["renewal"] = asyncio.run(renewals(url, args.held, args.renewals))
    if math.isnan(m["server_cpu_ms_per_step"]):
        p.exit(2, "capacity.py: the server's data directory is not readable here, so its CPU is not measured: "
                  "run it on the embedded server (no --database-url) or on a server of this machine\n")
    table = [capacity(m, c, args.utilisation) for c in args.cores]
    b1 = m["b1"]
    print(f"B17 capacity: B1 {b1['runs']} runs × {b1['steps'] // max(b1['runs'], 1)} steps, concurrency "
          f"{args.concurrency}: {b1['steps_per_s']} steps/s on {env['cores']} cores shared with the worker")
    print(f"  per step: PostgreSQL CPU {m['server_cpu_ms_per_step']} ms, worker CPU {m['worker_cpu_ms_per_step']} ms, "
          f"WAL {m['wal_bytes_per_step']} bytes, {m['write_transactions_per_step']} writing transactions; "
          f"peak connections {m['peak_connections']}")
    r = m["renewal"]
    print(f"  per lease renewal ({r['held']:,} runs held, renewed every {r['renew_every_s']:g} s): PostgreSQL CPU "
          f"{r['server_cpu_ms_per_renewal']} ms, WAL {r['wal_bytes_per_renewal']} bytes")
    for row in table:
        flight = "; ".join(f"{k}: {v['runs']:,} runs, {v['steps_per_s']:,} steps/s, WAL {v['wal_mb_per_s']} MB/s"
                           for k, v in row["in_flight"].items())
        print(f"  {row['cores']:>3} cores at {row['utilisation']:.0%}: {row['steps_per_s_at_zero_latency']:,} steps/s "
              f"at zero latency; at model latency {flight}")
    _pg.emit({**m, "capacity": table, **env})


if __name__ == "__main__":
    main()
