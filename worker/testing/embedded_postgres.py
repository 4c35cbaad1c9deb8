"""The embedded PostgreSQL (pgserver) of the demo, `agentrun dev`, the benchmarks and the tests, started
safely however many processes start one at once on a machine where none ever ran.

Run as root, pgserver runs the server as an OS user `pgserver`, which it creates with `useradd` on first
use, outside any lock: two processes starting at once (the suite's two xdist workers, a demo beside a test
run) both create it, and one of them runs `initdb` as a user id the other's creation replaced. Here every
start holds one machine-wide file lock, so the first creates the user and the rest find it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# One lock for the machine: every process that starts an embedded server, whoever its OS user.
LOCK_PATH = Path(tempfile.gettempdir()) / "agentrun-embedded-postgres.lock"
# Memory-backed storage for a throwaway server's data, when the machine has room in it.
RAM_DIR = Path("/dev/shm")
RAM_NEEDED = 2 << 30  # bytes free in RAM_DIR: a busy test server's data and WAL stay well under this


def scratch_root() -> str:
    """Where a throwaway server keeps its data: memory-backed /dev/shm when it has room (a container's
    is often 64 MB), else the temporary directory. On disk, the writes and the deletes of every database
    a test clones and drops cost about a third of a database-bound test's time here, and deleting a data
    directory that was just written took seconds; a crash loses nothing a throwaway server needs."""
    with contextlib.suppress(OSError):
        if os.access(RAM_DIR, os.W_OK | os.X_OK):
            st = os.statvfs(RAM_DIR)
            if st.f_bavail * st.f_frsize >= RAM_NEEDED:
                return str(RAM_DIR)
    return tempfile.gettempdir()


@contextlib.contextmanager
def machine_lock(path: Path = LOCK_PATH, timeout: float = 300.0) -> Iterator[None]:
    """An exclusive lock shared by every process on the machine, released when the holder exits or dies
    (an flock goes with its file descriptor). Waits up to `timeout` seconds, then raises TimeoutError."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # another OS user's process may need it too
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has held {path} for {timeout:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def skip_fsync(server: Any) -> None:
    """A throwaway server (pgserver's, from `start`) skips fsync and full-page images: every commit, every
    database created and every restart after an immediate stop costs less. A commit still reaches the
    kernel before it returns (synchronous_commit stays on), so a killed or restarted PostgreSQL loses
    nothing; only a crash of the machine itself could, and that ends whatever used the server anyway.
    Both settings take effect on a reload, which the signal asks for."""
    with open(Path(server.pgdata) / "postgresql.conf", "a") as conf:
        conf.write("\n# a throwaway server (agentrun.worker.testing.embedded_postgres)\n"
                   "fsync = off\nfull_page_writes = off\n")
    os.kill(server.get_pid(), signal.SIGHUP)


def start(data: str | Path, *, cleanup_mode: str | None = "stop", what: str = "this") -> Any:
    """pgserver's server on `data` (created and initialised when new, started when stopped): its
    `get_uri()` names it and `cleanup()` stops it. `what` names the caller (`the demo`, `make dev`) in
    the error raised when pgserver is not installed."""
    try:
        import pgserver
    except ImportError:
        raise RuntimeError(
            f"{what} needs an embedded PostgreSQL: pip install 'agentrun[embedded]'"
        ) from None
    with machine_lock():
        return pgserver.get_server(str(data), cleanup_mode=cleanup_mode)
