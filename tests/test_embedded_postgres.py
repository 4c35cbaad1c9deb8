"""The embedded PostgreSQL starts however many processes start one at once (worker/testing/embedded_postgres.py).

On a machine where it never ran, pgserver (as root) creates its OS user on first start, outside any lock;
starts racing there failed with `useradd ... returned non-zero exit status 9` or an initdb run as a user
id that no longer existed. `repeat-fresh-test --new-machine` removes the user and runs the whole suite,
whose two xdist workers start their servers at once; here, several processes start theirs together.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

STARTERS = 2  # as the suite starts them: one per xdist worker


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_servers_started_at_once_all_come_up(tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = """
        import os, sys, time
        import psycopg
        from agentrun.worker.testing import embedded_postgres
        go, data = sys.argv[1], sys.argv[2]
        while not os.path.exists(go):  # every starter waits here, then all start together
            time.sleep(0.005)
        server = embedded_postgres.start(data)
        try:
            with psycopg.connect(server.get_uri()) as conn:
                print(conn.execute("SELECT 1").fetchone()[0])
        finally:
            server.cleanup()
    """
    procs = [_spawn(code, str(go), str(tmp_path / f"pg{i}")) for i in range(STARTERS)]
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert (p.returncode, out.strip()) == (0, "1"), err[-3000:]


def test_the_machine_lock_admits_one_process_at_a_time(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    code = """
        import sys, time
        from pathlib import Path
        from agentrun.worker.testing.embedded_postgres import machine_lock
        lock, trace, me = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
        with machine_lock(lock):
            with open(trace, "a") as f:
                f.write(f"in {me}\\n"); f.flush()
                time.sleep(0.05)
                f.write(f"out {me}\\n")
    """
    procs = [_spawn(code, str(tmp_path / "lock"), str(trace), str(i)) for i in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    lines = trace.read_text().split()
    assert len(lines) == 4 * 4, lines
    for i in range(0, len(lines), 4):  # "in N out N", never another's "in" between
        assert lines[i] == "in" and lines[i + 2] == "out" and lines[i + 1] == lines[i + 3], lines


def test_a_lock_held_too_long_is_a_timeout_error(tmp_path: Path) -> None:
    from agentrun.worker.testing.embedded_postgres import machine_lock

    holder = _spawn(
        """
        import sys, time
        from pathlib import Path
        from agentrun.worker.testing.embedded_postgres import machine_lock
        with machine_lock(Path(sys.argv[1])):
            print("held", flush=True)
            time.sleep(60)
        """,
        str(tmp_path / "lock"),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="held"), machine_lock(tmp_path / "lock", timeout=0.2):
            pass
    finally:
        holder.kill()
        holder.communicate()
    with machine_lock(tmp_path / "lock", timeout=5):  # a dead holder's lock is free again
        pass


def test_a_throwaway_server_skips_fsync_after_its_reload(tmp_path: Path) -> None:
    import time

    import psycopg

    from agentrun.worker.testing import embedded_postgres

    server = embedded_postgres.start(tmp_path / "pg")
    try:
        embedded_postgres.skip_fsync(server)
        deadline = time.monotonic() + 30
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            while (settings := conn.execute("SELECT current_setting('fsync'), current_setting('full_page_writes')")
                   .fetchone()) != ("off", "off"):
                assert time.monotonic() < deadline, f"still {settings} 30 s after the reload"
                time.sleep(0.02)
    finally:
        server.cleanup()
