"""The runtime's own errors (a lost lease and a cancel request are in `core.errors`: other layers catch them)."""

from __future__ import annotations

__all__ = ["DuplicateWorker", "SecretsFileError", "WebhookRefused"]


class DuplicateWorker(RuntimeError):
    """Another live session holds this worker id's liveness lock: two workers share one --id."""


class SecretsFileError(ValueError):
    """The webhook secrets file (AGENTRUN_WEBHOOK_SECRETS) cannot be used: the message says why."""


class WebhookRefused(Exception):
    """The URL policy refuses a webhook's target after resolution: a failed attempt, retried like any other
    (the name may resolve elsewhere later), with the reason as its error."""
