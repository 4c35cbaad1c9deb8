"""Fixtures for the agent tests: the app over a real database, an HTTP client, and a real uvicorn server."""

from tests.support.api import app, client, metrics, server_url, settings, toolbox  # noqa: F401  (fixtures)
from tests.support.cli import restore_logging  # noqa: F401  (a fixture)
