"""Fixtures for the tenants' tests: the API's app over a real database, its HTTP client and a real server."""

from tests.support.api import app, client, metrics, server_url, settings, toolbox  # noqa: F401  (fixtures)
from tests.support.cli import restore_logging  # noqa: F401  (a fixture)
