"""The runtime's own errors (a lost lease and a cancel request are in `core.errors`: other layers catch them)."""

from __future__ import annotations

__all__ = ["DuplicateWorker"]


class DuplicateWorker(RuntimeError):
    """Another live session holds this worker id's liveness lock: two workers share one --id."""
