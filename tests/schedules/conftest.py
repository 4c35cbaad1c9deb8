"""Fixtures for the schedule tests: the app over a real database and an HTTP client."""

from tests.support.api import app, client, metrics, server_url, settings, toolbox  # noqa: F401  (fixtures)
from tests.support.cli import restore_logging  # noqa: F401  (a fixture)
