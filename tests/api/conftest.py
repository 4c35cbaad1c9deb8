"""Fixtures for the API tests: the app over a real database, an HTTP client, and a real uvicorn server."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.support.api import app, client, metrics, server_url, settings, toolbox  # noqa: F401  (fixtures)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`agentrun` commands set up logging on the root logger; put it back as pytest had it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
