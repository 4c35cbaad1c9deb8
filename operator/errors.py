"""The operator's errors: a refused or failed Kubernetes call, a database not ready yet, a spec it cannot run."""

from __future__ import annotations

__all__ = ["DatabaseNotReady", "InvalidSpec", "KubeError"]


class KubeError(Exception):
    """The API server refused a call (`status`) or could not be reached (status None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        """Worth retrying: unreachable, overloaded or failing, rather than a refusal."""
        return self.status is None or self.status == 429 or self.status >= 500


class DatabaseNotReady(Exception):
    """Not connected to a migrated database yet (the operator keeps trying in the background)."""


class InvalidSpec(ValueError):
    """The spec passed the schema (or there was none) but the runtime cannot run it."""
