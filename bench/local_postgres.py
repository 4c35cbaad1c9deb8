"""A private PostgreSQL that can be stopped and started again, for fault tests and the chaos run.

pgserver's embedded server, in a temporary directory of its own (in memory when there is room); `stop()`
is an immediate shutdown (no checkpoint, every connection dropped: as close to a database crash as a test
can get), `start()` brings it back on the same socket, with crash recovery.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any


class LocalPostgres:
    def __init__(self) -> None:
        from agentrun.worker.testing import embedded_postgres

        self._dir = Path(tempfile.mkdtemp(prefix="agentrun-localpg-", dir=embedded_postgres.scratch_root()))
        self._server: Any = embedded_postgres.start(self._dir, what="LocalPostgres")
        self.url: str = self._server.get_uri()
        self.running = True
        # Without fsync, a restart after `stop()` skips the sync of the whole data directory that crash
        # recovery otherwise begins with (4.4 s -> 0.1 s measured here); an immediate stop loses nothing.
        embedded_postgres.skip_fsync(self._server)

    def _pg_ctl(self, *args: str) -> None:
        from pgserver._commands import POSTGRES_BIN_PATH  # the binaries pgserver ships

        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self._dir), *args],
            check=True, capture_output=True, timeout=60, user=self._server.system_user,
        )

    def stop(self) -> None:
        """Immediate shutdown: like a crash of the database server."""
        self._pg_ctl("-m", "immediate", "-w", "stop")
        self.running = False

    def start(self) -> None:
        self._server.ensure_postgres_running()
        self.running = True

    def close(self) -> None:
        if not self.running:
            self.start()  # pgserver's cleanup expects a server to stop
        self._server.cleanup()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
