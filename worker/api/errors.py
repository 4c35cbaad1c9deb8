"""The API's errors: an answer other than success raised by a route, and a tokens file that cannot be read.

Only the classes, importing no web framework and nothing else of the API (every module of it may import
this one): the CLI's `tokens` commands catch `IdentityFileError` without loading FastAPI. How an error
becomes an answer is in `api/answers.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["ApiError", "IdentityFileError", "Problem"]


class Problem(Protocol):
    """What is wrong with one field: `schemas.FieldProblem` is one, as the answer shows it."""

    @property
    def field(self) -> str: ...

    @property
    def problem(self) -> str: ...


class ApiError(Exception):
    """An answer other than success, raised by a route."""

    def __init__(self, status: int, message: str, fields: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = list(fields)


class IdentityFileError(ValueError):
    """The tokens file is missing, unreadable or malformed; the message says where."""
