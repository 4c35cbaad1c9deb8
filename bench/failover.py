"""B4: failover. Two worker processes; the one holding the run is killed (or frozen) mid-step, and the
time until the step resumes on the other is measured.

Scenarios: SIGKILL with the liveness lock and the default 30 s lease (target ≤ 3 s); SIGKILL without
the lock, short lease (target ≤ TTL + 1 s); SIGSTOP with the lock, short lease: a live but unreachable
worker keeps its lock, so only the lease expires it (target ≤ TTL + 1 s), and when it wakes its fenced
writes fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from agentrun.worker.store import RunStore  # noqa: E402
from bench import _pg  # noqa: E402

HERE = Path(__file__).resolve().parent


def _start(url: str, name: str, lease: float, liveness: bool, tool_seconds: float) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(HERE / "_worker.py"), "--database-url", url, "--id", name, "--lease", str(lease),
           "--tool-seconds", str(tool_seconds)]
    if not liveness:
        cmd.append("--no-liveness-lock")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"worker {name} did not start")
    return proc


def _wait(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(query, params).fetchone()
        if row is not None and row[0] is not None:
            return row
        time.sleep(0.01)
    raise TimeoutError(query)


def scenario(
    url: str, name: str, lease: float, liveness: bool, sig: signal.Signals, tool_seconds: float
) -> dict[str, Any]:
    procs = {w: _start(url, w, lease, liveness, tool_seconds) for w in (f"{name}-A", f"{name}-B")}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            import asyncio

            async def create() -> Any:
                from agentrun.worker.store.pool import open_pool

                pool = await open_pool(url, max_size=1)
                try:
                    run, _ = await RunStore(pool).create(_pg.new_run(name))
                    return run.id
                finally:
                    await pool.close()

            t_create = time.monotonic()
            run_id = asyncio.run(create())
            holder, seq = _wait(conn, "SELECT worker, seq FROM run_step WHERE run_id = %s AND kind = 'TOOL' "
                                "AND status = 'STARTED'", (run_id,), 30)
            t_started = time.monotonic()
            time.sleep(0.5)  # well inside the tool's run
            other = next(w for w in procs if w != holder)
            t_signal = time.monotonic()
            os.kill(procs[holder].pid, sig)
            _wait(conn, "SELECT 1 FROM run_step WHERE run_id = %s AND seq = %s AND worker = %s AND attempts >= 2",
                  (run_id, seq, other), 3 * lease + 10)
            t_resumed = time.monotonic()
            if sig is signal.SIGSTOP:
                os.kill(procs[holder].pid, signal.SIGCONT)  # the stale worker comes back and tries to write
            _wait(conn, "SELECT finished_at FROM run WHERE id = %s", (run_id,), 60)
            t_finished = time.monotonic()
            if sig is signal.SIGSTOP:
                time.sleep(tool_seconds + 0.5)  # long enough for its tool to end and its write to be refused
            status, claims = conn.execute("SELECT status, claims FROM run WHERE id = %s", (run_id,)).fetchone()  # type: ignore[misc]
            stale = conn.execute("SELECT count(*) FROM run_step WHERE run_id = %s AND worker = %s AND seq >= %s",
                                 (run_id, holder, seq)).fetchone()[0]  # type: ignore[index]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    failover = t_resumed - t_signal
    return {
        "scenario": name, "signal": sig.name, "lease_s": lease, "liveness_lock": liveness,
        "failover_s": round(failover, 3), "failover_over_lease": round(failover / lease, 3),
        "status": status, "claims": claims, "stale_writes": stale,
        "timeline": {"created": round(t_create - t_signal, 3), "tool_started": round(t_started - t_signal, 3),
                     "signal": 0.0, "resumed": round(failover, 3), "finished": round(t_finished - t_signal, 3)},
    }


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    plt = _pg.pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for y, r in enumerate(results):
        t = r["timeline"]
        ax.barh(y, -t["tool_started"], left=t["tool_started"], color="#4c72b0", height=0.35,
                label="held by A" if y == 0 else None)
        ax.barh(y, t["resumed"], left=0, color="#dd8452", height=0.35, label="nobody driving" if y == 0 else None)
        ax.barh(y, t["finished"] - t["resumed"], left=t["resumed"], color="#55a868", height=0.35,
                label="resumed on B" if y == 0 else None)
        ax.annotate(f"{t['resumed']:.2f} s", (t["resumed"], y + 0.22), fontsize=8)
        ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(results)))
    ax.set_yticklabels([f"{r['signal']}, lease {r['lease_s']:g} s,\n"
                        f"liveness lock {'on' if r['liveness_lock'] else 'off'}" for r in results], fontsize=8)
    ax.set_xlabel("seconds from the signal to the worker holding the run")
    ax.set_title("B4 failover timeline")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--short-lease", type=float, default=5.0, help="lease for the lease-path scenarios (s)")
    p.add_argument("--tool-seconds", type=float, default=2.0)
    p.add_argument("--plot", default=str(HERE / "failover.png"))
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        results = [
            scenario(url, "kill-lock", 30.0, True, signal.SIGKILL, args.tool_seconds),
            scenario(url, "kill-nolock", args.short_lease, False, signal.SIGKILL, args.tool_seconds),
            scenario(url, "stop-lock", args.short_lease, True, signal.SIGSTOP, args.tool_seconds),
        ]
    kill, nolock, stop = results
    figures = {
        "sigkill_failover_s": kill["failover_s"], "sigkill_target_s": 3.0, "sigkill_met": kill["failover_s"] <= 3.0,
        "lease_path_failover_s": nolock["failover_s"], "lease_path_over_ttl": nolock["failover_over_lease"],
        "partition_failover_s": stop["failover_s"], "partition_over_ttl": stop["failover_over_lease"],
        "lease_path_target_s": args.short_lease + 1,
        "lease_path_met": max(nolock["failover_s"], stop["failover_s"]) <= args.short_lease + 1,
        "stale_writes": sum(r["stale_writes"] for r in results),
        "statuses": [r["status"] for r in results], "scenarios": results, **env,
    }
    print("B4 failover: the worker holding a run is signalled mid-tool-step; time until the step resumes elsewhere")
    for r in results:
        print(f"  {r['signal']:8} lease {r['lease_s']:>4g} s, liveness lock {'on ' if r['liveness_lock'] else 'off'}: "
              f"resumed after {r['failover_s']:.3f} s ({r['failover_over_lease']:.3f} × TTL); run {r['status']}, "
              f"claims {r['claims']}, writes by the old holder after the signal: {r['stale_writes']}")
    print(f"  SIGKILL target ≤ 3 s: {'met' if figures['sigkill_met'] else 'MISSED'}; lease path target ≤ TTL + 1 s "
          f"= {args.short_lease + 1:g} s: {'met' if figures['lease_path_met'] else 'MISSED'}")
    if plot(results, Path(args.plot)):
        print(f"  timeline plot: {args.plot}")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
