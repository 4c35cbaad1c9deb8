"""The command line's errors: what `agentrun runs …` prints when the server refuses or cannot be reached.

Not the API's `ApiError` (worker/api/errors.py), which a route raises to answer with: this one is what the
client makes of such an answer, or of no answer at all.
"""

from __future__ import annotations

__all__ = ["ClientError"]


class ClientError(Exception):
    """The server refused a request (its message), or no answer came: the request could not be sent, or
    the server could not be reached (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{message} (HTTP {status})" if status else message)
        self.status = status
        self.message = message
