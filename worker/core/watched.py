"""A configuration file re-read when it changes: the API tokens file, the webhook secrets file.

One `stat` at most every `recheck_seconds`; the file is to be read again only when its inode, device,
size or mtime changed. A Kubernetes Secret volume swaps a symlink when the Secret changes, which
changes the inode. Synchronous on purpose: a stat a second, and a read of a few hundred bytes when it
changed.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable

Stamp = tuple[int, int, int, int]


def stamp_of(st: os.stat_result) -> Stamp:
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns


class Look(enum.Enum):
    SAME = "same"  # not looked at (too soon), or looked at and unchanged
    CHANGED = "changed"  # read it again
    GONE = "gone"  # cannot be stat'ed (the error is in `WatchedFile.error`)


class WatchedFile:
    def __init__(self, path: str, recheck_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.recheck_seconds, self._clock = path, recheck_seconds, clock
        self.seen: Stamp | None = None  # the version last read, or tried (None: none yet, or gone)
        self.error: OSError | None = None  # why the last look found it gone
        self._gone = False
        self._stat: Stamp | None = None  # what the last look found
        self._checked_at = -float("inf")

    def look(self) -> Look:
        """Whether the file changed since `seen`: at most one stat every `recheck_seconds`. A file found
        gone is GONE once, then SAME until it is back (CHANGED)."""
        now = self._clock()
        if now - self._checked_at < self.recheck_seconds:
            return Look.SAME
        self._checked_at = now
        try:
            self._stat = stamp_of(os.stat(self.path))
        except OSError as e:
            self.error, self.seen = e, None
            if self._gone:
                return Look.SAME
            self._gone = True
            return Look.GONE
        self._gone = False
        return Look.SAME if self._stat == self.seen else Look.CHANGED

    def read(self) -> str:
        """The file's text, this version of it remembered as `seen` whatever comes of it: a file that
        cannot be read or parsed is tried again only once it changes. Raises OSError or UnicodeDecodeError."""
        stamp = self._stat
        try:
            with open(self.path, encoding="utf-8") as f:
                stamp = stamp_of(os.fstat(f.fileno()))
                return f.read()
        finally:
            self.seen, self._gone = stamp, False
